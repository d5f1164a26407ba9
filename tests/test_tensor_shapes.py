"""models.verify's tensor-shape check: tensors whose dimensions disagree with the header's hyper-parameters are
named without a build, and llama.cpp itself (the load check) refuses the same files and loads the clean ones."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import write_mini_vocab
from llamaforge.core.errors import InvalidOption
from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.gguf.tiny import model as tinymodels
from llamaforge.models.inspect import layer_kinds
from llamaforge.models.tensor_shapes import check_tensor_shapes
from llamaforge.models.verify import verify_model
from llamaforge.serve.fit import GiB, Settings, plan_fit
from llamaforge.serve.shape import model_shape
from llamaforge.serve.split import SplitDevice, plan_split

pytestmark = pytest.mark.quick

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


# ------------------------------------------------------------------------------------------ per-layer values


def per_layer(
    src: Path,
    dst: Path,
    arrays: dict[str, list[int] | None],
    blocks: dict[int, int] | None = None,
    **keys: list[bool],
) -> Path:
    """A copy of ``src`` with ``arrays`` (one value per block; None: no such key) in place of its ``{arch}.KEY``
    values, other ``keys`` added as bool arrays, and its blocks renumbered by ``blocks`` (old: new)."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        key = name.removeprefix(f"{arch}.")
        if name.startswith("GGUF.") or name == "general.architecture" or key in arrays:
            continue
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for key, values in arrays.items():
        if values is not None:
            writer.add_array(f"{arch}.{key}", values)
    for key, flags in keys.items():
        writer.add_array(f"{arch}.{key.replace('__', '.')}", flags)
    renamed = []
    for tensor in reader.tensors:
        name = tensor.name
        if blocks and (match := re.match(r"blk\.(\d+)\.(.+)", name)):
            name = f"blk.{blocks.get(int(match[1]), int(match[1]))}.{match[2]}"
        renamed.append((name, tensor))
    for name, tensor in sorted(renamed, key=lambda item: item[1].data_offset):
        writer.add_tensor(name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory, vocab: Path) -> Path:
    """A 4-block qwen3: 4 heads of 16, 2 KV heads, feed-forward 128."""
    path = tmp_path_factory.mktemp("qwen3") / "qwen3.gguf"
    return write_tiny_model(path, TinyModelSpec(arch="qwen3", n_layer=4), vocab).path


def test_a_layer_without_heads_is_named(qwen3: Path, tmp_path: Path, lf_home: Path) -> None:
    """head_count = [4, 4, 4, 0]: llama.cpp builds blk.3's weights with blk.0's 4 heads and what it sizes per
    layer with none; the key, the block, the value and the tensor are named, and fit refuses the file."""
    path = per_layer(qwen3, tmp_path / "heads.gguf", {"attention.head_count": [4, 4, 4, 0]})
    report = verify_model(path)
    assert not report.ok and report.checks()["tensors"] == "fail"
    (finding,) = [f for f in report.findings if f.subject == "qwen3.attention.head_count"]
    assert finding.status == "fail"
    assert finding.message.startswith(
        "qwen3.attention.head_count is 0 for blk.3, but blk.3.attn_q.weight is 64 x 64, as blk.0's value 4 "
        "makes it"
    ), finding.message
    assert not [f for f in report.findings if "llama.cpp expects" in f.message]  # the weights themselves load
    with pytest.raises(InvalidOption, match=r"head_count is 0 for blk\.3"):
        plan_fit(path, ctx=512, vram_bytes=8 * GiB)
    with pytest.raises(InvalidOption, match=r"head_count is 0 for blk\.3"):
        plan_split(path, [SplitDevice("a", 4 * GiB, "10.0.0.2:50052")], Settings(ctx=512))


def test_kv_heads_of_one_layer_and_heads_of_the_first(qwen3: Path, tmp_path: Path) -> None:
    """KV heads that differ in two blocks are one finding counting the second (llama.cpp's KV cache of those
    layers does not fit their K and V: it aborts); without head_count_kv, head_count stands for it; other heads
    than blk.0's, KV heads given, are a warning (llama.cpp runs the file); a head_count list whose blk.0 value
    is 0 gives llama.cpp no head size, so every attention tensor is the wrong shape."""
    kv = per_layer(qwen3, tmp_path / "kv.gguf", {"attention.head_count_kv": [2, 1, 2, 4]})
    header = read_header(kv)
    (finding,) = check_tensor_shapes(header, layer_kinds(header))
    assert finding.subject == "qwen3.attention.head_count_kv" and finding.status == "fail"
    assert finding.message.startswith(
        "qwen3.attention.head_count_kv is 1 for blk.1 (and another value than blk.0's in 1 more block), but "
        "blk.1.attn_k.weight is 64 x 32, as blk.0's value 2 makes it"
    ), finding.message
    kv_from_heads = per_layer(
        qwen3,
        tmp_path / "no-kv.gguf",
        {"attention.head_count": [4, 4, 4, 0], "attention.head_count_kv": None},
    )
    header = read_header(kv_from_heads)  # blk.0's 4 KV heads are not the tensors' 2 either: attn_k, attn_v
    findings = {f.subject: f for f in check_tensor_shapes(header, layer_kinds(header))}
    assert set(findings) == {"qwen3.attention.head_count", "blk.0.attn_k.weight", "blk.0.attn_v.weight"}
    finding = findings["qwen3.attention.head_count"]
    assert finding.status == "fail" and "blk.3" in finding.message and "KV cache" in finding.message
    fewer = per_layer(qwen3, tmp_path / "fewer.gguf", {"attention.head_count": [4, 4, 4, 2]})
    header = read_header(fewer)
    (finding,) = check_tensor_shapes(header, layer_kinds(header))
    assert finding.status == "warn" and finding.message.startswith(
        "qwen3.attention.head_count is 2 for blk.3, but blk.3.attn_q.weight is 64 x 64"
    )
    first = per_layer(qwen3, tmp_path / "first.gguf", {"attention.head_count": [0, 4, 4, 4]})
    header = read_header(first)
    subjects = {f.subject for f in check_tensor_shapes(header, layer_kinds(header)) if f.status == "fail"}
    assert {"blk.0.attn_q.weight", "blk.0.attn_q_norm.weight", "blk.0.attn_output.weight"} <= subjects


