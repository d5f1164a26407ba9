"""llamaforge.models.remap: canonical tensor names, metadata rules, streaming, verification, refusals.

Unit tests use tiny models (llamaforge.gguf.tiny) with a 300-token vocabulary written here, and
``gguf.GGUFReader`` as the independent reader of what the remap wrote. The test marked docker+llamacpp
proves the point of the tool on a real stock llama.cpp b11312 build: the HF- and Meta-named tiny models,
remapped, load and give the same greedy tokens and top-n probabilities as the canonical one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest

from helpers import write_mini_vocab
from llamaforge.core.errors import Cancelled, InvalidOption, ModelError, RecipeError
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import operations
from llamaforge.gguf.header import GGUFFormatError, read_header
from llamaforge.gguf.sources import CHUNK_SIZE
from llamaforge.gguf.tiny import TinyModelInfo, TinyModelSpec, write_tiny_model
from llamaforge.models.remap import RemapRules, list_rules, load_rules, parse_rules, remap_gguf
from llamaforge.models.remap import names as remap_names
from llamaforge.models.remap import rewrite as remap
from llamaforge.models.remap.rules import rules_json_schema

pytestmark = pytest.mark.quick

ARCHS = ("qwen3", "qwen3moe")
MINI_VOCAB = 300
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


# ----------------------------------------------------------------------------------------------- helpers


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    fld = reader.get_field(key)
    assert fld is not None, f"missing key {key}"
    return fld.contents()


def _field_type(reader: gguf.GGUFReader, key: str) -> gguf.GGUFValueType:
    fld = reader.get_field(key)
    assert fld is not None, f"missing key {key}"
    return fld.types[0]


def _tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """name -> (ggml shape, ggml type, sha256 of the data), read by gguf's own reader."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: (
            tuple(int(x) for x in t.shape),
            t.tensor_type.name,
            hashlib.sha256(t.data.tobytes()).hexdigest(),
        )
        for t in reader.tensors
    }


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def _rules(data: dict[str, Any], name: str = "inline") -> RemapRules:
    return parse_rules(data, name=name, origin=f"<{name}>")


