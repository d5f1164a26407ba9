"""The tensor-name table of the qwen3 remap patch, generated from ``gguf.TensorNameMap``.

GGUF files made by third-party converters sometimes keep Hugging Face names
(``model.layers.0.self_attn.q_proj.weight``) or Meta names (``layers.0.attention.wq.weight``)
instead of llama.cpp's (``blk.0.attn_q.weight``), and stock llama.cpp refuses them.  The patch
``patches/llama.cpp/0001-qwen3-tensor-name-remap.patch`` teaches the model loader to rename such
tensors for the qwen3 family; its table lives in a generated header, ``src/llama-tensor-remap.h``,
whose exact text is :func:`render_cpp_table`.  A test keeps the header in the patch equal to it.

The table is the part of ``gguf.TensorNameMap(arch, n)`` that concerns the two name styles, written
as patterns: ``{bid}`` stands for a block number (``model.layers.{bid}.self_attn.q_proj`` →
``blk.{bid}.attn_q``) and names carry no ``.weight``/``.bias`` suffix.  A name is looked up as
``TensorNameMap.get_name(name, try_suffixes=(".weight", ".bias"))`` does it: first whole, then
without its suffix, which is put back on the canonical name.  :func:`remap_name` is the Python
twin of the C++ lookup, rule order included.

Styles, by the first dotted component of the name:

``hf``
    ``model.*`` and ``lm_head*``: Hugging Face transformers module paths.
``meta``
    ``layers.*``, ``tok_embeddings``, ``norm``, ``output``, ``rope.freqs``: Meta's original
    checkpoint layout (LLaMA, Mixtral).

Other aliases the map knows (``transformer.h.*``, ``gpt_neox.*``, ...) belong to other model
families and are left out, and so is any alias that is itself a canonical name (a file with
llama.cpp's names is never touched).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

import gguf
from gguf.tensor_mapping import TensorNameMap

__all__ = [
    "HEADER_PATH",
    "REMAP_ARCHS",
    "RemapRule",
    "RemapStyle",
    "alias_style",
    "arch_rules",
    "header_from_patch",
    "remap_name",
    "remap_rules",
    "render_cpp_table",
]

RemapStyle = Literal["hf", "meta"]

#: Architectures the patch remaps, in the order of the header's arch bits.  qwen35/qwen35moe are
#: left out on purpose: convert_hf_to_gguf.py changes their values, not just names (A_log becomes
#: -exp(A_log), most norms get +1, linear-attention V heads are reordered), so a file that kept HF
#: names may hold unconverted values, and renaming it would load garbage where stock fails loudly.
#: For qwen3/qwen3moe the conversion is names only (plus stacking experts, which a GGUF needs anyway).
REMAP_ARCHS: Final[tuple[str, ...]] = ("qwen3", "qwen3moe")

#: Where the generated header sits in the llama.cpp tree (and in the patch).
HEADER_PATH: Final[str] = "src/llama-tensor-remap.h"

_BID: Final[str] = "{bid}"
_SUFFIXES: Final[tuple[str, ...]] = (".weight", ".bias")
_HF_ROOTS: Final[frozenset[str]] = frozenset({"model", "lm_head"})
_META_ROOTS: Final[frozenset[str]] = frozenset({"layers", "tok_embeddings", "norm", "output", "rope"})
_CPP_STYLE: Final[Mapping[RemapStyle, str]] = {
    "hf": "LLAMA_TENSOR_REMAP_HF",
    "meta": "LLAMA_TENSOR_REMAP_META",
}

# TensorNameMap.__init__ merges an arch's block overrides into the class-level block table in
# place, so building a map for one arch changes later maps for every other arch.  Copy the
# tables at import, before anything in this process has built a map for an overriding arch.
_GLOBAL_CFG: Final = dict(TensorNameMap.mappings_cfg)
_BLOCK_CFG: Final = dict(TensorNameMap.block_mappings_cfg)
_ARCH_BLOCK_CFG: Final = {arch: dict(cfg) for arch, cfg in TensorNameMap.arch_block_mappings_cfg.items()}


@dataclass(frozen=True)
class RemapRule:
    """One row of the table: ``source`` (an alias pattern) becomes ``target`` for ``archs``."""

    source: str
    target: str
    style: RemapStyle
    archs: tuple[str, ...]


def _model_arch(arch: str) -> gguf.MODEL_ARCH:
    for member, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return member
    raise ValueError(f"the gguf package does not know arch {arch!r}")


def alias_style(alias: str) -> RemapStyle | None:
    """The name style of ``alias`` (``hf``, ``meta``), or ``None`` for other model families."""
    root = alias.split(".", 1)[0]
    if root in _HF_ROOTS:
        return "hf"
    if root in _META_ROOTS:
        return "meta"
    return None


@functools.cache
def _canonical_patterns() -> frozenset[str]:
    return frozenset(gguf.TENSOR_NAMES.values())


@functools.cache
def _map_patterns(arch: str) -> Mapping[str, str]:
    """Every alias pattern ``TensorNameMap(arch, n)`` knows, to its canonical pattern.

    Built in the map's own order, so where two tensors list the same alias the later one
    wins, as it does in ``TensorNameMap.mapping``.
    """
    model_arch = _model_arch(arch)
    tensors = frozenset(gguf.MODEL_TENSORS[model_arch])
    patterns: dict[str, str] = {}
    for tensor, keys in _GLOBAL_CFG.items():
        if tensor in tensors:
            canonical = gguf.TENSOR_NAMES[tensor]
            patterns[canonical] = canonical
            patterns.update(dict.fromkeys(keys, canonical))
    for tensor, keys in {**_BLOCK_CFG, **_ARCH_BLOCK_CFG.get(model_arch, {})}.items():
        if tensor in tensors:
            canonical = gguf.TENSOR_NAMES[tensor]
            patterns[canonical] = canonical
            patterns.update(dict.fromkeys(keys, canonical))
    return patterns


@functools.cache
def arch_rules(arch: str) -> Mapping[str, tuple[str, RemapStyle]]:
    """The table for one arch: alias pattern → (canonical pattern, style).

    Only hf/meta aliases; never an alias that is a canonical name, carries a ``.weight``/``.bias``
    suffix of its own, or has a ``{bid}`` placeholder where its canonical name has none (or the
    other way round).
    """
    rules: dict[str, tuple[str, RemapStyle]] = {}
    for source, target in _map_patterns(arch).items():
        style = alias_style(source)
        if (
            style is None
            or source in _canonical_patterns()
            or source.endswith(_SUFFIXES)
            or source.count(_BID) != target.count(_BID)
            or source.count(_BID) > 1
            or source.replace(_BID, "").count("{") > 0
        ):
            continue
        rules[source] = (target, style)
    return rules


@functools.cache
def remap_rules(archs: tuple[str, ...] = REMAP_ARCHS) -> tuple[RemapRule, ...]:
    """All rows of the table for ``archs``, merged across archs and sorted (target, style, source).

    The same alias may appear twice with different targets for disjoint arch sets
    (``model.layers.{bid}.post_attention_layernorm`` is ``ffn_norm`` in qwen3 and
    ``post_attention_norm`` in qwen35).
    """
    merged: dict[tuple[str, str, RemapStyle], list[str]] = {}
    for arch in archs:
        for source, (target, style) in arch_rules(arch).items():
            merged.setdefault((source, target, style), []).append(arch)
    rows = [RemapRule(source=s, target=t, style=st, archs=tuple(a)) for (s, t, st), a in merged.items()]
    rows.sort(key=lambda r: (r.target, r.style, r.source))
    return tuple(rows)


def _match(pattern: str, base: str) -> str | None:
    """The block number text if ``base`` matches ``pattern`` (``""`` for a pattern without one)."""
    hole = pattern.find(_BID)
    if hole < 0:
        return "" if base == pattern else None
    prefix, suffix = pattern[:hole], pattern[hole + len(_BID) :]
    if len(base) <= len(prefix) + len(suffix) or not (base.startswith(prefix) and base.endswith(suffix)):
        return None
    bid = base[len(prefix) : len(base) - len(suffix)]
    # str.format never writes a sign or leading zeros, so "07" is not block 7 for the map either.
    if not (bid.isascii() and bid.isdigit()) or (len(bid) > 1 and bid[0] == "0"):
        return None
    return bid


def remap_name(name: str, arch: str) -> str | None:
    """The canonical name the patched loader gives tensor ``name`` in an ``arch`` file, else ``None``.

    Mirrors the C++ lookup: the whole name first, then without ``.weight``/``.bias``; the first
    rule (in :func:`remap_rules` order) whose pattern matches wins.
    """
    if arch not in REMAP_ARCHS:
        return None
    for suffix in ("", *_SUFFIXES):
        if suffix and not name.endswith(suffix):
            continue
        base = name[: len(name) - len(suffix)] if suffix else name
        if not base:
            continue
        for rule in remap_rules():
            if arch not in rule.archs:
                continue
            bid = _match(rule.source, base)
            if bid is not None:
                return rule.target.replace(_BID, bid) + suffix
    return None


def _cpp_string(text: str) -> str:
    if any(ch in text for ch in '"\\') or not text.isascii() or not text.isprintable():
        raise ValueError(f"tensor name {text!r} cannot be written as a plain C string")
    return f'"{text}"'


def _arch_mask(archs: Iterable[str]) -> str:
    mask = 0
    for arch in archs:
        mask |= 1 << REMAP_ARCHS.index(arch)
    return f"0x{mask:02x}"


def render_cpp_table() -> str:
    """The exact text of ``src/llama-tensor-remap.h`` as the patch carries it."""
    rules = remap_rules()
    gguf_version = importlib.metadata.version("gguf")
    width = max(len(_cpp_string(r.source)) for r in rules) + 1
    target_width = max(len(_cpp_string(r.target)) for r in rules) + 1
    style_width = max(len(v) for v in _CPP_STYLE.values()) + 1
    bits = "\n".join(
        f"//   bit {i}: {arch:<10} LLM_ARCH_{_model_arch(arch).name}" for i, arch in enumerate(REMAP_ARCHS)
    )
    archs = "\n".join(f"    LLM_ARCH_{_model_arch(arch).name}," for arch in REMAP_ARCHS)
    rows = "\n".join(
        "    { "
        + f"{_cpp_string(r.source) + ',':<{width}} "
        + f"{_cpp_string(r.target) + ',':<{target_width}} "
        + f"{_CPP_STYLE[r.style] + ',':<{style_width}} "
        + f"{_arch_mask(r.archs)} }},"
        for r in rules
    )
    n_hf = sum(1 for r in rules if r.style == "hf")
    return f"""\
