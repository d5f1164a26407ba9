"""models.verify: the hardened header parser, the checks, the cache, the template audit, a fuzz sample and a
real load with llama.cpp (integration tier).

Tiny real models come from ``llamaforge.gguf.tiny`` with a 300-token tokenizer written here, so the unit
tests run in seconds; corruptions are byte patches at offsets found by walking the valid file.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from conftest import require
from helpers import write_mini_vocab
from llamaforge.core.errors import LlamaforgeError, ModelError, OperationFailed
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf import header as gguf_header
from llamaforge.gguf.header import ArraySummary, GGUFFormatError, HeaderLimits, read_header
from llamaforge.gguf.sources import BytesSource
from llamaforge.gguf.tiny import TensorPlanEntry, TinyModelSpec, write_tiny_model
from llamaforge.gguf.tiny import model as tinymodels
from llamaforge.models import verify
from llamaforge.models.chat_template import audit_chat_template
from llamaforge.models.recipes import ModelExpectations, ModelRecipe
from llamaforge.models.tensor_set import check_tensor_set
from llamaforge.models.verify import verify_model
from llamaforge.serve.loadlog import CacheSize, parse_load_log

pytestmark = pytest.mark.quick

VOCAB = 300
QWEN_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role == 'system' %}<|im_start|>system\n{{ message.content }}"
    "<|im_end|>\n{%- else %}<|im_start|>{{ message['role'] }}\n{{ message.content | trim }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}{%- set ns = namespace(last=0) %}{%- if add_generation_prompt %}"
    "<|im_start|>assistant\n{%- endif %}{{ '<x{}>'.format(1) }}{{ tools | tojson if tools else '' }}"
)


def write_vocab(path: Path, template: str = QWEN_TEMPLATE, n_tokens: int = VOCAB) -> Path:
    """A tokenizer-only GGUF shaped like llama.cpp's ggml-vocab-*.gguf."""
    return write_mini_vocab(path, n_tokens, template)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, vocab: Path) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("models")
    return {
        arch: write_tiny_model(out / f"{arch}.gguf", TinyModelSpec(arch=arch, n_layer=4), vocab).path
        for arch in tinymodels.SUPPORTED_ARCHS
    }


@pytest.fixture
def model(models: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the tiny qwen3 model, free to corrupt."""
    copy = tmp_path / "model.gguf"
    copy.write_bytes(models["qwen3"].read_bytes())
    return copy


# ------------------------------------------------------------------------------- offsets in a valid file


def fields(data: bytes) -> Iterator[tuple[str, int, int]]:
    """``(kind, offset, size)`` of every count, length, type and offset field of a valid GGUF."""
    pos = 24
    yield "tensor_count", 8, 8
    yield "kv_count", 16, 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(kind: str) -> Iterator[tuple[str, int, int]]:
        nonlocal pos
        yield kind, pos, 8
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    for _ in range(n_kv):
        yield from string("key_length")
        yield "value_type", pos, 4
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if vtype == 9:
            yield "array_type", pos, 4
            yield "array_length", pos + 4, 8
            item, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(count):
                if item == 8:
                    yield from string("string_length")
                else:
                    pos += sizes[item]
        elif vtype == 8:
            yield from string("string_length")
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        yield from string("tensor_name_length")
        yield "n_dims", pos, 4
        n_dims = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(n_dims):
            yield "dim", pos, 8
            pos += 8
        yield "ggml_type", pos, 4
        yield "tensor_offset", pos + 4, 8
        pos += 12


def tensor_fields(data: bytes, name: str) -> dict[str, int]:
    """Offsets of one tensor info's n_dims, type and offset fields."""
    at = data.index(struct.pack("<Q", len(name)) + name.encode())
    n_dims_at = at + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, n_dims_at)[0]
    type_at = n_dims_at + 4 + 8 * n_dims
    return {"n_dims": n_dims_at, "dims": n_dims_at + 4, "type": type_at, "offset": type_at + 4}


def patch(path: Path, offset: int, raw: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset : offset + len(raw)] = raw
    path.write_bytes(bytes(data))


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


# ----------------------------------------------------------------------------------------- clean files


