"""models.verify against a ``block_count`` the file's tensors do not have: a count llama.cpp cannot read skips the
per-layer tensor check, and a wrong but readable one gives one finding per tensor kind, not one per block, so
the verdict, the cache entry and the JSON stay small whatever the header claims."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import write_mini_vocab
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.models import verify
from llamaforge.models.verify import verify_model

pytestmark = pytest.mark.quick

# the findings and the missing tensors of any of these files fit in a few KB
_SMALL = 8 << 10
# the whole cache entry: the model facts list the attention layers of the first 4096 blocks (models.inspect)
_CACHE_LIMIT = 64 << 10


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mini_vocab(tmp_path_factory.mktemp("vocab") / "vocab.gguf")


def _with_block_count(vocab: Path, path: Path, block_count: int, arch: str = "qwen3") -> Path:
    """A tiny 4-layer model whose ``<arch>.block_count`` (uint32) is patched to ``block_count``."""
    write_tiny_model(path, TinyModelSpec(arch=arch, n_layer=4), vocab)
    data = bytearray(path.read_bytes())
    key = f"{arch}.block_count".encode()
    field = struct.pack("<Q", len(key)) + key + struct.pack("<II", gguf.GGUFValueType.UINT32, 4)
    at = data.index(field) + len(field) - 4
    data[at : at + 4] = struct.pack("<I", block_count)
    path.write_bytes(data)
    return path


def _cache_bytes(home: Path) -> int:
    return sum(entry.stat().st_size for entry in (home / "verify-cache").glob("*.json"))


def _verdict_bytes(report: verify.VerifyReport) -> int:
    """JSON size of what the tensor check adds: the findings and the missing and unknown tensor lists."""
    data = report.to_json()
    return len(
        json.dumps([data["findings"], data["model"]["missing_tensors"], data["model"]["unknown_tensors"]])
    )


def test_unreadable_block_count_skips_the_blocks(tmp_path: Path, lf_home: Path) -> None:
    """qwen3.block_count = 2**60 with one tensor: it listed 720 899 missing tensors (minutes, a 118 MB cache
    entry); now the structure check's finding, one note that the blocks were skipped, the globals missing."""
    path = tmp_path / "huge.gguf"
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_uint64("qwen3.block_count", 2**60)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    started = time.monotonic()
    report = verify_model(path)
    assert time.monotonic() - started < 2
    assert not report.ok and report.checks()["structure"] == "fail"
    assert any(
        "qwen3.block_count is 1152921504606846976, not a count llama.cpp can read" in f.message
        for f in report.findings
        if f.check == "structure" and f.status == "fail"
    ), report.findings
    tensors = [f for f in report.findings if f.check == "tensors"]
    (skipped,) = [f for f in tensors if "skipped" in f.message]
    assert skipped.subject == "qwen3.block_count" and "not a count llama.cpp can read" in skipped.message
    assert not [f for f in tensors if f.subject.startswith("blk.")]
    assert report.model["missing_tensors"] == ["output_norm.weight"]
    assert _verdict_bytes(report) < _SMALL
    assert _cache_bytes(lf_home) < _CACHE_LIMIT
    assert verify_model(path).cached


def test_wrong_block_count_one_finding_per_tensor_kind(tmp_path: Path, vocab: Path, lf_home: Path) -> None:
    """block_count 5000 for a 4-layer file: each tensor kind of blocks 4..4999 is one finding with the range."""
    path = _with_block_count(vocab, tmp_path / "wrong.gguf", 5000)
    report = verify_model(path)
    assert not report.ok and report.checks()["tensors"] == "fail"
    messages = {f.subject: f.message for f in report.findings if f.check == "tensors"}
    assert messages["blk.4..4999.attn_q.weight"] == "missing tensor blk.4..4999.attn_q.weight (4996 blocks)"
    missing = report.model["missing_tensors"]
    assert "blk.4..4999.ffn_down.weight" in missing and len(missing) == 11  # qwen3's per-layer tensors
    assert not any(name.startswith(("blk.0.", "blk.3.", "blk.5.")) for name in missing)
    assert _verdict_bytes(report) < _SMALL
    assert _cache_bytes(lf_home) < _CACHE_LIMIT


def test_readable_block_count_past_what_is_checked(tmp_path: Path, vocab: Path, lf_home: Path) -> None:
    """A count llama.cpp can read but no file holds (2**31 - 1): compact findings, and a note for the blocks
    not checked."""
    path = _with_block_count(vocab, tmp_path / "big.gguf", 2**31 - 1)
    started = time.monotonic()
    report = verify_model(path)
    assert time.monotonic() - started < 2
    assert not report.ok
    tensors = [f for f in report.findings if f.check == "tensors"]
    assert any(f.status == "warn" and "skipped" in f.message for f in tensors), tensors
    assert any(f.message.startswith("missing tensor blk.4..65535.attn_q.weight") for f in tensors), tensors
    assert _verdict_bytes(report) < _SMALL
    assert _cache_bytes(lf_home) < _CACHE_LIMIT


def test_hybrid_missing_blocks_listed_as_runs(tmp_path: Path, vocab: Path, lf_home: Path) -> None:
    """The tiny qwen35 has attention in every 2nd layer: a tensor of one layer kind is missing from every other
    block, one finding naming the first of them and how many more."""
    path = _with_block_count(vocab, tmp_path / "hybrid.gguf", 1000, arch="qwen35")
    report = verify_model(path)
    assert not report.ok
    messages = {f.subject: f.message for f in report.findings if f.check == "tensors"}
    assert messages["blk.*.attn_q.weight"] == (
        "missing tensor blk.*.attn_q.weight in 498 blocks of 5..999: 5, 7, 9, 11, 13, 15, 17, 19 and 490 more"
    )
    assert messages["blk.*.ssm_a"].startswith("missing tensor blk.*.ssm_a in 498 blocks of 4..998: 4, 6, ")
    assert messages["blk.4..999.ffn_up.weight"] == "missing tensor blk.4..999.ffn_up.weight (996 blocks)"
    assert _verdict_bytes(report) < _SMALL


def test_a_few_missing_blocks_still_named_one_by_one(tmp_path: Path, vocab: Path, lf_home: Path) -> None:
    """Up to four blocks missing a tensor keep one finding each, by the tensor's own name."""
    path = _with_block_count(vocab, tmp_path / "six.gguf", 6)
    report = verify_model(path)
    missing = report.model["missing_tensors"]
    assert missing[:2] == ["blk.4.attn_norm.weight", "blk.4.ffn_norm.weight"]
    assert "blk.5.attn_q.weight" in missing and len(missing) == 22
    assert "missing tensor blk.5.ffn_up.weight" in {f.message for f in report.findings}