// generated by llamaforge.models.remap_table from gguf {gguf_version} TensorNameMap; do not edit
// (regenerate with: python -c "import llamaforge.models.remap_table as t; print(t.render_cpp_table(), end='')")
#pragma once

#include "llama-arch.h"

#include <cstdint>

// Hugging Face-style and Meta-style tensor names that GGUF files of the qwen3 family made by
// third-party converters may carry, and the llama.cpp names they stand for. "{{bid}}" stands for a
// block number; names carry no ".weight"/".bias" suffix: the loader looks a name up whole, then
// without its suffix, and keeps the suffix. The first matching rule wins.
// {len(rules)} rules: {n_hf} Hugging Face-style, {len(rules) - n_hf} Meta-style.

enum llama_tensor_remap_style : uint8_t {{
    LLAMA_TENSOR_REMAP_HF   = 0,
    LLAMA_TENSOR_REMAP_META = 1,
}};

struct llama_tensor_remap_rule {{
    const char *             source; // alias pattern
    const char *             target; // llama.cpp name pattern
    llama_tensor_remap_style style;
    uint32_t                 archs;  // bit i: applies to LLAMA_TENSOR_REMAP_ARCHS[i]
}};

// arch bits:
{bits}
static const llm_arch LLAMA_TENSOR_REMAP_ARCHS[] = {{
{archs}
}};

static const llama_tensor_remap_rule LLAMA_TENSOR_REMAP_RULES[] = {{
{rows}
}};
"""


def header_from_patch(patch_text: str, path: str = HEADER_PATH) -> str:
    """The content of new file ``path`` as a unified diff (``git diff``) creates it.

    Raises :class:`ValueError` when the patch does not create ``path``.
    """
    lines: list[str] | None = None
    in_hunk = False
    for line in patch_text.splitlines():
        if line.startswith("diff --git "):
            if lines is not None:
                break
            in_hunk = False
            continue
        if line.startswith("+++ "):
            target = line[4:].strip()
            if target in (f"b/{path}", path):
                lines = []
            continue
        if lines is None:
            continue
        if line.startswith("@@ "):
            in_hunk = True
            continue
        if in_hunk and line.startswith("+"):
            lines.append(line[1:])
        elif in_hunk and line.startswith("\\"):
            continue
        elif in_hunk:
            raise ValueError(f"{path} is not a new file in the patch (line {line!r})")
    if lines is None:
        raise ValueError(f"the patch does not create {path}")
    return "\n".join(lines) + "\n"