@pytest.mark.parametrize("arch", tinymodels.SUPPORTED_ARCHS)
def test_tiny_models_verify_clean(arch: str, models: dict[str, Path], lf_home: Path) -> None:
    report = verify_model(models[arch])
    data = report.to_json()
    assert data["ok"] and data["exit_code"] == 0, data["findings"]
    assert data["findings"] == []
    assert data["checks"] == {
        "header": "ok",
        "sha256": "ok",
        "structure": "ok",
        "tensors": "ok",
        "expectations": "skipped",
        "template": "ok",
        "load": "skipped",
    }
    import hashlib

    assert data["sha256"] == hashlib.sha256(models[arch].read_bytes()).hexdigest()
    model = data["model"]
    assert model["architecture"] == arch
    assert model["missing_tensors"] == model["unknown_tensors"] == []
    assert model["dominant_type"] == "F16" and model["file_type"] == "F16"
    assert set(model["quant_histogram"]) == {"F16", "F32"}
    reader = gguf.GGUFReader(models[arch])  # the file is known good: safe for the stock reader
    assert sum(e["count"] for e in model["quant_histogram"].values()) == len(reader.tensors)
    assert sum(e["bytes"] for e in model["quant_histogram"].values()) == sum(
        int(t.n_bytes) for t in reader.tensors
    )
    assert model["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    hybrid = arch.startswith("qwen35") or arch == "qwen3next"
    assert model["layers"]["recurrent"] == (2 if hybrid else 0)
    json.dumps(data)  # JSON-able


def test_header_matches_stock_reader(models: dict[str, Path]) -> None:
    for path in models.values():
        header = read_header(path)
        reader = gguf.GGUFReader(path)
        assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
        for mine, theirs in zip(header.tensors, reader.tensors, strict=True):
            assert mine.shape == tuple(int(x) for x in theirs.shape)
            assert header.data_offset + mine.offset == int(theirs.data_offset)
            assert mine.nbytes == int(theirs.n_bytes) and mine.ggml_type.id == int(theirs.tensor_type)
        assert list(header.metadata) == [k for k in reader.fields if not k.startswith("GGUF.")]
        assert header.metadata["tokenizer.ggml.tokens"][:2] == ["tok0", "tok1"]
        assert header.packed


def test_huge_arrays_are_summarised(tmp_path: Path) -> None:
    path = write_vocab(tmp_path / "big-vocab.gguf", n_tokens=5000)
    header = read_header(path)
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArraySummary) and tokens.count == len(tokens) == 5000
    assert tokens.item_type == "string" and tokens.head[:2] == ("tok0", "tok1")
    assert isinstance(header.metadata["tokenizer.ggml.token_type"], ArraySummary)
    kept = read_header(path, limits=HeaderLimits(keep_array_items=10_000))
    assert kept.metadata["tokenizer.ggml.tokens"][-1] == "tok4999"
    exact = read_header(path, exact=True)  # the rewriting mode keeps every item, as raw bytes
    assert exact.metadata["tokenizer.ggml.tokens"] == tuple(f"tok{i}".encode() for i in range(5000))
    assert exact.value_types["tokenizer.ggml.tokens"] == "array[string]"


# --------------------------------------------------------------------------------------- corruptions


def expect_format_error(path: Path, field: str, message: str) -> GGUFFormatError:
    started = time.monotonic()
    with pytest.raises(GGUFFormatError, match=message) as caught:
        verify_model(path, use_cache=False)
    assert time.monotonic() - started < 2.0
    assert field in caught.value.field, caught.value.field
    assert isinstance(caught.value, ModelError) and caught.value.exit_code == 9
    assert f"at byte {caught.value.offset}" in caught.value.message
    return caught.value


