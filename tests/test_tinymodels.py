"""Unit tests for llamaforge.gguf.tiny (no llama.cpp needed).

Most tests use a small synthetic tokenizer-only GGUF written here, so they run in a few
seconds.  The tests marked ``real vocab`` use the tokenizer GGUF named by the
LLAMAFORGE_TEST_VOCAB environment variable (llama.cpp's models/ggml-vocab-qwen2.gguf)
and are skipped when it is unset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from helpers import write_mini_vocab
from llamaforge.gguf.tiny import (
    SUPPORTED_ARCHS,
    NameStyle,
    TinyModelInfo,
    TinyModelSpec,
    canonical_to_styled,
    omitted_tensors,
    tensor_data,
    tensor_plan,
    write_tiny_model,
)
from llamaforge.gguf.tiny import model as tinymodels

pytestmark = pytest.mark.quick

STYLES: tuple[NameStyle, ...] = ("canonical", "hf", "meta")
HYBRID = ("qwen35", "qwen35moe", "qwen3next")
# Per-layer tensor sets of the hybrid archs, as llama.cpp b11312's qwen35 and qwen3next loaders create them:
# qwen3next's DeltaNet input is fused (ssm_in, ssm_ba), never attn_qkv + attn_gate.
HYBRID_ATTENTION_ONLY = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
HYBRID_RECURRENT_ONLY = {
    "attn_qkv",
    "attn_gate",
    "ssm_a",
    "ssm_conv1d",
    "ssm_dt",
    "ssm_norm",
    "ssm_beta",
    "ssm_alpha",
    "ssm_out",
    "ssm_in",
    "ssm_ba",
}
NEVER = {"qwen3next": {"attn_qkv", "attn_gate"}}
SUFFIX = {"ssm_a": "", "ssm_dt": ".bias"}
MINI_VOCAB = 300
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
VOCAB_ENV = "LLAMAFORGE_TEST_VOCAB"


# ----------------------------------------------------------------------- helpers


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    fld = reader.get_field(key)
    assert fld is not None, f"missing key {key}"
    return fld.contents()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _styles(arch: str) -> tuple[NameStyle, ...]:
    # gguf.TensorNameMap lists no Meta names for the DeltaNet tensors nor for Gemma 2's extra norms, and
    # qwen3next's tiny models are written with llama.cpp's names only
    if arch == "qwen3next":
        return ("canonical",)
    return ("canonical", "hf") if arch in HYBRID or arch.startswith("gemma") else STYLES


def _canonical_tensors(arch: str, n_layer: int, full_attention_interval: int = 2) -> set[str]:
    kinds = set(gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]) - omitted_tensors(arch)
    names: set[str] = set()
    for kind in kinds:
        template = gguf.TENSOR_NAMES[kind]
        short = template.rsplit(".", 1)[-1]
        suffix = SUFFIX.get(short, ".weight")
        if "{bid}" not in template:
            names.add(template + suffix)
            continue
        for bid in range(n_layer):
            if arch in HYBRID:
                recurrent = (bid + 1) % full_attention_interval != 0
                if short in (HYBRID_ATTENTION_ONLY if recurrent else HYBRID_RECURRENT_ONLY):
                    continue
            if short in NEVER.get(arch, set()):
                continue
            names.add(template.format(bid=bid) + suffix)
    return names


@pytest.fixture(scope="module")
def mini_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer-only GGUF shaped like llama.cpp's ggml-vocab-*.gguf, 300 tokens."""
    return write_mini_vocab(
        tmp_path_factory.mktemp("vocab") / "ggml-vocab-mini.gguf", MINI_VOCAB, CHAT_TEMPLATE
    )


@pytest.fixture(scope="module")
def real_vocab() -> Path:
    value = os.environ.get(VOCAB_ENV)
    if not value:
        pytest.skip(
            f"{VOCAB_ENV} is unset: point it at llama.cpp's models/ggml-vocab-qwen2.gguf "
            "to run the real-vocabulary tests"
        )
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"{VOCAB_ENV}={value!r} is not a file")
    return path


