"""models.verify's tensor-shape check: tensors whose dimensions disagree with the header's hyper-parameters are
named without a build, and llama.cpp itself (the load check) refuses the same files and loads the clean ones."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from helpers import write_mini_vocab
from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.gguf.tiny import model as tinymodels
from llamaforge.models.inspect import layer_kinds
from llamaforge.models.tensor_shapes import check_tensor_shapes
from llamaforge.models.verify import verify_model

_GGUF_UINT32 = 4

# (arch, metadata key, damaged value, the tensors llama.cpp then sizes differently: all in the blocks with them,
# the first of which is named, the others counted)
DAMAGE = [
    ("qwen3", "attention.head_count_kv", 4, "attn_k attn_v"),
    ("qwen2", "attention.head_count_kv", 1, "attn_k attn_v"),
    ("gemma2", "feed_forward_length", 96, "ffn_gate ffn_up ffn_down"),
    ("gemma3", "attention.key_length", 8, "attn_q attn_k attn_output attn_q_norm attn_k_norm"),
    ("qwen35moe", "expert_feed_forward_length", 16, "ffn_gate_exps ffn_up_exps ffn_down_exps"),
    ("qwen35", "attention.head_count", 2, "attn_q attn_output"),  # attention blocks 1 and 3 only
    ("qwen3moe", "expert_count", 8, "ffn_gate_inp ffn_gate_exps ffn_up_exps ffn_down_exps"),
    ("qwen3next", "expert_shared_feed_forward_length", 16, "ffn_gate_shexp ffn_up_shexp ffn_down_shexp"),
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mini_vocab(tmp_path_factory.mktemp("vocab") / "vocab.gguf")


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory: pytest.TempPathFactory, vocab: Path) -> dict[str, Path]:
    """Every architecture with heads wider than embedding_length / head_count (key_length decides)."""
    out = tmp_path_factory.mktemp("wide")
    return {
        arch: write_tiny_model(
            out / f"{arch}.gguf", TinyModelSpec(arch=arch, n_layer=4, head_dim=32), vocab
        ).path
        for arch in tinymodels.SUPPORTED_ARCHS
        if arch != "qwen2"  # its Q is n_embd wide whatever the heads
    }


def set_uint32(path: Path, key: str, value: int) -> None:
    """Rewrite the uint32 metadata value of ``key`` in place: the tensors stay as they were."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == _GGUF_UINT32, f"{key} is no uint32"
    struct.pack_into("<I", data, at + 4, value)
    path.write_bytes(bytes(data))


def damaged(vocab: Path, directory: Path, arch: str, key: str, value: int) -> Path:
    path = write_tiny_model(directory / f"{arch}-{key}.gguf", TinyModelSpec(arch=arch, n_layer=4), vocab).path
    set_uint32(path, f"{arch}.{key}", value)
    return path


@pytest.mark.parametrize("arch", [arch for arch in tinymodels.SUPPORTED_ARCHS if arch != "qwen2"])
def test_wide_heads_have_no_shape_findings(arch: str, wide_heads: dict[str, Path]) -> None:
    header = read_header(wide_heads[arch])
    assert check_tensor_shapes(header, layer_kinds(header)) == []


@pytest.mark.parametrize(("arch", "key", "value", "tensors"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_hyper_parameters_name_the_tensors(
    arch: str, key: str, value: int, tensors: str, vocab: Path, tmp_path: Path, lf_home: Path
) -> None:
    path = damaged(vocab, tmp_path, arch, key, value)
    report = verify_model(path)
    assert not report.ok and report.checks()["tensors"] == "fail"
    shapes = {f.subject: f for f in report.findings if "llama.cpp expects" in f.message}
    kinds = layer_kinds(read_header(path))
    for tensor in tensors.split():
        blocks = [
            block for block, kind in enumerate(kinds) if kind == "attention" or not tensor.startswith("attn_")
        ]
        finding = shapes.pop(f"blk.{blocks[0]}.{tensor}.weight")
        assert finding.check == "tensors" and finding.status == "fail"
        assert f"(and the same in {len(blocks) - 1} more block" in finding.message, finding.message
        assert "wrong shape" in finding.message
    assert not shapes, "findings beyond the damaged tensors"


def test_message_names_the_keys(vocab: Path, tmp_path: Path) -> None:
    header = read_header(damaged(vocab, tmp_path, "qwen3", "attention.head_count_kv", 4))
    by_subject = {f.subject: f.message for f in check_tensor_shapes(header, layer_kinds(header))}
    assert by_subject["blk.0.attn_k.weight"].startswith(
        "blk.0.attn_k.weight is 64 x 32 (and the same in 3 more blocks), but llama.cpp expects 64 x 64 "
        "(embedding_length x head_count_kv*value_length, from qwen3.* metadata)"
    )


def test_output_width_is_checked(vocab: Path, tmp_path: Path, lf_home: Path) -> None:
    """token_embd and output are sized by embedding_length: a damaged width names both."""
    path = damaged(vocab, tmp_path, "qwen3", "embedding_length", 32)
    report = verify_model(path)
    subjects = {f.subject for f in report.findings if f.status == "fail"}
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_norm.weight"} <= subjects


def test_unmodelled_architectures_are_left_to_the_load_check(tmp_path: Path) -> None:
    """No rules for llama here: a tensor llama.cpp would refuse is the load check's to name, not a guess's."""
    import gguf

    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((3, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    assert check_tensor_shapes(header, layer_kinds(header)) == []


# ---------------------------------------------------------------------------------------- llama.cpp agrees


@pytest.mark.docker
@pytest.mark.llamacpp
def test_llama_cpp_refuses_what_the_check_names_and_loads_the_rest(
    stock_build: Path, vocab: Path, wide_heads: dict[str, Path], tmp_path: Path, lf_home: Path
) -> None:
    """The oracle: llama.cpp's loader refuses each damaged file on a tensor the shape check named, and loads
    every clean one (wide heads included), so the check neither misses nor invents a refusal."""
    for arch, key, value, _ in DAMAGE:
        report = verify_model(damaged(vocab, tmp_path, arch, key, value), load_check_build=stock_build)
        load = report.load_check
        assert load is not None and not load["loaded"], (arch, key, load)
        assert "wrong shape" in load["cause"], load
        named = load["cause"].split("tensor '", 1)[1].split("'", 1)[0]
        shapes = [f for f in report.findings if "llama.cpp expects" in f.message]
        assert named in {f.subject for f in shapes}, (named, shapes)  # the same block and tensor
    qwen2 = write_tiny_model(tmp_path / "qwen2.gguf", TinyModelSpec(arch="qwen2", n_layer=4), vocab).path
    for arch, path in {**wide_heads, "qwen2": qwen2}.items():
        report = verify_model(path, load_check_build=stock_build)
        assert report.ok, (arch, report.findings)