def test_a_layer_whose_feed_forward_width_disagrees_is_named(
    qwen3: Path, tmp_path: Path, lf_home: Path
) -> None:
    """feed_forward_length = [128, 128, 96, 128]: llama.cpp loads blk.2's 128-wide FFN by blk.0's value and
    reads no per-layer width for qwen3 (a warning); a blk.2 FFN really 96 wide is a wrong shape it refuses."""
    path = per_layer(qwen3, tmp_path / "ff.gguf", {"feed_forward_length": [128, 128, 96, 128]})
    report = verify_model(path)
    (finding,) = [f for f in report.findings if f.subject == "qwen3.feed_forward_length"]
    assert finding.status == "warn" and report.checks()["tensors"] == "warn"
    assert finding.message.startswith(
        "qwen3.feed_forward_length is 96 for blk.2, but blk.2.ffn_gate.weight is 64 x 128, as blk.0's value "
        "128 makes it"
    ), finding.message
    header = read_header(path)
    assert model_shape(header).n_ff == 128


def hybrid_without_heads_in_recurrent_blocks(vocab: Path, tmp_path: Path) -> Path:
    """A qwen35 with attention in blocks 0 and 2 (its blocks renumbered) and no heads or KV heads in the recurrent
    blocks 1 and 3."""
    tiny = write_tiny_model(tmp_path / "tiny.gguf", TinyModelSpec(arch="qwen35", n_layer=4), vocab).path
    assert layer_kinds(read_header(tiny)) == ["recurrent", "attention"] * 2
    return per_layer(
        tiny,
        tmp_path / "hybrid.gguf",
        {"attention.head_count": [4, 0, 4, 0], "attention.head_count_kv": [2, 0, 2, 0]},
        blocks={0: 1, 1: 0, 2: 3, 3: 2},
        attention__recurrent_layers=[False, True, False, True],
    )


def test_hybrid_zeros_on_recurrent_layers_pass(vocab: Path, tmp_path: Path, lf_home: Path) -> None:
    """A qwen35 whose recurrent blocks (1 and 3) have no heads and no KV heads: llama.cpp sizes the attention
    weights by blk.0 (an attention block here) and builds no attention in the others, so nothing is named."""
    path = hybrid_without_heads_in_recurrent_blocks(vocab, tmp_path)
    header = read_header(path)
    assert layer_kinds(header) == ["attention", "recurrent"] * 2
    assert check_tensor_shapes(header, layer_kinds(header)) == []
    report = verify_model(path)
    assert report.ok, report.findings
    shape = model_shape(header)
    assert shape.kv_heads == (2, 0, 2, 0) and shape.attention_layers == [0, 2]
    assert plan_fit(path, ctx=512, vram_bytes=8 * GiB).fully_offloaded


# ---------------------------------------------------------------------------------------- llama.cpp agrees


@pytest.mark.docker
@pytest.mark.llamacpp
def test_llama_cpp_on_per_layer_values(
    stock_build: Path, qwen3: Path, vocab: Path, tmp_path: Path, lf_home: Path
) -> None:
    """The oracle for the per-layer findings: KV heads that differ from blk.0's abort llama.cpp; a hybrid with
    no heads in its recurrent blocks loads; a warned feed-forward width loads."""
    kv = per_layer(qwen3, tmp_path / "kv.gguf", {"attention.head_count_kv": [2, 1, 2, 4]})
    report = verify_model(kv, load_check_build=stock_build)
    assert report.load_check is not None and not report.load_check["loaded"], report.load_check
    ff = per_layer(qwen3, tmp_path / "ff.gguf", {"feed_forward_length": [128, 128, 96, 128]})
    report = verify_model(ff, load_check_build=stock_build)
    assert report.load_check is not None and report.load_check["loaded"], report.load_check
    hybrid = hybrid_without_heads_in_recurrent_blocks(vocab, tmp_path)
    report = verify_model(hybrid, load_check_build=stock_build)
    assert report.ok and report.load_check is not None and report.load_check["loaded"], report.load_check


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