@pytest.fixture(scope="module")
def mini_models(
    tmp_path_factory: pytest.TempPathFactory, mini_vocab: Path
) -> dict[tuple[str, str], TinyModelInfo]:
    out = tmp_path_factory.mktemp("models")
    return {
        (arch, style): write_tiny_model(
            out / f"{arch}-{style}.gguf", TinyModelSpec(arch=arch, name_style=style), mini_vocab
        )
        for arch in SUPPORTED_ARCHS
        for style in _styles(arch)
    }


# ------------------------------------------------------------- spec and names


def test_spec_defaults() -> None:
    spec = TinyModelSpec()
    assert (spec.arch, spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv) == ("qwen3", 2, 64, 4, 2)
    assert (spec.head_dim, spec.n_ff, spec.context_length, spec.seed) == (16, 128, 4096, 0)
    assert (spec.rope_freq_base, spec.dtype, spec.name_style) == (1e6, "f16", "canonical")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"arch": "llama-nope"},
        {"dtype": "bf16"},
        {"name_style": "gptq"},
        {"n_layer": 0},
        {"n_head": 4, "n_head_kv": 3},
        {"seed": -1},
        {"n_expert": 2, "n_expert_used": 3},
        {"head_dim": 15},
        {"arch": "qwen2", "head_dim": 32},  # llama.cpp's qwen2 Q is n_embd wide
    ],
)
def test_spec_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TinyModelSpec(**kwargs)


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_plan_matches_model_tensors(arch: str) -> None:
    spec = TinyModelSpec(arch=arch)
    plan = tensor_plan(spec, MINI_VOCAB)
    assert {e.canonical for e in plan} == _canonical_tensors(arch, spec.n_layer)
    assert len({e.canonical for e in plan}) == len(plan)
    assert plan[0].canonical == "token_embd.weight"


def test_only_optional_tensors_are_omitted() -> None:
    assert omitted_tensors("qwen3") == {gguf.MODEL_TENSOR.ROPE_FREQS}
    assert omitted_tensors("qwen3moe") == frozenset()
    assert omitted_tensors("qwen35") == frozenset()
    # llama.cpp loads separate gate/up expert tensors when the fused one is absent
    assert omitted_tensors("qwen35moe") == {gguf.MODEL_TENSOR.FFN_GATE_UP_EXP}


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("style", ["hf", "meta"])
def test_styled_names_map_back_through_tensor_name_map(arch: str, style: NameStyle) -> None:
    if style not in _styles(arch):
        with pytest.raises(ValueError, match="name styles"):
            TinyModelSpec(arch=arch, name_style=style)
        return
    spec = TinyModelSpec(arch=arch, name_style=style)
    name_map = gguf.TensorNameMap(spec.model_arch, spec.n_layer)
    plan = tensor_plan(spec, MINI_VOCAB)
    assert len({e.name for e in plan}) == len(plan)
    for entry in plan:
        assert entry.name != entry.canonical or entry.canonical == "output.weight"
        assert name_map.get_name(entry.name, try_suffixes=(".weight", ".bias")) == entry.canonical