def test_truncated_file(model: Path) -> None:
    data = model.read_bytes()
    header_end = read_header(model).header_end
    for cut in (10, 30, header_end // 2, header_end - 1):
        model.write_bytes(data[:cut])
        expect_format_error(model, "", "file ends after|past the end of the file")
    model.write_bytes(data[: header_end + 100])  # header intact, tensor data cut off
    error = expect_format_error(model, "offset", "runs past the end of the file")
    assert "tensor" in error.field


def test_bad_magic_version_and_endianness(model: Path) -> None:
    patch(model, 0, b"GGML")
    assert expect_format_error(model, "magic", "bad magic").offset == 0
    patch(model, 0, b"GGUF" + struct.pack("<I", 1))
    expect_format_error(model, "version", "unsupported GGUF version 1")
    patch(model, 4, struct.pack(">I", 3))
    expect_format_error(model, "version", "big-endian")


def test_array_length_near_2_63_fails_fast(model: Path) -> None:
    """gguf 0.19.0's GGUFReader hangs on this file; the pre-parser must refuse it at once."""
    data = model.read_bytes()
    arrays = [offset for kind, offset, _ in fields(data) if kind == "array_length"]
    assert len(arrays) == 3  # tokens (strings), token types (int32), merges (strings)
    for at in arrays:
        for value in ((1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 62) + 7):
            model.write_bytes(data)
            patch(model, at, u64(value))
            error = expect_format_error(model, "array length", "length")
            assert error.offset == at
    # token types as uint8 items, 2^63-1 of them: GGUFReader walks to EOF and then spins forever
    model.write_bytes(data)
    patch(model, arrays[1] - 4, struct.pack("<I", 0) + u64((1 << 63) - 1))
    assert (
        expect_format_error(model, "tokenizer.ggml.token_type (array length)", "exceeds the limit").offset
        == arrays[1]
    )


def test_counts_and_string_lengths_bounded(model: Path) -> None:
    data = model.read_bytes()
    for kind, offset, _size in fields(data):
        if kind in ("tensor_count", "kv_count"):
            model.write_bytes(data)
            patch(model, offset, u64((1 << 63) + 5))
            expect_format_error(model, kind.replace("_", " "), "exceeds the limit")
    at = next(offset for kind, offset, _ in fields(data) if kind == "string_length")
    model.write_bytes(data)
    patch(model, at, u64(len(data)))
    expect_format_error(model, "string length", "runs past the end of the file")


def test_tensor_offset_beyond_eof(model: Path) -> None:
    data = model.read_bytes()
    where = tensor_fields(data, "output_norm.weight")
    patch(model, where["offset"], u64(len(data) // 32 * 32 + 4096))
    expect_format_error(model, "offset", "runs past the end of the file")


def test_overlapping_tensors(model: Path) -> None:
    data = model.read_bytes()
    header = read_header(model)
    first, second = header.tensors[0], header.tensors[1]
    patch(model, tensor_fields(data, second.name)["offset"], u64(first.offset))
    error = expect_format_error(model, second.name, "overlaps")
    assert first.name in error.message
    assert error.offset == tensor_fields(data, second.name)["offset"]


def test_misaligned_offset(model: Path) -> None:
    data = model.read_bytes()
    tensor = read_header(model).tensors[3]
    patch(model, tensor_fields(data, tensor.name)["offset"], u64(tensor.offset + 8))
    expect_format_error(model, "offset", "not a multiple of the alignment 32")


def test_duplicate_key_and_tensor_name(model: Path) -> None:
    data = model.read_bytes()
    keys = list(read_header(model).metadata)
    first, second = next((a, b) for i, a in enumerate(keys) for b in keys[i + 1 :] if len(a) == len(b))
    patch(model, data.index(u64(len(second)) + second.encode()) + 8, first.encode())
    expect_format_error(model, "key", f"duplicate key {first!r}")
    model.write_bytes(data)
    patch(model, data.index(b"blk.1.attn_q.weight"), b"blk.0.attn_q.weight")
    expect_format_error(model, "name", "duplicate tensor name 'blk.0.attn_q.weight'")


def test_bad_types_dims_and_names(model: Path) -> None:
    data = model.read_bytes()
    value_type = next(offset for kind, offset, _ in fields(data) if kind == "value_type")
    cases: list[tuple[int, bytes, str, str]] = [
        (value_type, struct.pack("<I", 13), "value type", "unknown value type 13"),
        (
            next(o for k, o, _ in fields(data) if k == "array_type"),
            struct.pack("<I", 9),
            "array item type",
            "nested arrays",
        ),
        (
            tensor_fields(data, "token_embd.weight")["type"],
            struct.pack("<I", 4),
            "ggml type",
            "unknown ggml type 4",
        ),
        (tensor_fields(data, "token_embd.weight")["n_dims"], struct.pack("<I", 5), "n_dims", "5 dimensions"),
        (tensor_fields(data, "token_embd.weight")["dims"], u64(1 << 63), "ne[0]", "negative"),
        (tensor_fields(data, "token_embd.weight")["dims"] + 8, u64(1 << 62), "shape", "more than 2"),
        (tensor_fields(data, "token_embd.weight")["type"], struct.pack("<I", 12), "shape", "block size 256"),
    ]
    for offset, raw, field, message in cases:
        model.write_bytes(data)
        patch(model, offset, raw)
        expect_format_error(model, field, message)


def test_alignment_key_checked(tmp_path: Path) -> None:
    for value, vtype, message in (
        (48, gguf.GGUFValueType.UINT32, "not a power of 2"),
        (32, gguf.GGUFValueType.UINT64, "must be uint32"),
    ):
        path = tmp_path / f"align-{value}-{vtype.name}.gguf"
        writer = gguf.GGUFWriter(path, "qwen3")
        writer.add_key_value("general.alignment", value, vtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        expect_format_error(path, "general.alignment", message)


def test_reader_abstraction_and_short_reads() -> None:
    with pytest.raises(GGUFFormatError, match="file ends"):
        read_header(BytesSource(b"GGUF\x03\x00\x00\x00", name="mem"))
    with pytest.raises(GGUFFormatError, match="mem: file ends after 0 bytes"):
        read_header(BytesSource(b"", name="mem"))
    with pytest.raises(GGUFFormatError, match="mem: not a GGUF"):
        read_header(BytesSource(b"GGML" + bytes(40), name="mem"))
    with pytest.raises(ModelError, match="cannot open"):
        read_header("/nonexistent/model.gguf")


def test_not_a_file(tmp_path: Path, lf_home: Path) -> None:
    with pytest.raises(ModelError, match="not a regular file"):
        verify_model(tmp_path)
    with pytest.raises(ModelError, match="does not exist"):
        verify_model(tmp_path / "missing.gguf")
    op = operations()["models.verify"]
    with pytest.raises(ModelError, match="does not exist"):
        op.run(op.params.model_validate({"target": str(tmp_path / "missing.gguf")}), OperationContext())


def test_cancel_before_hashing(model: Path, lf_home: Path) -> None:
    from llamaforge.core.errors import Cancelled
    from llamaforge.core.events import CancelToken

    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(Cancelled):
        verify_model(model, cancel=cancel)
    assert not list((lf_home / "verify-cache").glob("*.json"))


# -------------------------------------------------------------------------------------- tensor set


def write_variant(
    path: Path,
    vocab: Path,
    monkeypatch: pytest.MonkeyPatch,
    arch: str = "qwen3",
    drop: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Path:
    """A tiny model without the tensors ``drop`` and with extra ``[4, 64]`` tensors named ``extra``."""
    original = tinymodels.tensor_plan

    def plan(spec: TinyModelSpec, n_vocab: int) -> list[TensorPlanEntry]:
        entries = [e for e in original(spec, n_vocab) if e.canonical not in drop]
        entries += [
            TensorPlanEntry(name, name, gguf.MODEL_TENSOR.ATTN_Q, (4, 64), np.dtype(np.float16))
            for name in extra
        ]
        return entries

    with monkeypatch.context() as patched:
        patched.setattr(tinymodels, "tensor_plan", plan)
        return write_tiny_model(path, TinyModelSpec(arch=arch, n_layer=4), vocab).path


def test_unknown_and_missing_tensors_named(
    tmp_path: Path, vocab: Path, monkeypatch: pytest.MonkeyPatch, lf_home: Path
) -> None:
    path = write_variant(
        tmp_path / "odd.gguf",
        vocab,
        monkeypatch,
        drop=("blk.1.ffn_up.weight",),
        extra=("blk.0.bogus.weight", "blk.9.attn_q.weight"),
    )
    report = verify_model(path).to_json()
    assert not report["ok"] and report["exit_code"] == 9 and report["checks"]["tensors"] == "fail"
    assert report["model"]["unknown_tensors"] == ["blk.0.bogus.weight", "blk.9.attn_q.weight"]
    assert report["model"]["missing_tensors"] == ["blk.1.ffn_up.weight"]
    messages = {f["subject"]: f["message"] for f in report["findings"]}
    assert messages["blk.0.bogus.weight"] == "unknown tensor blk.0.bogus.weight for qwen3"
    assert messages["blk.1.ffn_up.weight"] == "missing tensor blk.1.ffn_up.weight"


@pytest.mark.parametrize("arch", ["qwen3", "qwen35moe"])
def test_optional_tensors_not_missing(
    arch: str, tmp_path: Path, vocab: Path, monkeypatch: pytest.MonkeyPatch, lf_home: Path
) -> None:
    """Tied embeddings (no output.weight) and no rope_freqs are fine; a hybrid's recurrent layers need no
    attn_q and its attention layers no ssm_*."""
    path = write_variant(tmp_path / "tied.gguf", vocab, monkeypatch, arch=arch, drop=("output.weight",))
    report = verify_model(path)
    assert report.ok, report.findings
    assert "output.weight" not in report.model["missing_tensors"]


def test_hybrid_layer_rules(
    tmp_path: Path, vocab: Path, monkeypatch: pytest.MonkeyPatch, lf_home: Path
) -> None:
    path = write_variant(
        tmp_path / "h.gguf",
        vocab,
        monkeypatch,
        arch="qwen35",
        drop=("blk.0.ssm_a", "blk.1.attn_k.weight", "blk.2.ssm_conv1d.weight"),
    )
    report = verify_model(path)
    assert report.model["layers"]["attention_layers"] == [1, 3]
    assert report.model["missing_tensors"] == [
        "blk.0.ssm_a",
        "blk.1.attn_k.weight",
        "blk.2.ssm_conv1d.weight",
    ]


# ------------------------------------------------------------------------------ recipes and sha256


def recipe_for(path: Path, **kwargs: Any) -> ModelRecipe:
    expect = kwargs.pop("expect", {})
    return ModelRecipe(name="tiny", source=path.as_uri(), expect=ModelExpectations(**expect), **kwargs)


def test_recipe_expectations_met(models: dict[str, Path], lf_home: Path) -> None:
    import hashlib

    path = models["qwen3moe"]
    recipe = recipe_for(
        path,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        size=path.stat().st_size,
        expect={
            "architecture": "qwen3moe",
            "min_context_length": 4096,
            "file_type": "F16",
            "block_count": 4,
            "expert_count": 4,
            "expert_used_count": 2,
            "chat_template": True,
        },
    )
    report = verify_model(path, recipe)
    assert report.ok and report.checks()["expectations"] == "ok" and report.recipe == "tiny"


def test_recipe_mismatches_named(models: dict[str, Path], lf_home: Path) -> None:
    path = models["qwen3"]
    recipe = recipe_for(
        path,
        sha256="0" * 64,
        size=123,
        expect={
            "architecture": "qwen3moe",
            "min_context_length": 32768,
            "file_type": "UD-Q4_K_M",
            "block_count": 28,
            "expert_count": 128,
        },
    )
    report = verify_model(path, recipe).to_json()
    assert not report["ok"] and report["exit_code"] == 9
    failed = {f["subject"]: f["message"] for f in report["findings"] if f["status"] == "fail"}
    assert set(failed) == {
        "sha256",
        "size",
        "architecture",
        "context_length",
        "file_type",
        "block_count",
        "expert_count",
    }
    assert failed["block_count"] == "block_count is 4, the recipe expects 28"
    assert failed["file_type"] == "file_type is F16, the recipe expects UD-Q4_K_M"
    assert failed["architecture"] == "architecture is 'qwen3', the recipe expects 'qwen3moe'"
    assert failed["sha256"].endswith(f"the recipe pins {'0' * 64}")
    assert report["checks"]["sha256"] == report["checks"]["expectations"] == "fail"


# ---------------------------------------------------------------------------------------------- cache


def test_cache_hit_does_not_rehash(model: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = verify_model(model)
    assert not first.cached
    assert list((lf_home / "verify-cache").glob("*.json"))

    def forbidden(*_args: object, **_kwargs: object) -> str:
        raise AssertionError("a cache hit must not hash or parse the file again")

    monkeypatch.setattr(verify, "hash_file", forbidden)
    monkeypatch.setattr(gguf_header, "read_header", forbidden)  # verify_model imports the reader when it runs
    second = verify_model(model)
    assert second.cached and second.sha256 == first.sha256 and second.model == first.model
    # the stored sha256 still meets a pinned recipe on a hit
    bad = verify_model(model, recipe_for(model, sha256="1" * 64))
    assert bad.cached and not bad.ok
    monkeypatch.undo()
    calls: list[Path] = []
    original = verify.hash_file

    def counting(path: Path, *args: Any) -> str:
        calls.append(path)
        return original(path, *args)

    monkeypatch.setattr(verify, "hash_file", counting)
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # same bytes, new mtime: miss
    assert not verify_model(model).cached and len(calls) == 1
    assert verify_model(model).cached and len(calls) == 1
    assert not verify_model(model, use_cache=False).cached and len(calls) == 2


def test_a_verdict_made_by_other_code_is_not_trusted(
    model: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version number stayed 0.1.0 while checks were added: the key holds the analysing code's digest."""
    verify_model(model)
    assert verify_model(model).cached
    original = verify.analysis_digest
    other = (*verify.ANALYSIS_MODULES, "llamaforge.core.paths")  # other code than the verdict was made by
    assert original(other) != original()
    monkeypatch.setattr(verify, "analysis_digest", lambda: original(other))
    assert not verify_model(model).cached
    assert verify_model(model).cached  # and the new verdict is kept under the new key
    assert len(list((lf_home / "verify-cache").glob("*.json"))) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: "{not json",
        lambda entry: "[1]",  # JSON, no object: it raised AttributeError
        lambda entry: json.dumps({**entry, "analysis": []}),
        lambda entry: json.dumps({**entry, "analysis": {**entry["analysis"], "findings": [{"check": 1}]}}),
        lambda entry: json.dumps({**entry, "analysis": {**entry["analysis"], "model": None}}),
    ],
    ids=["not-json", "a-list", "analysis-a-list", "a-finding-of-another-shape", "no-model"],
)
def test_corrupt_cache_entry_ignored(
    damage: Callable[[dict[str, Any]], str], model: Path, lf_home: Path
) -> None:
    first = verify_model(model)
    for entry in (lf_home / "verify-cache").glob("*.json"):
        entry.write_text(damage(json.loads(entry.read_text(encoding="utf-8"))), encoding="utf-8")
    again = verify_model(model)
    assert not again.cached and again.ok == first.ok and again.findings == first.findings
    assert verify_model(model).cached  # the damaged entry was written anew


# ------------------------------------------------------------------------------------ chat templates


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "'__globals__'"),
        ("{{ self._TemplateReference__context }}", "'self'"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "'__class__'"),
        ("{{ messages.__class__.mro() }}", "'mro'"),
        ("{{ ''|attr('__cla' ~ 'ss__') }}", "|attr"),
        ("{{ lipsum.__globals__['os'] }}", "'lipsum'"),
        ("{{ joiner.__init__ }}", "'joiner'"),
        ("{% set ns = namespace() %}{{ ns.__init__.__globals__ }}", "'__init__'"),
        ("{{ x['__builtins__'] }}", "'__builtins__'"),
        ("{{ '{0.__class__}'.format(messages) }}", ".format"),
        ("{{ config.items() }}", "'config'"),
        ("{% import 'os' as os %}", "import"),
        ("{% include 'secrets.txt' %}", "include"),
        ("{{ request.application }}", "'request'"),
    ],
)
def test_template_audit_flags(template: str, needle: str) -> None:
    parses, flags = audit_chat_template(template)
    assert parses and any(needle in flag for flag in flags), flags


def test_template_audit_accepts_real_templates() -> None:
    parses, flags = audit_chat_template(QWEN_TEMPLATE)
    assert parses and flags == []
    generation = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert audit_chat_template(generation) == (True, [])
    parses, flags = audit_chat_template("{% if x %}never closed")
    assert not parses and "does not parse" in flags[0]


def test_llama_cpp_templates_are_clean() -> None:
    """Every template llama.cpp b11312 ships (models/templates/*.jinja) passes the audit: no false alarms."""
    source = os.environ.get("LLAMAFORGE_TEST_SOURCE", "")
    templates = sorted(Path(source, "models", "templates").glob("*.jinja")) if source else []
    require(bool(templates), "set LLAMAFORGE_TEST_SOURCE to the llama.cpp b11312 tree (nox sets it)")
    for path in templates:
        assert audit_chat_template(path.read_text(encoding="utf-8")) == (True, []), path.name


def test_malicious_template_fails_verify(tmp_path: Path, lf_home: Path) -> None:
    evil = write_vocab(
        tmp_path / "evil-vocab.gguf", "{{ cycler.__init__.__globals__.os.popen('id').read() }}"
    )
    path = write_tiny_model(tmp_path / "evil.gguf", TinyModelSpec(), evil).path
    report = verify_model(path)
    assert not report.ok and report.checks()["template"] == "fail"
    subjects = {f.subject for f in report.findings if f.check == "template"}
    assert subjects == {"tokenizer.chat_template"}
    unparsable = write_vocab(tmp_path / "odd-vocab.gguf", "{% if %}")
    odd = verify_model(write_tiny_model(tmp_path / "odd.gguf", TinyModelSpec(), unparsable).path)
    assert odd.ok and odd.checks()["template"] == "warn"


# --------------------------------------------------------------------------------------------- fuzz


def _mutants(data: bytes, header_end: int, count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    targets = [f for f in fields(data) if f[0] != "string_length" or rng.random() < 0.05]
    huge = [(1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 62), 1 << 32, len(data), len(data) + 1, 0]
    for index in range(count):
        mutant = bytearray(data)
        strategy = index % 4
        if strategy == 0:  # bit flips in the header
            for _ in range(rng.randint(1, 8)):
                bit = rng.randrange(header_end * 8)
                mutant[bit // 8] ^= 1 << (bit % 8)
        elif strategy == 1:  # a length / count / offset field set to a huge or boundary value
            _kind, offset, size = rng.choice(targets)
            value = rng.choice(huge) % (1 << (8 * size))
            mutant[offset : offset + size] = value.to_bytes(size, "little")
        elif strategy == 2:  # truncation inside the header
            del mutant[rng.randrange(header_end) :]
        else:  # random type bytes
            _kind, offset, size = rng.choice([f for f in targets if f[0].endswith("type")])
            mutant[offset : offset + size] = rng.randrange(1 << 32).to_bytes(4, "little")
        yield f"case {index} strategy {strategy}", bytes(mutant)


class _Hang(Exception):
    pass


def test_fuzz_sample_only_typed_errors(models: dict[str, Path]) -> None:
    """300 mutated headers: each a typed error or a clean parse (then analysed), each well under 2 s."""
    data = models["qwen3moe"].read_bytes()
    header_end = read_header(models["qwen3moe"]).header_end

    def alarm(_signum: int, _frame: object) -> None:
        raise _Hang

    previous: Callable[..., Any] | int | None = signal.signal(signal.SIGALRM, alarm)
    outcomes = {"typed": 0, "parsed": 0}
    slowest = 0.0
    try:
        for name, mutant in _mutants(data, header_end, 300, seed=1234):
            started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            try:
                header = read_header(BytesSource(mutant, name=name))
                verify.analyse_header(header)
                outcomes["parsed"] += 1
            except LlamaforgeError:
                outcomes["typed"] += 1
            except _Hang:
                pytest.fail(f"{name}: no answer within 2 s")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            slowest = max(slowest, time.monotonic() - started)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert outcomes["typed"] > 150 and outcomes["typed"] + outcomes["parsed"] == 300
    assert slowest < 2.0


def test_fuzz_sample_both_modes_check_the_same(models: dict[str, Path]) -> None:
    """The byte-exact (rewriting) mode refuses exactly what the summarising mode refuses, at the same field."""
    data = models["qwen3moe"].read_bytes()
    header_end = read_header(models["qwen3moe"]).header_end

    def outcome(mutant: bytes, name: str, exact: bool) -> tuple[str, int] | tuple[int, int]:
        try:
            header = read_header(BytesSource(mutant, name=name), exact=exact)
        except GGUFFormatError as error:
            return error.field, error.offset
        return len(header.tensors), header.data_offset

    for name, mutant in _mutants(data, header_end, 300, seed=4321):
        assert outcome(mutant, name, exact=True) == outcome(mutant, name, exact=False), name


# ----------------------------------------------------------------------------------------- the fronts


def test_operation_through_registry(models: dict[str, Path], lf_home: Path, tmp_path: Path) -> None:
    op = operations()["models.verify"]
    assert op.read_only and op.positional == ("target",)
    result = result_json(
        op.run(op.params.model_validate({"target": str(models["qwen3"])}), OperationContext())
    )
    assert result["ok"] and result["exit_code"] == 0
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f'source = "{models["qwen3"].as_uri()}"\n[expect]\nblock_count = 3\n', encoding="utf-8")
    with pytest.raises(OperationFailed) as failed:  # a failing verdict raises, carrying the whole result
        op.run(op.params.model_validate({"target": str(recipe)}), OperationContext())
    assert failed.value.exit_code == 9 and "FAILED verification" in failed.value.message
    by_recipe = result_json(failed.value.result)
    assert not by_recipe["ok"] and by_recipe["exit_code"] == 9 and by_recipe["recipe"] == "tiny"
    with pytest.raises(OperationFailed) as against:
        op.run(
            op.params.model_validate({"target": str(models["qwen3"]), "recipe": str(recipe)}),
            OperationContext(),
        )
    assert result_json(against.value.result)["findings"] == by_recipe["findings"]


def test_cli_exit_codes(models: dict[str, Path], tmp_path: Path) -> None:
    from helpers import invoke

    env = {**os.environ, "LLAMAFORGE_HOME": str(tmp_path / "home")}
    good = invoke("models.verify", str(models["qwen3"]), "--json", env=env, timeout=120)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["ok"] is True
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(models["qwen3"].read_bytes()[:5000])
    bad = invoke("models.verify", str(broken), env=env, timeout=120)
    assert bad.returncode == 9 and bad.stdout == ""
    assert "past the end of the file" in bad.stderr and "at byte" in bad.stderr


def test_parse_load_log() -> None:
    log = """
llama_model_loader: loaded meta data with 27 key-value pairs and 27 tensors from m.gguf (version GGUF V3 (latest))
load_tensors:          CPU model buffer size =     0.00 MiB
llama_model_loader: loaded meta data with 27 key-value pairs and 27 tensors from m.gguf (version GGUF V3 (latest))
print_info: model params          = 113.02 K
load_tensors:   CPU_Mapped model buffer size =     0.22 MiB
llama_context:        CPU  output buffer size =     0.58 MiB
llama_kv_cache:        CPU KV buffer size =     0.06 MiB
llama_kv_cache: size =    0.06 MiB (   256 cells,   2 layers,  1/1 seqs), K (f16):    0.03 MiB, V (f16):    0.03 MiB
llama_memory_recurrent:        CPU RS buffer size =     0.01 MiB
llama_memory_recurrent: size =    0.01 MiB (     1 cells,   4 layers,  1 seqs  1 rs_seq), R (f32):    0.00 MiB
sched_reserve:        CPU compute buffer size =     0.51 MiB
"""
    parsed = parse_load_log(log.splitlines())
    assert parsed.buffers_mib() == {
        "weights": {"CPU_Mapped": 0.22},
        "output": {"CPU": 0.58},
        "kv_cache": {"CPU": 0.06},
        "recurrent_state": {"CPU": 0.01},
        "compute": {"CPU": 0.51},
    }
    assert parsed.kv_cache == CacheSize(mib=0.06, cells=256, layers=2)
    assert parsed.recurrent_state == CacheSize(mib=0.01, cells=1, layers=4)
    assert parsed.model_params == "113.02 K"


# --------------------------------------------------------------------------------------- load check


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.parametrize("arch", ["qwen3", "qwen35moe"])
def test_load_check_with_stock_build(
    arch: str, stock_build: Path, models: dict[str, Path], lf_home: Path
) -> None:
    report = verify_model(models[arch], load_check_build=stock_build)
    assert report.ok, report.findings
    load = report.load_check
    assert load is not None and load["loaded"] and load["returncode"] == 0
    assert load["buffers_mib"]["weights"]  # e.g. CPU_Mapped
    assert load["kv_cache"]["layers"] == report.model["layers"]["attention"]
    if arch == "qwen35moe":
        assert load["recurrent_state"]["layers"] == 4  # llama.cpp sizes the state over every layer
    assert report.checks()["load"] == "ok"


@pytest.mark.docker
@pytest.mark.llamacpp
def test_load_check_reports_refusal(stock_build: Path, vocab: Path, tmp_path: Path, lf_home: Path) -> None:
    """HF tensor names: the tensor check names them, and llama.cpp really refuses the file."""
    path = write_tiny_model(tmp_path / "hf.gguf", TinyModelSpec(name_style="hf"), vocab).path
    report = verify_model(path, load_check_build=stock_build)
    assert not report.ok
    assert "model.embed_tokens.weight" in report.model["unknown_tensors"]
    assert "token_embd.weight" in report.model["missing_tensors"]
    load = report.load_check
    assert load is not None and not load["loaded"] and load["returncode"] != 0 and load["errors"]
    assert report.checks()["load"] == "fail"
    # llama.cpp's own reason, not its last line ("exiting due to model loading error")
    assert "token_embd.weight" in load["cause"], load
    assert any(load["cause"] in finding.message for finding in report.findings if finding.check == "load")


def test_mtp_blocks_and_unknown_archs(tmp_path: Path) -> None:
    def header(arch: str, names: list[str], **keys: int) -> Any:
        path = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        for key, value in keys.items():
            writer.add_uint32(f"{arch}.{key}", value)
        for name in names:
            writer.add_tensor(name, np.zeros((2, 32), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return read_header(path)

    names = [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.nextn.eh_proj.weight",
        "blk.1.nextn.eh_proj.weight",
    ]
    _missing, unknown, _findings = check_tensor_set(
        header("qwen35", names, block_count=2, nextn_predict_layers=1)
    )
    assert unknown == ["blk.0.nextn.eh_proj.weight"]  # block 1 is the MTP block, block 0 is not
    missing, unknown, findings = check_tensor_set(
        header("llama", [*names[:2], "blk.0.attn_q.weight"], block_count=2)
    )
    assert (missing, unknown) == ([], [])  # no per-layer rules for llama: names only, no guessing
    assert [f.status for f in findings] == ["ok"]
    _missing, unknown, findings = check_tensor_set(header("gpt-nope", names[:2]))
    assert findings[0].status == "fail" and "not known" in findings[0].message


def test_an_architecture_that_is_no_string_is_named_as_such(tmp_path: Path, lf_home: Path) -> None:
    """It was "general.architecture is missing", and the tensor check blamed an architecture ''."""
    path = tmp_path / "arch.gguf"
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.kv_data[0].pop("general.architecture")
    writer.add_uint32("general.architecture", 7)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    report = verify_model(path)
    failed = [(f.check, f.message) for f in report.findings if f.status == "fail"]
    assert failed == [
        ("structure", "general.architecture is 7, not a string naming an architecture"),
        ("tensors", "no architecture (general.architecture) to check the tensors against"),
    ]


def test_hyper_parameters_llama_cpp_cannot_read_fail_the_structure_check(tmp_path: Path) -> None:
    """A head count written as a string, a context length of nan, an embedding width the token embeddings do
    not have: each was "ok"; llama.cpp refuses such files."""

    def model(name: str, width: int = 8, **keys: object) -> Path:
        path = tmp_path / f"{name}.gguf"
        writer = gguf.GGUFWriter(path, "qwen3")
        writer.add_uint32("qwen3.block_count", 1)
        writer.add_uint32("qwen3.embedding_length", 8)
        for key, value in {"attention.head_count": 2, "context_length": 64, **keys}.items():
            if value is None:
                continue
            if isinstance(value, str):
                writer.add_string(f"qwen3.{key}", value)
            elif isinstance(value, float):
                writer.add_float32(f"qwen3.{key}", value)
            else:
                writer.add_uint32(f"qwen3.{key}", int(str(value)))
        writer.add_tensor("token_embd.weight", np.zeros((4, width), dtype=np.float32))
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    cases = {
        model(
            "heads-string", **{"attention.head_count": "2"}
        ): "qwen3.attention.head_count is '2', not a count",
        model("ctx-nan", context_length=float("nan")): "qwen3.context_length is nan, not a count",
        model("heads-0", **{"attention.head_count": 0}): "qwen3.attention.head_count is 0",
        model("narrow", width=6): "token_embd.weight rows are 6 wide, but qwen3.embedding_length is 8",
    }
    for path, words in cases.items():
        report = verify_model(path, use_cache=False)
        failed = [f.message for f in report.findings if f.check == "structure" and f.status == "fail"]
        assert not report.ok and any(words in message for message in failed), (path.name, failed)
    # no head count at all: an architecture's own business (mamba has none), not damage
    for path in (model("fine"), model("no-heads", **{"attention.head_count": None})):
        report = verify_model(path, use_cache=False)
        assert not [f for f in report.findings if f.check == "structure" and f.status == "fail"], (
            report.findings
        )
