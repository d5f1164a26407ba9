"""Tensor names of the tiny models in the three styles: llama.cpp's own (``canonical``), Hugging Face
transformers' (``hf``) and Meta's original checkpoints' (``meta``), found by inverting :class:`gguf.TensorNameMap`
so every styled name maps back to its canonical one through that same map."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final, Literal

import gguf

NameStyle = Literal["canonical", "hf", "meta"]


def model_arch(arch: str) -> gguf.MODEL_ARCH:
    """The gguf package's enum member of the arch called ``arch``."""
    for member, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return member
    raise ValueError(f"the gguf package does not know arch {arch!r}")


# --------------------------------------------------------------------- name styles

# Preferred source names per style, as ``gguf.TensorNameMap`` spells them (without the
# ``.weight`` suffix, ``{bid}`` for the block).  A preference is used only when the map
# lists it as an alias of the canonical tensor, so each chosen name is guaranteed to map
# back; a tensor with no listed preference gets the first alias the map gives that has the
# style's prefix.  The hf list follows transformers' Qwen3 / Qwen3-MoE module names
# (experts stacked into one tensor, as llama.cpp stores them); the meta list follows the
# original LLaMA / Mixtral checkpoints.
_PREFERRED: Final[Mapping[str, tuple[str, ...]]] = {
    "hf": (
        "model.embed_tokens",
        "model.norm",
        "lm_head",
        "model.layers.{bid}.input_layernorm",
        "model.layers.{bid}.post_attention_layernorm",
        "model.layers.{bid}.self_attn.q_proj",
        "model.layers.{bid}.self_attn.k_proj",
        "model.layers.{bid}.self_attn.v_proj",
        "model.layers.{bid}.self_attn.o_proj",
        "model.layers.{bid}.self_attn.q_norm",
        "model.layers.{bid}.self_attn.k_norm",
        "model.layers.{bid}.mlp.gate_proj",
        "model.layers.{bid}.mlp.up_proj",
        "model.layers.{bid}.mlp.down_proj",
        "model.layers.{bid}.mlp.gate",
        "model.layers.{bid}.mlp.experts.gate_proj",
        "model.layers.{bid}.mlp.experts.up_proj",
        "model.layers.{bid}.mlp.experts.down_proj",
        # Qwen3.5 (Gated DeltaNet) module names
        "model.layers.{bid}.linear_attn.in_proj_z",
        "model.layers.{bid}.linear_attn.A_log",
        "model.layers.{bid}.linear_attn.conv1d",
        "model.layers.{bid}.linear_attn.dt_proj",
        "model.layers.{bid}.linear_attn.norm",
        "model.layers.{bid}.linear_attn.in_proj_a",
        "model.layers.{bid}.linear_attn.in_proj_b",
        "model.layers.{bid}.linear_attn.out_proj",
        "model.layers.{bid}.mlp.shared_expert_gate",
        "model.layers.{bid}.mlp.shared_expert.gate_proj",
        "model.layers.{bid}.mlp.shared_expert.up_proj",
        "model.layers.{bid}.mlp.shared_expert.down_proj",
        # Gemma 2 norms
        "model.layers.{bid}.pre_feedforward_layernorm",
        "model.layers.{bid}.post_feedforward_layernorm",
    ),
    "meta": (
        "tok_embeddings",
        "norm",
        "output",
        "layers.{bid}.attention_norm",
        "layers.{bid}.ffn_norm",
        "layers.{bid}.attention.wq",
        "layers.{bid}.attention.wk",
        "layers.{bid}.attention.wv",
        "layers.{bid}.attention.wo",
        "layers.{bid}.feed_forward.w1",
        "layers.{bid}.feed_forward.w2",
        "layers.{bid}.feed_forward.w3",
        "layers.{bid}.feed_forward.gate",
        "layers.{bid}.feed_forward.experts.w1",
        "layers.{bid}.feed_forward.experts.w2",
        "layers.{bid}.feed_forward.experts.w3",
    ),
}


def _style_prefix_ok(style: str, alias: str, bid: int | None) -> bool:
    if style == "hf":
        if bid is not None:
            return alias.startswith(f"model.layers.{bid}.")
        return alias.startswith(("model.", "lm_head"))
    # meta
    if bid is not None:
        return alias.startswith(f"layers.{bid}.")
    return not alias.startswith(("model.", "transformer.", "lm_head"))


@functools.lru_cache(maxsize=16)
def _name_map(arch: str, n_layer: int) -> gguf.TensorNameMap:
    return gguf.TensorNameMap(model_arch(arch), n_layer)


@functools.lru_cache(maxsize=16)
def _aliases(arch: str, n_layer: int) -> Mapping[str, tuple[str, ...]]:
    inverse: dict[str, list[str]] = {}
    for alias, (_kind, canonical) in _name_map(arch, n_layer).mapping.items():
        inverse.setdefault(canonical, []).append(alias)
    return {k: tuple(v) for k, v in inverse.items()}


def _split_weight(name: str) -> tuple[str, str]:
    for suffix in (".weight", ".bias"):
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def _block_id(base: str) -> int | None:
    parts = base.split(".")
    if len(parts) >= 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None


def canonical_to_styled(canonical: str, arch: str, n_layer: int, style: NameStyle) -> str:
    """Translate llama.cpp's tensor name into ``style`` (``canonical``, ``hf``, ``meta``).

    The answer is an alias that ``gguf.TensorNameMap(arch, n_layer)`` maps back to
    ``canonical``; :class:`ValueError` if the map holds none for the style.
    """
    if style == "canonical":
        return canonical
    if style not in _PREFERRED:
        raise ValueError(f"unknown name style {style!r}")
    base, suffix = _split_weight(canonical)
    candidates = _aliases(arch, n_layer).get(base, ())
    bid = _block_id(base)
    chosen: str | None = None
    for template in _PREFERRED[style]:
        alias = template.format(bid=bid) if bid is not None else template
        if "{bid}" in template and bid is None:
            continue
        if alias in candidates:
            chosen = alias
            break
    if chosen is None:
        for alias in candidates:
            if alias != base and _style_prefix_ok(style, alias, bid):
                chosen = alias
                break
    if chosen is None:
        raise ValueError(f"gguf.TensorNameMap has no {style} alias for {canonical!r} ({arch})")
    styled = chosen + suffix
    back = _name_map(arch, n_layer).get_name(styled, try_suffixes=(".weight", ".bias"))
    if back != canonical:  # pragma: no cover - guards against gguf map changes
        raise ValueError(f"{styled!r} maps to {back!r}, not {canonical!r}")
    return styled