def test_known_hf_and_meta_names() -> None:
    hf = {e.canonical: e.name for e in tensor_plan(TinyModelSpec(name_style="hf"), MINI_VOCAB)}
    assert hf["token_embd.weight"] == "model.embed_tokens.weight"
    assert hf["output.weight"] == "lm_head.weight"
    assert hf["output_norm.weight"] == "model.norm.weight"
    assert hf["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
    assert hf["blk.0.attn_k_norm.weight"] == "model.layers.0.self_attn.k_norm.weight"
    assert hf["blk.0.ffn_norm.weight"] == "model.layers.0.post_attention_layernorm.weight"
    assert hf["blk.0.ffn_down.weight"] == "model.layers.0.mlp.down_proj.weight"
    meta = {e.canonical: e.name for e in tensor_plan(TinyModelSpec(name_style="meta"), MINI_VOCAB)}
    assert meta["token_embd.weight"] == "tok_embeddings.weight"
    assert meta["output.weight"] == "output.weight"
    assert meta["output_norm.weight"] == "norm.weight"
    assert meta["blk.1.attn_q.weight"] == "layers.1.attention.wq.weight"
    assert meta["blk.0.attn_output.weight"] == "layers.0.attention.wo.weight"
    assert meta["blk.0.ffn_gate.weight"] == "layers.0.feed_forward.w1.weight"
    moe_plan = tensor_plan(TinyModelSpec(arch="qwen3moe", name_style="hf"), MINI_VOCAB)
    moe = {e.canonical: e.name for e in moe_plan}
    assert moe["blk.0.ffn_gate_inp.weight"] == "model.layers.0.mlp.gate.weight"
    assert moe["blk.0.ffn_up_exps.weight"] == "model.layers.0.mlp.experts.up_proj.weight"


def test_canonical_to_styled_identity_and_errors() -> None:
    assert canonical_to_styled("blk.0.attn_q.weight", "qwen3", 2, "canonical") == "blk.0.attn_q.weight"
    # suffix-less names (qwen35's ssm_a) translate too
    assert canonical_to_styled("blk.0.attn_q", "qwen3", 2, "hf") == "model.layers.0.self_attn.q_proj"
    assert canonical_to_styled("blk.1.ffn_up.bias", "qwen3", 2, "meta") == "layers.1.feed_forward.w3.bias"
    with pytest.raises(ValueError):
        canonical_to_styled("blk.0.not_a_tensor.weight", "qwen3", 2, "hf")


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_tensor_data_independent_of_style_and_deterministic(arch: str) -> None:
    styles = _styles(arch)
    plans = {s: tensor_plan(TinyModelSpec(arch=arch, name_style=s), MINI_VOCAB) for s in styles}
    base = TinyModelSpec(arch=arch)
    for entries in zip(*plans.values(), strict=True):
        assert len({e.canonical for e in entries}) == 1
        arrays = [
            tensor_data(dataclasses.replace(base, name_style=style), e)
            for style, e in zip(styles, entries, strict=True)
        ]
        for arr in arrays[1:]:
            assert arr.dtype == arrays[0].dtype
            assert np.array_equal(arr, arrays[0])
        assert np.all(np.isfinite(arrays[0].astype(np.float32)))
        assert float(np.abs(arrays[0].astype(np.float32)).max()) < 2.0
    entry = plans["canonical"][1]
    other_seed = tensor_data(dataclasses.replace(base, seed=1), entry)
    assert not np.array_equal(other_seed, tensor_data(base, entry))


def test_dtypes() -> None:
    f16 = {e.canonical: e for e in tensor_plan(TinyModelSpec(arch="qwen3moe"), MINI_VOCAB)}
    assert f16["token_embd.weight"].dtype == np.float16
    assert f16["blk.0.attn_q.weight"].dtype == np.float16
    assert f16["blk.0.attn_norm.weight"].dtype == np.float32
    assert f16["blk.0.ffn_gate_inp.weight"].dtype == np.float32
    f32 = tensor_plan(TinyModelSpec(dtype="f32"), MINI_VOCAB)
    assert all(e.dtype == np.float32 for e in f32)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_hybrid_layers_and_shapes(arch: str) -> None:
    """DeltaNet layers unless (i + 1) % interval == 0; shapes as llama.cpp's qwen35 loaders create them."""
    spec = TinyModelSpec(arch=arch, n_layer=8, full_attention_interval=4)
    assert [spec.is_recurrent(i) for i in range(8)] == [True, True, True, False] * 2
    assert not TinyModelSpec().is_recurrent(0)
    plan = {e.canonical: e for e in tensor_plan(spec, MINI_VOCAB)}
    assert set(plan) == _canonical_tensors(arch, 8, 4)
    conv_dim = 2 * spec.ssm_state_size * spec.ssm_group_count + spec.ssm_inner_size
    assert plan["blk.3.attn_q.weight"].shape == (2 * spec.n_head * spec.head_dim, spec.n_embd)  # q + gate
    assert plan["blk.0.attn_qkv.weight"].shape == (conv_dim, spec.n_embd)
    assert plan["blk.0.attn_gate.weight"].shape == (spec.ssm_inner_size, spec.n_embd)
    assert plan["blk.0.ssm_conv1d.weight"].shape == (conv_dim, spec.ssm_conv_kernel)
    assert plan["blk.0.ssm_conv1d.weight"].dtype == np.float32  # ggml's CPU ssm_conv is F32 only
    assert plan["blk.0.ssm_a"].shape == plan["blk.0.ssm_dt.bias"].shape == (spec.ssm_time_step_rank,)
    assert plan["blk.0.ssm_norm.weight"].shape == (spec.ssm_state_size,)
    assert plan["blk.0.ssm_out.weight"].shape == (spec.n_embd, spec.ssm_inner_size)
    assert "blk.0.attn_q.weight" not in plan and "blk.3.ssm_a" not in plan
    assert bool(np.all(tensor_data(spec, plan["blk.0.ssm_a"]) < 0))  # a decaying state
    if arch == "qwen35moe":
        assert plan["blk.0.ffn_gate_inp_shexp.weight"].shape == (spec.n_embd,)
        assert plan["blk.0.ffn_up_shexp.weight"].shape == (spec.n_ff_shexp, spec.n_embd)


def test_qwen3next_fuses_the_deltanet_input() -> None:
    """qwen3next's loader: ssm_in {n_embd, 2 key_dim + 2 value_dim} (Q, K, V, Z) and ssm_ba {n_embd, 2 v_heads}."""
    spec = TinyModelSpec(arch="qwen3next", n_layer=4)
    plan = {e.canonical: e for e in tensor_plan(spec, MINI_VOCAB)}
    key_dim, value_dim = spec.ssm_state_size * spec.ssm_group_count, spec.ssm_inner_size
    assert plan["blk.0.ssm_in.weight"].shape == (2 * key_dim + 2 * value_dim, spec.n_embd)
    assert plan["blk.0.ssm_ba.weight"].shape == (2 * spec.ssm_time_step_rank, spec.n_embd)
    assert plan["blk.1.attn_q.weight"].shape == (2 * spec.n_head * spec.head_dim, spec.n_embd)  # q + gate
    assert not any(name.startswith(("blk.0.attn_qkv", "blk.0.attn_gate")) for name in plan)
    assert "blk.1.ssm_in.weight" not in plan


def test_hybrid_spec_checks() -> None:
    with pytest.raises(ValueError, match="multiple"):
        TinyModelSpec(arch="qwen35", ssm_group_count=3, ssm_time_step_rank=4)
    with pytest.raises(ValueError, match="name styles"):
        TinyModelSpec(arch="qwen35moe", name_style="meta")
    assert TinyModelSpec(arch="qwen35").ssm_inner_size == 64


# ------------------------------------------------------------- written files


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_file_rereads_with_metadata(
    arch: str, mini_models: dict[tuple[str, str], TinyModelInfo], mini_vocab: Path
) -> None:
    info = mini_models[(arch, "canonical")]
    spec = TinyModelSpec(arch=arch)
    assert info.size == info.path.stat().st_size
    assert info.sha256 == _sha256(info.path)
    assert info.n_vocab == MINI_VOCAB
    reader = gguf.GGUFReader(info.path)
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, "general.name") == spec.default_name
    assert _field(reader, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_F16)
    expected = {
        "context_length": 4096,
        "block_count": 2,
        "embedding_length": 64,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 16,
        "attention.value_length": 16,
    }
    if arch in ("qwen3moe", "qwen35moe", "qwen3next"):
        expected.update({"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32})
    if arch in ("qwen35moe", "qwen3next"):
        expected["expert_shared_feed_forward_length"] = 32
    if arch in HYBRID:
        expected.update(
            {
                "ssm.conv_kernel": 4,
                "ssm.state_size": 16,
                "ssm.group_count": 2,
                "ssm.time_step_rank": 4,
                "ssm.inner_size": 64,
                "full_attention_interval": 2,
                "rope.dimension_count": 4,
            }
        )
        if arch == "qwen3next":  # no MRoPE
            assert reader.get_field(f"{arch}.rope.dimension_sections") is None
        else:
            assert list(_field(reader, f"{arch}.rope.dimension_sections")) == [1, 1, 0, 0]
    if arch.startswith("gemma"):
        expected["attention.sliding_window"] = 64
    if arch == "gemma2":
        assert _field(reader, f"{arch}.attn_logit_softcapping") == pytest.approx(50.0)
        assert _field(reader, f"{arch}.final_logit_softcapping") == pytest.approx(30.0)
    if arch == "gemma3":
        assert _field(reader, f"{arch}.rope.freq_base_swa") == pytest.approx(10000.0)
    for key, value in expected.items():
        assert _field(reader, f"{arch}.{key}") == value, key
    assert _field(reader, f"{arch}.rope.freq_base") == pytest.approx(1e6)
    assert _field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    # every tokenizer.* key copied, values equal; nothing else from the vocab file
    vocab = gguf.GGUFReader(mini_vocab)
    vocab_keys = {k for k in vocab.fields if k.startswith("tokenizer.")}
    assert {k for k in reader.fields if k.startswith("tokenizer.")} == vocab_keys
    for key in vocab_keys:
        assert _field(reader, key) == _field(vocab, key), key
    assert _field(reader, "tokenizer.chat_template") == CHAT_TEMPLATE
    # tensors: the arch's set, shapes as llama.cpp expects them
    plan = {e.canonical: e for e in tensor_plan(spec, MINI_VOCAB)}
    assert len(reader.tensors) == info.tensor_count == len(plan)
    assert {t.name for t in reader.tensors} == _canonical_tensors(arch, 2)
    for t in reader.tensors:
        entry = plan[t.name]
        assert tuple(int(x) for x in t.shape) == entry.shape[::-1]
        assert t.data.dtype == entry.dtype
        assert np.array_equal(np.asarray(t.data).reshape(entry.shape), tensor_data(spec, entry))


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_styles_hold_identical_tensor_data(
    arch: str, mini_models: dict[tuple[str, str], TinyModelInfo]
) -> None:
    name_map = gguf.TensorNameMap(gguf.MODEL_ARCH[arch.upper()], 2)
    by_style: dict[str, dict[str, bytes]] = {}
    for style in _styles(arch):
        reader = gguf.GGUFReader(mini_models[(arch, style)].path)
        names = [t.name for t in reader.tensors]
        assert names == list(mini_models[(arch, style)].tensor_names)
        by_style[style] = {
            name_map.get_name(t.name, try_suffixes=(".weight", ".bias")) or "?": np.asarray(t.data).tobytes()
            for t in reader.tensors
        }
    assert len(by_style["canonical"]) == mini_models[(arch, "canonical")].tensor_count
    assert all(by_style[style] == by_style["canonical"] for style in _styles(arch))
    if "hf" not in _styles(arch):
        return
    hf_names = set(mini_models[(arch, "hf")].tensor_names)
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= hf_names
    # Gemma 2 ties its output to the embedding: no output tensor at all
    assert ("lm_head.weight" in hf_names) == (arch != "gemma2")
    if arch in HYBRID or arch.startswith("gemma"):
        return
    meta_names = set(mini_models[(arch, "meta")].tensor_names)
    assert {"tok_embeddings.weight", "output.weight", "norm.weight"} <= meta_names


def test_deterministic_sha256_and_atomic_write(tmp_path: Path, mini_vocab: Path) -> None:
    spec = TinyModelSpec(seed=7)
    a = write_tiny_model(tmp_path / "a.gguf", spec, mini_vocab)
    b = write_tiny_model(tmp_path / "sub" / "b.gguf", TinyModelSpec(seed=7), mini_vocab)
    assert a.sha256 == b.sha256 and a.size == b.size
    again = write_tiny_model(tmp_path / "a.gguf", spec, mini_vocab)  # overwrite in place
    assert again.sha256 == a.sha256
    c = write_tiny_model(tmp_path / "c.gguf", dataclasses.replace(spec, seed=8), mini_vocab)
    assert c.sha256 != a.sha256
    d = write_tiny_model(tmp_path / "d.gguf", dataclasses.replace(spec, dtype="f32"), mini_vocab)
    assert d.size > a.size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "c.gguf", "d.gguf", "sub"]
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["b.gguf"]


def test_not_a_vocab_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-vocab.gguf"
    w = gguf.GGUFWriter(bogus, "qwen2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.tokens"):
        write_tiny_model(tmp_path / "out.gguf", TinyModelSpec(), bogus)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-vocab.gguf"]


def test_failed_write_keeps_old_file_and_no_temp(
    tmp_path: Path, mini_vocab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.gguf"
    first = write_tiny_model(target, TinyModelSpec(), mini_vocab)

    def boom(*_args: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tinymodels, "tensor_data", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_tiny_model(target, TinyModelSpec(seed=3), mini_vocab)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    assert _sha256(target) == first.sha256


def test_a_damaged_tiny_model_in_the_home_is_written_again(
    lf_home: Path, mini_vocab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny model truncated or emptied after it was written (a full disk, an edit) was served as is:
    deploy.render rendered a release of it, smoke failed in llama-server."""
    import llamaforge.build.source
    from llamaforge.core.errors import CacheError
    from llamaforge.core.events import Event
    from llamaforge.models.tiny import tiny_model_file

    tree = lf_home / "source-tree"
    (tree / "models").mkdir(parents=True)
    (tree / "models" / "ggml-vocab-qwen2.gguf").write_bytes(mini_vocab.read_bytes())
    monkeypatch.setattr(llamaforge.build.source, "fetch_source", lambda *_args, **_kwargs: tree)
    path = tiny_model_file(TinyModelSpec(), "tiny-test")
    whole = _sha256(path)
    for size in (path.stat().st_size - 100, 0):
        os.truncate(path, size)
        events: list[Event] = []
        assert tiny_model_file(TinyModelSpec(), "tiny-test", events.append) == path
        assert _sha256(path) == whole
        assert any(event.kind == "warning" and "writing tiny-test-" in event.message for event in events)
    events = []
    tiny_model_file(TinyModelSpec(), "tiny-test", events.append)
    assert not events  # a whole file is used as it is
    # the kept source tree lost the vocabulary (FileNotFoundError, a traceback, before)
    path.unlink()
    (tree / "models" / "ggml-vocab-qwen2.gguf").unlink()
    with pytest.raises(CacheError, match=r"has no models/ggml-vocab-qwen2\.gguf") as refused:
        tiny_model_file(TinyModelSpec(), "tiny-test")
    assert refused.value.hint == f"remove {lf_home} and run again: the source is extracted again"


# ------------------------------------------------------------------ real vocab


def test_real_vocab_model(tmp_path: Path, real_vocab: Path) -> None:
    """real vocab: the qwen2 tokenizer (151 936 tokens, chat template) is copied whole."""
    info = write_tiny_model(tmp_path / "tiny.gguf", TinyModelSpec(), real_vocab)
    twin = write_tiny_model(tmp_path / "twin.gguf", TinyModelSpec(), real_vocab)
    assert info.sha256 == twin.sha256
    vocab = gguf.GGUFReader(real_vocab)
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    assert info.n_vocab == n_vocab
    reader = gguf.GGUFReader(info.path)
    keys = {k for k in vocab.fields if k.startswith("tokenizer.")}
    assert {k for k in reader.fields if k.startswith("tokenizer.")} == keys
    for key in keys:
        assert _field(reader, key) == _field(vocab, key), key
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert tuple(int(x) for x in embd.shape) == (64, n_vocab)
    assert {t.name for t in reader.tensors} == _canonical_tensors("qwen3", 2)