def _write_gguf(path: Path, arch: str, tensors: dict[str, tuple[int, ...]], block_count: int = 2) -> Path:
    """A small hand-made GGUF with the given (name -> numpy shape) f32 tensors."""
    import numpy as np

    w = gguf.GGUFWriter(path, arch)
    w.add_name("handmade")
    w.add_block_count(block_count)
    w.add_context_length(4096)
    for name, shape in tensors.items():
        w.add_tensor(name, np.ones(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def mini_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer-only GGUF shaped like llama.cpp's ggml-vocab-*.gguf, 300 tokens."""
    return write_mini_vocab(
        tmp_path_factory.mktemp("vocab") / "ggml-vocab-mini.gguf", MINI_VOCAB, CHAT_TEMPLATE
    )


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory, mini_vocab: Path
) -> dict[tuple[str, str], TinyModelInfo]:
    out = tmp_path_factory.mktemp("models")
    return {
        (arch, style): write_tiny_model(
            out / f"{arch}-{style}.gguf", TinyModelSpec(arch=arch, name_style=style), mini_vocab
        )
        for arch in ARCHS
        for style in ("canonical", "hf", "meta")
    }


@pytest.fixture
def canonical(models: dict[tuple[str, str], TinyModelInfo]) -> Path:
    return models[("qwen3", "canonical")].path


# ------------------------------------------------------------------------------------------- tensor names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("style", ["hf", "meta"])
def test_names_become_canonical(
    arch: str, style: str, models: dict[tuple[str, str], TinyModelInfo], tmp_path: Path
) -> None:
    source, reference = models[(arch, style)], models[(arch, "canonical")]
    assert "token_embd.weight" not in source.tensor_names
    result = remap_gguf(source.path, tmp_path / "out.gguf", load_rules("qwen3-hf-names"))
    # what gguf's own reader sees: same names, shapes, types and data as the canonical file
    assert _tensors(result.dst) == _tensors(reference.path)
    # and since the metadata is the same too, the output is the canonical file, byte for byte
    assert result.sha256 == _sha256(result.dst) == reference.sha256
    assert result.size == reference.size
    assert (result.arch, result.target_arch, result.tensor_count) == (arch, arch, len(source.tensor_names))
    renamed = dict(result.renamed)
    assert len(renamed) == sum(1 for name in source.tensor_names if name not in reference.tensor_names)
    if style == "hf":
        assert renamed["model.embed_tokens.weight"] == "token_embd.weight"
        assert renamed["model.layers.1.self_attn.k_norm.weight"] == "blk.1.attn_k_norm.weight"
        assert renamed["lm_head.weight"] == "output.weight"
    else:
        assert renamed["tok_embeddings.weight"] == "token_embd.weight"
        assert renamed["layers.0.attention.wq.weight"] == "blk.0.attn_q.weight"
        assert "output.weight" not in renamed  # Meta's name for it is llama.cpp's
    if arch == "qwen3moe":
        target = "blk.0.ffn_gate_exps.weight"
        assert target in renamed.values()
    assert result.metadata_changes == ()
    assert _leftovers(tmp_path) == []


def test_canonical_file_passes_through(canonical: Path, tmp_path: Path) -> None:
    result = remap_gguf(canonical, tmp_path / "same.gguf")
    assert result.renamed == ()
    assert result.sha256 == _sha256(canonical)
    assert result.to_json()["verified"] is True
    json.dumps(result.to_json())  # JSON-able for --json and the MCP server


def test_metadata_bytes_kept_exactly(tmp_path: Path) -> None:
    """Token texts that are not valid UTF-8 (llama.cpp accepts them) survive the rewrite byte for byte."""
    import numpy as np

    src = tmp_path / "bytes.gguf"
    w = gguf.GGUFWriter(src, "qwen3")
    w.add_block_count(1)
    w.add_key_value(
        "tokenizer.ggml.tokens",
        [b"ok", b"\xff\xfebroken", "caf\u00e9".encode()],
        gguf.GGUFValueType.ARRAY,
        sub_type=gguf.GGUFValueType.STRING,
    )
    w.add_key_value("general.nan", float("nan"), gguf.GGUFValueType.FLOAT32)
    w.add_tensor("output.weight", np.ones((3, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    exact, lenient = read_header(src, exact=True), read_header(src)
    assert exact.metadata["tokenizer.ggml.tokens"] == (b"ok", b"\xff\xfebroken", "caf\u00e9".encode())
    assert (
        lenient.metadata["tokenizer.ggml.tokens"][1] == "\ufffd\ufffdbroken"
    )  # inspection decodes leniently
    result = remap_gguf(src, tmp_path / "out.gguf")
    assert result.sha256 == _sha256(src)


def test_unmappable_tensor_is_named(tmp_path: Path) -> None:
    src = _write_gguf(
        tmp_path / "odd.gguf",
        "qwen3",
        {
            "model.embed_tokens.weight": (8, 4),
            "model.layers.0.self_attn.mystery_proj.weight": (4, 4),
            "blk.7.attn_q.weight": (4, 4),  # canonical form, but the file has 2 blocks
        },
    )
    with pytest.raises(ModelError) as caught:
        remap_gguf(src, tmp_path / "out.gguf")
    message = caught.value.message
    assert "model.layers.0.self_attn.mystery_proj.weight" in message
    assert "blk.7.attn_q.weight" in message
    assert "2 tensor name(s) map to no llama.cpp qwen3 tensor" in message
    assert "model.embed_tokens.weight" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


def test_two_names_for_one_tensor_refused(tmp_path: Path) -> None:
    src = _write_gguf(tmp_path / "dup.gguf", "qwen3", {"lm_head.weight": (8, 4), "output.weight": (8, 4)})
    with pytest.raises(ModelError, match=r"'lm_head.weight' and 'output.weight' both map to 'output.weight'"):
        remap_gguf(src, tmp_path / "out.gguf")


def test_renames_only_for_names_only_archs(tmp_path: Path) -> None:
    hf_llama = _write_gguf(tmp_path / "llama-hf.gguf", "llama", {"model.embed_tokens.weight": (8, 4)}, 1)
    with pytest.raises(ModelError, match=r"renames tensors only for qwen3, qwen3moe, not llama") as caught:
        remap_gguf(hf_llama, tmp_path / "out.gguf")
    assert "convert_hf_to_gguf.py" in (caught.value.hint or "")
    # canonical names in another arch: metadata edits still work, nothing is renamed
    ok = _write_gguf(tmp_path / "llama.gguf", "llama", {"token_embd.weight": (8, 4)}, 1)
    rules = _rules({"metadata": {"set": {"general.name": "relabelled name"}}})
    result = remap_gguf(ok, tmp_path / "out.gguf", rules)
    assert result.renamed == ()
    assert _field(gguf.GGUFReader(result.dst), "general.name") == "relabelled name"


def test_name_map_survives_gguf_class_table_mutation(
    models: dict[tuple[str, str], TinyModelInfo], tmp_path: Path
) -> None:
    """gguf.TensorNameMap(arctic) rewrites the shared block table; the remap's maps keep their own copy."""
    gguf.TensorNameMap(gguf.MODEL_ARCH.ARCTIC, 2)
    try:
        result = remap_gguf(models[("qwen3", "hf")].path, tmp_path / "out.gguf")
        assert result.sha256 == models[("qwen3", "canonical")].sha256
    finally:
        gguf.TensorNameMap.block_mappings_cfg.clear()
        gguf.TensorNameMap.block_mappings_cfg.update(remap_names._BLOCK_TABLE)


# ------------------------------------------------------------------------------------------------ metadata


@pytest.mark.parametrize(
    ("edits", "words"),
    [
        ({"qwen3.attention.head_count_kv": 0}, "blk.0.attn_k.weight is 64 x 32"),
        ({"qwen3.expert_used_count": 64}, "the model uses 64 experts but has none"),
    ],
    ids=["kv-heads-0", "experts-on-a-dense-model"],
)
def test_edits_that_make_a_file_llama_cpp_refuses_publish_nothing(
    edits: dict[str, Any], words: str, canonical: Path, tmp_path: Path
) -> None:
    """The copy is checked as `models.verify` checks a file: a failure the source did not have is refused."""
    dst = tmp_path / "out.gguf"
    with pytest.raises(
        ModelError, match=r"make a file llama\.cpp would refuse; nothing was published"
    ) as refused:
        remap_gguf(canonical, dst, _rules({"metadata": {"set": edits}}))
    assert words in refused.value.message, refused.value.message
    assert not dst.exists() and _leftovers(tmp_path) == []


def test_a_device_or_a_pipe_is_never_replaced(canonical: Path, tmp_path: Path) -> None:
    """As root, --overwrite onto /dev/null renamed the copy over the device. Checked on a device node and a pipe
    made here (the machine's own /dev/null is never a test's output)."""
    pipe = tmp_path / "pipe.gguf"
    os.mkfifo(pipe)
    outputs = [pipe]
    if os.geteuid() == 0:  # only root makes device nodes
        device = tmp_path / "null.gguf"
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        outputs.append(device)
    for dst in outputs:
        with pytest.raises(InvalidOption, match=f"output {dst} is not a regular file"):
            remap_gguf(canonical, dst, overwrite=True)
        assert not dst.is_file()
    assert _leftovers(tmp_path) == []


def test_what_already_failed_in_the_source_is_the_remaps_to_mend(tmp_path: Path) -> None:
    """A source that `models.verify` fails (here: no vocabulary rows to match, tensors an arch lacks) is copied
    when the edits add no failure of their own."""
    src = _write_gguf(
        tmp_path / "src.gguf", "qwen3", {"token_embd.weight": (8, 4), "blk.0.attn_q.weight": (4, 4)}
    )
    assert remap.analyse_failures(read_header(src))  # the source fails verify already
    result = remap_gguf(src, tmp_path / "out.gguf", _rules({"metadata": {"set": {"general.name": "kept"}}}))
    assert result.dst.is_file()


def test_metadata_set_rename_delete(models: dict[tuple[str, str], TinyModelInfo], tmp_path: Path) -> None:
    src = models[("qwen3", "hf")]
    rules = _rules(
        {
            "metadata": {
                "set": {
                    "{arch}.context_length": 8192,
                    "{arch}.rope.freq_base": 5000000,  # an int is fine for a float32 key
                    "tokenizer.chat_template": "{{ messages[0]['content'] }}",
                    "general.name": "tiny qwen3, remapped",
                    "general.quantized_by": {"type": "string", "value": "llamaforge"},
                    "qwen3.custom_flag": {"type": "bool", "value": True},
                    "qwen3.attention.layer_norm_rms_epsilon": 1e-5,  # existing key keeps its type
                },
                "rename": {"general.description": "general.summary"},
                "delete": ["general.type", "general.never_there"],
            }
        }
    )
    result = remap_gguf(src.path, tmp_path / "out.gguf", rules)
    reader = gguf.GGUFReader(result.dst)
    expected = {
        "qwen3.context_length": (8192, gguf.GGUFValueType.UINT32),
        "tokenizer.chat_template": ("{{ messages[0]['content'] }}", gguf.GGUFValueType.STRING),
        "general.name": ("tiny qwen3, remapped", gguf.GGUFValueType.STRING),
        "general.quantized_by": ("llamaforge", gguf.GGUFValueType.STRING),
        "qwen3.custom_flag": (True, gguf.GGUFValueType.BOOL),
        "general.summary": (
            "tiny random-weight test model written by llamaforge.gguf.tiny; not trained",
            gguf.GGUFValueType.STRING,
        ),
    }
    for key, (value, vtype) in expected.items():
        assert (_field(reader, key), _field_type(reader, key)) == (value, vtype), key
    assert _field(reader, "qwen3.rope.freq_base") == pytest.approx(5e6)
    assert _field_type(reader, "qwen3.rope.freq_base") == gguf.GGUFValueType.FLOAT32
    assert _field(reader, "qwen3.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert _field_type(reader, "qwen3.attention.layer_norm_rms_epsilon") == gguf.GGUFValueType.FLOAT32
    assert reader.get_field("general.type") is None
    assert reader.get_field("general.description") is None
    # everything else unchanged, tokenizer included; tensors as in the canonical file
    before = gguf.GGUFReader(src.path)
    untouched = set(before.fields) - {
        "general.type",
        "general.description",
        "general.name",
        "tokenizer.chat_template",
        "qwen3.context_length",
        "qwen3.rope.freq_base",
        "qwen3.attention.layer_norm_rms_epsilon",
    }
    for key in untouched - {"GGUF.kv_count"}:
        assert _field(reader, key) == _field(before, key), key
    assert _tensors(result.dst) == _tensors(models[("qwen3", "canonical")].path)
    changes = {(c.op, c.key): c for c in result.metadata_changes}
    assert changes[("delete", "general.never_there")].note == "already absent"
    assert changes[("set", "qwen3.context_length")].to_json()["old"] == 4096
    assert changes[("rename", "general.summary")].old == "general.description"
    assert changes[("set", "general.name")].to_json()["new"] == "tiny qwen3, remapped"


def test_setting_a_value_already_there_is_reported_unchanged(canonical: Path, tmp_path: Path) -> None:
    rules = _rules({"metadata": {"set": {"{arch}.context_length": 4096}}})
    result = remap_gguf(canonical, tmp_path / "out.gguf", rules)
    assert [c.note for c in result.metadata_changes] == ["unchanged"]
    assert result.sha256 == _sha256(canonical)


def test_shipped_rules_files_load() -> None:
    assert {"qwen3-hf-names", "qwen3-long-context"} <= set(list_rules())
    for name in list_rules():
        rules = load_rules(name)
        assert rules.name == name and rules.description
        assert name in rules.origin
    names_only = load_rules("qwen3-hf-names")
    assert (
        names_only.metadata.set_ == {} and names_only.metadata.rename == {} and not names_only.metadata.delete
    )
    schema = json.loads(rules_json_schema())
    assert "set" in schema["$defs"]["MetadataRules"]["properties"]


def test_long_context_rules(mini_vocab: Path, tmp_path: Path) -> None:
    qwen3_native = write_tiny_model(tmp_path / "native.gguf", TinyModelSpec(context_length=40960), mini_vocab)
    rules = load_rules("qwen3-long-context")
    result = remap_gguf(qwen3_native.path, tmp_path / "long.gguf", rules)
    reader = gguf.GGUFReader(result.dst)
    assert (_field(reader, "qwen3.context_length"), _field_type(reader, "qwen3.context_length")) == (
        131072,
        gguf.GGUFValueType.UINT32,
    )
    assert _field(reader, "qwen3.rope.scaling.type") == "yarn"
    assert _field(reader, "qwen3.rope.scaling.factor") == pytest.approx(4.0)
    assert _field_type(reader, "qwen3.rope.scaling.factor") == gguf.GGUFValueType.FLOAT32
    assert _field(reader, "qwen3.rope.scaling.original_context_length") == 32768
    assert _field(reader, "qwen3.rope.freq_base") == pytest.approx(1e6)  # untouched
    # applying it twice is refused, so is a model already scaled or with another native window
    with pytest.raises(ModelError, match=r"apply only when qwen3\.context_length .* long\.gguf has 131072"):
        remap_gguf(result.dst, tmp_path / "longer.gguf", rules)
    linear = _rules({"metadata": {"set": {"{arch}.rope.scaling.type": "linear"}}})
    scaled = remap_gguf(qwen3_native.path, tmp_path / "scaled.gguf", linear)
    with pytest.raises(
        ModelError, match=r"only to files without qwen3\.rope\.scaling\.type; scaled\.gguf has it"
    ):
        remap_gguf(scaled.dst, tmp_path / "longer.gguf", rules)
    short = write_tiny_model(tmp_path / "short.gguf", TinyModelSpec(context_length=4096), mini_vocab)
    with pytest.raises(
        ModelError, match=r"qwen3\.context_length is one of \[32768, 40960\]; short\.gguf has 4096"
    ):
        remap_gguf(short.path, tmp_path / "out.gguf", rules)


def test_rules_for_another_arch_refused(canonical: Path, tmp_path: Path) -> None:
    rules = _rules({"match": {"architectures": ["qwen3moe"]}}, name="moe-only")
    with pytest.raises(
        ModelError, match=r"remap rules <moe-only> are for qwen3moe; qwen3-canonical.gguf is qwen3"
    ):
        remap_gguf(canonical, tmp_path / "out.gguf", rules)
    assert list(tmp_path.iterdir()) == []


def test_rename_of_missing_key_and_untyped_new_key(canonical: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"has no key general\.descriptoin") as caught:
        remap_gguf(
            canonical, tmp_path / "a.gguf", _rules({"metadata": {"rename": {"general.descriptoin": "x"}}})
        )
    assert "general.description" in (caught.value.hint or "")
    typo = _rules({"metadata": {"set": {"{arch}.context_lenght": 8192}}}, name="typo")
    with pytest.raises(RecipeError, match=r"<typo>: metadata\.set\.\{arch\}\.context_lenght") as error:
        remap_gguf(canonical, tmp_path / "b.gguf", typo)
    assert "did you mean 'qwen3.context_length'" in (error.value.hint or "")
    assert list(tmp_path.iterdir()) == []


BAD_RULES = [
    ('descripton = "x"\n', r"descripton: unknown key", "did you mean 'description'"),
    ("[metadata]\nsett = {}\n", r"metadata\.sett: unknown key", "did you mean 'set'"),
    (
        '[match]\narchitecture = ["qwen3"]\n',
        r"match\.architecture: unknown key",
        "did you mean 'architectures'",
    ),
    (
        '[metadata.set]\n"{arch}.context_length" = "long"\n',
        r"expects an integer \(uint32\), not 'long'",
        None,
    ),
    ('[metadata.set]\n"{arch}.context_length" = -1\n', r"-1 is out of range for uint32", None),
    ('[metadata.set]\n"{arch}.rope.freq_base" = true\n', r"expects a number \(float32\), not True", None),
    (
        '[metadata.set]\n"{arch}.rope.scaling.type" = "yarnn"\n',
        r"must be one of none, linear, yarn, longrope",
        None,
    ),
    (
        '[metadata.set]\n"general.architecture" = "qwen33"\n',
        r"does not know architecture 'qwen33'; did you mean",
        None,
    ),
    ('[metadata.set]\n"x.y" = { type = "uint33", value = 1 }\n', r"metadata\.set\.x\.y\.type", None),
    ('[metadata.set]\n"x.y" = { type = "uint8", value = 300 }\n', r"300 is out of range for uint8", None),
    (
        '[metadata.set]\n"x.y" = { typ = "uint8", value = 3 }\n',
        r"metadata\.set\.x\.y\.typ: unknown key",
        "'type'",
    ),
    ('[metadata.set]\n"x.y" = [1, 2]\n', r"value must be an integer, number, string or boolean", None),
    (
        '[metadata.set]\n"{arch}.context_length" = { type = "uint64", value = 1 }\n',
        r"reads this key as uint32",
        None,
    ),
    ('[metadata]\ndelete = ["{arch}.block_count"]\n', r"\{arch\}\.block_count cannot be edited", None),
    ('[metadata]\ndelete = ["general.alignment"]\n', r"general\.alignment cannot be edited", None),
    ('[metadata]\ndelete = ["general.architecture"]\n', r"can only be set \(a relabel\)", None),
    (
        '[metadata]\ndelete = ["general.name"]\n[metadata.set]\n"general.name" = "x"\n',
        r"in both delete and set",
        None,
    ),
    ('[metadata]\ndelete = ["bad key!"]\n', r"'bad key!' is not a metadata key", None),
    ("[metadata\n", r"is not valid TOML", None),
]


@pytest.mark.parametrize(("text", "problem", "hint"), BAD_RULES)
def test_bad_rules_file(text: str, problem: str, hint: str | None, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError, match=problem) as caught:
        load_rules(path)
    assert str(path) in caught.value.message
    if hint:
        assert hint in (caught.value.hint or "")


def test_unknown_rules_name() -> None:
    with pytest.raises(RecipeError, match=r"unknown remap rules 'qwen3-hf-name'") as caught:
        load_rules("qwen3-hf-name")
    assert "did you mean 'qwen3-hf-names'?" in (caught.value.hint or "")
    with pytest.raises(RecipeError, match=r"does not exist"):
        load_rules("/nonexistent/rules.toml")


# ------------------------------------------------------------------------------------------------ relabels


def test_qwen3_to_qwen2_relabel_refused(canonical: Path, tmp_path: Path) -> None:
    for kwargs in (
        {"target_arch": "qwen2"},
        {"rules": _rules({"metadata": {"set": {"general.architecture": "qwen2"}}})},
    ):
        with pytest.raises(ModelError) as caught:
            remap_gguf(canonical, tmp_path / "out.gguf", **kwargs)  # type: ignore[arg-type]
        message = caught.value.message
        assert "refusing to relabel qwen3-canonical.gguf from qwen3 to qwen2" in message
        assert "has no attn_k_norm, attn_q_norm tensors" in message
        assert "reject 4 of the file's tensors" in message
        assert "blk.0.attn_q_norm.weight" in message and "blk.1.attn_k_norm.weight" in message
        assert "a relabel never converts weights" in (caught.value.hint or "")
    assert list(tmp_path.iterdir()) == []


def test_relabel_that_fits_renames_arch_keys(canonical: Path, tmp_path: Path) -> None:
    events: list[Event] = []
    result = remap_gguf(canonical, tmp_path / "vl.gguf", target_arch="qwen3vl", reporter=events.append)
    reader = gguf.GGUFReader(result.dst)
    assert _field(reader, "general.architecture") == "qwen3vl"
    assert _field(reader, "qwen3vl.context_length") == 4096
    assert not [k for k in reader.fields if k.startswith("qwen3.")]
    assert _tensors(result.dst) == _tensors(canonical)
    assert result.target_arch == "qwen3vl" and result.warnings
    assert any(e.kind == "warning" and "check the result loads" in e.message for e in events)
    relabel = next(c for c in result.metadata_changes if c.op == "relabel")
    assert (relabel.old, relabel.new) == ("qwen3", "qwen3vl")


def test_contradicting_relabels_refused(canonical: Path, tmp_path: Path) -> None:
    rules = _rules({"metadata": {"set": {"general.architecture": "qwen3vl"}}})
    with pytest.raises(InvalidOption, match=r"contradicts"):
        remap_gguf(canonical, tmp_path / "out.gguf", rules, target_arch="qwen3moe")
    with pytest.raises(ModelError, match=r"does not know architecture 'qwen9'"):
        remap_gguf(canonical, tmp_path / "out.gguf", target_arch="qwen9")


# ------------------------------------------------------------------------------------------------- paths


def test_output_must_not_be_the_input(canonical: Path, tmp_path: Path) -> None:
    before = _sha256(canonical)
    with pytest.raises(InvalidOption, match=r"is the input file"):
        remap_gguf(canonical, canonical)
    with pytest.raises(InvalidOption, match=r"is the input file"):
        remap_gguf(canonical, canonical.parent / "sub" / ".." / canonical.name)
    link = tmp_path / "link.gguf"
    link.symlink_to(canonical)
    with pytest.raises(InvalidOption, match=r"is the input file"):
        remap_gguf(canonical, link, overwrite=True)
    hard = tmp_path / "hard.gguf"
    os.link(canonical, hard)
    with pytest.raises(InvalidOption, match=r"under another name"):
        remap_gguf(canonical, hard, overwrite=True)
    assert _sha256(canonical) == before


def test_existing_output_needs_overwrite(canonical: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"old")
    with pytest.raises(InvalidOption, match=r"exists") as caught:
        remap_gguf(canonical, dst)
    assert "--overwrite" in (caught.value.hint or "")
    assert dst.read_bytes() == b"old"
    remap_gguf(canonical, dst, overwrite=True)
    assert _sha256(dst) == _sha256(canonical)
    with pytest.raises(InvalidOption, match=r"is a directory"):
        remap_gguf(canonical, tmp_path, overwrite=True)
    with pytest.raises(InvalidOption, match=r"does not exist"):
        remap_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf")


def test_output_under_a_file_refused(canonical: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "regular.gguf"
    blocker.write_bytes(b"keep")
    for dst in (blocker / "x.gguf", blocker / "a" / "b" / "x.gguf"):
        with pytest.raises(InvalidOption) as caught:
            remap_gguf(canonical, dst)
        assert caught.value.exit_code == 2
        assert (
            f"--dst {dst}" in caught.value.message and f"{blocker} is not a directory" in caught.value.message
        )
        assert "--dst in a directory you can write" in (caught.value.hint or "")
    assert blocker.read_bytes() == b"keep" and sorted(p.name for p in tmp_path.iterdir()) == ["regular.gguf"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_output_where_no_file_can_be_made_refused(canonical: Path) -> None:
    with pytest.raises(InvalidOption) as caught:
        remap_gguf(canonical, Path("/proc/x.gguf"))
    assert (
        "--dst /proc/x.gguf: cannot create a file in /proc: No such file or directory" in caught.value.message
    )
    assert "--dst" in (caught.value.hint or "")


def test_failed_write_leaves_nothing(
    canonical: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = remap._write

    def write_then_run_out_of_space(tmp: Path, *args: Any) -> dict[str, str]:
        real_write(tmp, *args)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    monkeypatch.setattr(remap, "_write", write_then_run_out_of_space)
    dst = tmp_path / "out.gguf"
    with pytest.raises(ModelError) as caught:
        remap_gguf(canonical, dst)
    assert caught.value.exit_code == ModelError.exit_code
    assert f"--dst {dst}: writing it failed: {os.strerror(errno.ENOSPC)}" in caught.value.message
    assert "nothing was published" in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_is_a_json_error(
    canonical: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import llamaforge.models.ops_remap  # noqa: F401 - registers models.remap
    from llamaforge.fronts.cli import run_operation

    blocker = tmp_path / "regular.gguf"
    blocker.write_bytes(b"keep")
    dst = blocker / "x.gguf"
    arguments = {"src": str(canonical), "dst": str(dst)}
    assert run_operation(operations()["models.remap"], arguments, as_json=True, verbose=False) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["exit_code"] == 2 and f"--dst {dst}" in error["message"] and "--dst" in error["hint"]


def test_custom_alignment_kept(tmp_path: Path) -> None:
    import numpy as np

    src = tmp_path / "aligned.gguf"
    w = gguf.GGUFWriter(src, "qwen3")
    w.add_custom_alignment(64)
    w.add_block_count(1)
    w.add_tensor("model.norm.weight", np.arange(5, dtype=np.float32))
    w.add_tensor("lm_head.weight", np.arange(15, dtype=np.float32).reshape(3, 5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    result = remap_gguf(src, tmp_path / "out.gguf")
    header = read_header(result.dst, exact=True)
    assert header.alignment == 64 and all(header.absolute_offset(t) % 64 == 0 for t in header.tensors)
    assert [t.name for t in header.tensors] == ["output_norm.weight", "output.weight"]
    reader = gguf.GGUFReader(result.dst)
    assert reader.alignment == 64
    assert reader.tensors[1].data.tolist() == np.arange(15, dtype=np.float32).reshape(3, 5).tolist()


def test_empty_array_refused_with_a_way_out(tmp_path: Path) -> None:
    """GGUFWriter cannot write an empty array; the remap says so and how to drop the key."""
    made = tmp_path / "made.gguf"
    w = gguf.GGUFWriter(made, "qwen3")
    w.add_block_count(0)
    w.add_array("x.empty", [7])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(made.read_bytes())
    at = data.index(b"x.empty") + len(b"x.empty") + 4 + 4  # value type, item type
    data[at : at + 8 + 4] = struct.pack("<Q", 0)  # length 0, and the one int32 item gone
    src = tmp_path / "empty.gguf"
    src.write_bytes(bytes(data))
    assert read_header(src, exact=True).metadata["x.empty"] == ()
    with pytest.raises(ModelError, match=r"key x\.empty is an empty array") as caught:
        remap_gguf(src, tmp_path / "out.gguf")
    assert 'delete = ["x.empty"]' in (caught.value.hint or "")
    result = remap_gguf(src, tmp_path / "out.gguf", _rules({"metadata": {"delete": ["x.empty"]}}))
    assert gguf.GGUFReader(result.dst).get_field("x.empty") is None


# ---------------------------------------------------------------------------------------- corrupt inputs


def _cut_points(path: Path) -> dict[str, int]:
    data = path.read_bytes()
    header = read_header(path)
    first = min(header.absolute_offset(t) for t in header.tensors)
    return {
        "header": 20,
        "metadata": data.index(b"tokenizer.ggml.tokens") + 30,
        "tensor infos": data.index(b"blk.1.attn_q.weight") + 4,
        "tensor data": first + 100,
        "last byte": len(data) - 1,
    }


@pytest.mark.parametrize("where", ["header", "metadata", "tensor infos", "tensor data", "last byte"])
def test_truncated_input_refused(where: str, canonical: Path, tmp_path: Path) -> None:
    cut = _cut_points(canonical)[where]
    src = tmp_path / "in" / "truncated.gguf"
    src.parent.mkdir()
    src.write_bytes(canonical.read_bytes()[:cut])
    out = tmp_path / "out"
    with pytest.raises(GGUFFormatError) as caught:
        remap_gguf(src, out / "x.gguf")
    assert str(src) in caught.value.message
    assert "truncated, corrupt" in (caught.value.hint or "") and "download or convert" in (
        caught.value.hint or ""
    )
    assert not out.exists() or list(out.iterdir()) == []


def test_last_tensor_cut_is_named(canonical: Path, tmp_path: Path) -> None:
    src = tmp_path / "t.gguf"
    src.write_bytes(canonical.read_bytes()[:-1])
    last = max(read_header(canonical).tensors, key=lambda t: t.offset)
    with pytest.raises(
        GGUFFormatError, match=rf"tensor '{last.name}' data .* runs past the end .* 1 bytes missing"
    ):
        remap_gguf(src, tmp_path / "x.gguf")


def test_crafted_array_length_refused_fast(canonical: Path, tmp_path: Path) -> None:
    """GGUFReader 0.19.0 loops on this; the bounded reader refuses it at once."""
    data = bytearray(canonical.read_bytes())
    key = b"tokenizer.ggml.tokens"
    length_at = data.index(key) + len(key) + 4 + 4  # value type, item type
    data[length_at : length_at + 8] = struct.pack("<Q", 2**63 - 5)
    src = tmp_path / "crafted.gguf"
    src.write_bytes(bytes(data))
    started = time.monotonic()
    with pytest.raises(
        GGUFFormatError,
        match=r"length 9223372036854775803 exceeds .*field tokenizer\.ggml\.tokens \(array length\)",
    ):
        remap_gguf(src, tmp_path / "x.gguf")
    assert time.monotonic() - started < 5


def test_tensor_offset_past_end_and_bad_header(canonical: Path, tmp_path: Path) -> None:
    data = bytearray(canonical.read_bytes())
    name = b"output_norm.weight"
    offset_at = data.index(name) + len(name) + 4 + 8 + 4  # n_dims, one dim, type
    data[offset_at : offset_at + 8] = struct.pack("<Q", 2**40)
    src = tmp_path / "far.gguf"
    src.write_bytes(bytes(data))
    with pytest.raises(
        GGUFFormatError, match=r"tensor 'output_norm.weight' data .* runs past the end of the file"
    ):
        remap_gguf(src, tmp_path / "x.gguf")
    counts = bytearray(canonical.read_bytes())
    counts[8:16] = struct.pack("<Q", 2**60)  # tensor count
    (tmp_path / "counts.gguf").write_bytes(bytes(counts))
    with pytest.raises(GGUFFormatError, match=r"length 1152921504606846976 exceeds .*field tensor count"):
        remap_gguf(tmp_path / "counts.gguf", tmp_path / "x.gguf")
    (tmp_path / "text.gguf").write_text("definitely not a model, but long enough to have a header\n")
    with pytest.raises(GGUFFormatError, match=r"not a GGUF file"):
        remap_gguf(tmp_path / "text.gguf", tmp_path / "x.gguf")


# ------------------------------------------------------------------------------------ streaming, safety


def test_memory_stays_far_below_model_size(mini_vocab: Path, tmp_path: Path) -> None:
    """~40 MB of weights go through a fixed CHUNK_SIZE buffer, never a whole-model array."""
    spec = TinyModelSpec(
        n_layer=2, n_embd=768, n_head=6, n_head_kv=6, head_dim=128, n_ff=3072, name_style="hf"
    )
    model = write_tiny_model(tmp_path / "big-hf.gguf", spec, mini_vocab)
    assert model.size > 35 * 2**20
    tracemalloc.start()
    try:
        result = remap_gguf(model.path, tmp_path / "big.gguf")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.tensor_bytes > 35 * 2**20
    print(f"\nremap of {model.size / 2**20:.1f} MiB: tracemalloc peak {peak / 2**20:.2f} MiB")
    assert peak < 3 * CHUNK_SIZE
    assert peak < model.size / 4


def test_verification_catches_a_bad_copy(
    models: dict[tuple[str, str], TinyModelInfo], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = remap._write

    def write_then_flip_a_bit(tmp: Path, *args: Any) -> dict[str, str]:
        hashes = real_write(tmp, *args)
        header = read_header(tmp)
        last = header.absolute_offset(max(header.tensors, key=lambda t: t.offset))
        with tmp.open("r+b") as fh:
            fh.seek(last + 3)
            byte = fh.read(1)
            fh.seek(last + 3)
            fh.write(bytes([byte[0] ^ 1]))
        return hashes

    monkeypatch.setattr(remap, "_write", write_then_flip_a_bit)
    with pytest.raises(ModelError, match=r"does not match its input; nothing was published") as caught:
        remap_gguf(models[("qwen3", "hf")].path, tmp_path / "out.gguf")
    assert "tensor output.weight: sha256 of its data differs from input tensor 'lm_head.weight'" in (
        caught.value.message
    )
    assert list(tmp_path.iterdir()) == []


def test_cancel_removes_the_partial_output(canonical: Path, tmp_path: Path) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        remap_gguf(canonical, tmp_path / "a.gguf", cancel=token)
    mid = CancelToken()

    def cancel_once_writing(event: Event) -> None:
        if event.kind == "stage" and event.message.startswith("writing"):
            mid.cancel()

    with pytest.raises(Cancelled):
        remap_gguf(canonical, tmp_path / "b.gguf", reporter=cancel_once_writing, cancel=mid)
    assert list(tmp_path.iterdir()) == []


def test_progress_events(canonical: Path, tmp_path: Path) -> None:
    events: list[Event] = []
    result = remap_gguf(canonical, tmp_path / "out.gguf", reporter=events.append)
    assert all(e.stage == "remap" for e in events)
    stages = [e.message.split()[0] for e in events if e.kind == "stage"]
    assert stages == ["reading", "writing", "verifying"]
    copied = [e for e in events if e.kind == "progress" and e.message.startswith("copied")]
    assert copied[-1].completed == copied[-1].total == result.tensor_bytes
    verified = [e for e in events if e.kind == "progress" and e.message.startswith("verified")]
    assert verified[-1].completed == verified[-1].total == result.size
    assert events[-1].kind == "info" and "verified" in events[-1].message


def test_registered_operation(models: dict[tuple[str, str], TinyModelInfo], tmp_path: Path) -> None:
    import llamaforge.models.ops_remap  # noqa: F401 - registers models.remap (also listed in operations' modules)
    from llamaforge.fronts.cli import run_operation

    op = operations()["models.remap"]
    assert op.positional == ("src", "dst") and not op.read_only
    dst = tmp_path / "out.gguf"
    arguments = {"src": str(models[("qwen3", "meta")].path), "dst": str(dst), "rules": "qwen3-hf-names"}
    assert run_operation(op, arguments, as_json=True, verbose=False) == 0
    assert _sha256(dst) == models[("qwen3", "canonical")].sha256
    assert run_operation(op, arguments, as_json=True, verbose=False) == InvalidOption.exit_code  # exists
    with pytest.raises(Exception, match="extra"):
        op.params.model_validate({**arguments, "rulez": "x"})


# ------------------------------------------------------------------------------- stock llama.cpp proof


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _server(binary: Path, model: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                "256",
                "-np",
                "1",
                "-t",
                "2",
                "--no-warmup",
                "--seed",
                "0",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            yield proc, f"http://127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"llama-server at {url} not ready after {timeout} s")


def _greedy(binary: Path, model: Path, log: Path) -> dict[str, Any]:
    with _server(binary, model, log) as (proc, url):
        assert _wait_ready(proc, url), log.read_text(errors="replace")[-3000:]
        body = {
            "prompt": "Hello, my name is",
            "n_predict": 8,
            "temperature": 0,
            "n_probs": 3,
            "cache_prompt": False,
            "return_tokens": True,
            "seed": 0,
        }
        request = urllib.request.Request(
            f"{url}/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            data = json.load(response)
    return {key: data[key] for key in ("content", "tokens", "completion_probabilities")}


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.parametrize("arch", ARCHS)
def test_remapped_models_run_in_stock_llamacpp(
    arch: str, tmp_path: Path, stock_build: Path, source_tree: Path
) -> None:
    vocab = source_tree / "models" / "ggml-vocab-qwen2.gguf"
    server = stock_build / "bin" / "llama-server"
    canonical = write_tiny_model(tmp_path / "canonical.gguf", TinyModelSpec(arch=arch), vocab)
    want = _greedy(server, canonical.path, tmp_path / "canonical.log")
    # (a token that ends inside a UTF-8 sequence shares its probability entry with the next one)
    assert len(want["tokens"]) == 8 and want["completion_probabilities"]
    for style in ("hf", "meta"):
        named = write_tiny_model(
            tmp_path / f"{style}.gguf", TinyModelSpec(arch=arch, name_style=style), vocab
        )
        # stock llama.cpp refuses the file as the converter left it ...
        log = tmp_path / f"{style}-refused.log"
        with _server(server, named.path, log) as (proc, url):
            assert not _wait_ready(proc, url)
            assert proc.wait(timeout=60) != 0
        assert "tensor 'token_embd.weight' not found" in log.read_text(errors="replace")
        # ... and loads the remapped copy, with the canonical model's greedy tokens and top-3 logprobs
        remapped = remap_gguf(named.path, tmp_path / f"{style}-remapped.gguf", load_rules("qwen3-hf-names"))
        assert remapped.sha256 == canonical.sha256
        assert _greedy(server, remapped.dst, tmp_path / f"{style}-remapped.log") == want
