"""The qwen3 remap patch's name table: generated from gguf's TensorNameMap, checked in inside the patch, no drift.

Fast tier: no build, no Docker. The proof that llama.cpp itself remaps is tests/test_qwen3_remap_patch.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import pytest

from llamaforge.gguf.tiny import SUPPORTED_ARCHS, TinyModelSpec, tensor_plan
from llamaforge.models.remap_table import (
    HEADER_PATH,
    REMAP_ARCHS,
    alias_style,
    arch_rules,
    header_from_patch,
    remap_name,
    remap_rules,
    render_cpp_table,
)

pytestmark = pytest.mark.quick

PATCHES = Path(__file__).resolve().parents[1] / "patches" / "llama.cpp"
PATCH = PATCHES / "0001-qwen3-tensor-name-remap.patch"


def _model_arch(arch: str) -> gguf.MODEL_ARCH:
    return next(member for member, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)


def test_header_in_patch_is_the_generated_table() -> None:
    """Drift: regenerate the patch (see remaptable's docstring) when gguf's map or the generator changes."""
    assert header_from_patch(PATCH.read_text(encoding="utf-8")) == render_cpp_table()


def test_series_lists_the_patch() -> None:
    names = [line.split("#", 1)[0].strip() for line in (PATCHES / "series").read_text().splitlines()]
    assert PATCH.name in [n for n in names if n]


def test_patch_is_deterministic_git_diff() -> None:
    """No dates, no mail headers, no abbreviated (repository-dependent) hashes; made from the source root."""
    text = PATCH.read_text(encoding="utf-8")
    assert not text.startswith("From "), "format-patch mail header with a date"
    files = re.findall(r"^diff --git a/(\S+) b/\1$", text, flags=re.MULTILINE)
    assert files == ["src/llama-model-loader.cpp", HEADER_PATH]
    for line in text.splitlines():
        if line.startswith(("--- ", "+++ ")):
            assert "\t" not in line, f"timestamp in {line!r}"
        if line.startswith("index "):
            assert re.fullmatch(r"index [0-9a-f]{40}\.\.[0-9a-f]{40}( \d{6})?", line), line
    assert f'+#include "{Path(HEADER_PATH).name}"' in text


@pytest.mark.parametrize("arch", REMAP_ARCHS)
@pytest.mark.parametrize("style", ["hf", "meta"])
def test_every_tiny_model_name_maps_to_canonical(arch: str, style: str) -> None:
    assert arch in SUPPORTED_ARCHS
    spec = TinyModelSpec(arch=arch, n_layer=3, name_style=style)  # type: ignore[arg-type]
    plan = tensor_plan(spec, n_vocab=32)
    remapped = 0
    for entry in plan:
        if entry.name == entry.canonical:
            # Meta's name for the output matrix is llama.cpp's ("output"): nothing to remap
            assert remap_name(entry.name, arch) is None
            continue
        assert remap_name(entry.name, arch) == entry.canonical, entry.name
        assert alias_style(entry.name) == style
        remapped += 1
    assert remapped >= len(plan) - 1


# qwen3next's tiny models carry llama.cpp's names only: nothing to remap
@pytest.mark.parametrize("arch", [a for a in SUPPORTED_ARCHS if a not in (*REMAP_ARCHS, "qwen3next")])
def test_tiny_models_of_other_archs_are_left_alone(arch: str) -> None:
    """qwen35/qwen35moe are left out on purpose (see REMAP_ARCHS): their HF files need value conversion."""
    names = []
    for style in ("hf", "meta"):
        try:
            spec = TinyModelSpec(arch=arch, n_layer=4, name_style=style)  # type: ignore[arg-type]
        except ValueError:
            continue  # tinymodels does not write this style for the arch
        names += [entry.name for entry in tensor_plan(spec, n_vocab=32)]
    assert names
    assert [n for n in names if remap_name(n, arch) is not None] == []


@pytest.mark.parametrize("arch", REMAP_ARCHS)
def test_canonical_names_are_never_remapped(arch: str) -> None:
    for entry in tensor_plan(TinyModelSpec(arch=arch, n_layer=2), n_vocab=32):
        assert remap_name(entry.canonical, arch) is None
    canonical = set(gguf.TENSOR_NAMES.values())
    assert not [r.source for r in remap_rules() if r.source in canonical]


@pytest.mark.parametrize("arch", REMAP_ARCHS)
def test_lookup_agrees_with_tensor_name_map(arch: str) -> None:
    """The pattern table, looked up the C++ way (first match wins), gives what gguf's own map gives for
    every hf/meta alias of the arch, at every block, with and without a suffix."""
    name_map = gguf.TensorNameMap(_model_arch(arch), 12)
    canonical = set(gguf.TENSOR_NAMES.values())
    checked = 0
    for alias in name_map.mapping:
        # aliases with a baked-in suffix are left out of the table on purpose
        if alias_style(alias) is None or alias in canonical or alias.endswith((".weight", ".bias")):
            continue
        for suffix in ("", ".weight", ".bias"):
            name = alias + suffix
            assert remap_name(name, arch) == name_map.get_name(name, try_suffixes=(".weight", ".bias")), name
            checked += 1
    assert checked > 1000


def test_rules_cover_only_remap_archs_and_both_styles() -> None:
    rules = remap_rules()
    assert {a for r in rules for a in r.archs} == set(REMAP_ARCHS)
    assert {r.style for r in rules} == {"hf", "meta"}
    # same alias, different tensor per arch family is allowed; within one arch an alias is unique
    for arch in REMAP_ARCHS:
        sources = [r.source for r in rules if arch in r.archs]
        assert len(sources) == len(set(sources)) == len(arch_rules(arch))


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.01.self_attn.q_proj.weight",  # leading zero: not what the map writes
        "model.layers.x.self_attn.q_proj.weight",
        "model.layers..self_attn.q_proj.weight",
        "model.layers.-1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.weight.weight",
        "model.layers.0.self_attn.query_projection.weight",
        "transformer.h.0.attn.c_attn.weight",  # another family's name style
        "",
    ],
)
def test_names_that_map_nowhere(name: str) -> None:
    assert remap_name(name, "qwen3") is None


def test_other_archs_are_not_remapped() -> None:
    assert remap_name("model.layers.0.self_attn.q_proj.weight", "qwen3") == "blk.0.attn_q.weight"
    for arch in ("llama", "qwen2", "qwen35", "qwen35moe"):
        assert remap_name("model.layers.0.self_attn.q_proj.weight", arch) is None


def test_same_alias_maps_per_arch() -> None:
    assert remap_name("model.layers.3.mlp.gate.weight", "qwen3moe") == "blk.3.ffn_gate_inp.weight"
    assert remap_name("model.layers.3.mlp.gate.weight", "qwen3") is None
    assert (
        remap_name("model.layers.10.mlp.experts.down_proj.weight", "qwen3moe")
        == "blk.10.ffn_down_exps.weight"
    )
    assert remap_name("lm_head.weight", "qwen3") == "output.weight"
    assert remap_name("rope.freqs", "qwen3") == "rope_freqs"
    assert remap_name("model.layers.7.self_attn.q_proj.bias", "qwen3") == "blk.7.attn_q.bias"


def test_rendered_header_shape() -> None:
    text = render_cpp_table()
    assert text.startswith("// generated by llamaforge.models.remap_table")
    assert "do not edit" in text.splitlines()[0]
    assert text.endswith("};\n")
    rows = re.findall(
        r'^    \{ "([^"]+)",\s+"([^"]+)",\s+(LLAMA_TENSOR_REMAP_\w+),\s+(0x[0-9a-f]+) \},$', text, re.M
    )
    assert len(rows) == len(remap_rules())
    for (source, target, style, mask), rule in zip(rows, remap_rules(), strict=True):
        assert (source, target) == (rule.source, rule.target)
        assert style.endswith(rule.style.upper())
        assert int(mask, 16) == sum(1 << REMAP_ARCHS.index(a) for a in rule.archs)
    for arch in REMAP_ARCHS:
        assert f"LLM_ARCH_{_model_arch(arch).name}," in text


def test_header_from_patch_needs_the_new_file() -> None:
    with pytest.raises(ValueError, match="does not create"):
        header_from_patch("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
