"""Tiny, deterministic, random-weight GGUF models of real llama.cpp architectures.

Tests and demos need real GGUF files that stock llama.cpp loads and runs, without
downloading anything from a model hub.  This module writes such files with the
``gguf`` package's writer:

* the tokenizer (every ``tokenizer.*`` key, chat template included) is copied from a
  tokenizer-only GGUF such as llama.cpp's ``models/ggml-vocab-qwen2.gguf``;
* the architecture metadata is written the way ``convert_hf_to_gguf.py`` would;
* the weights are small normal noise drawn from a per-tensor RNG that depends only on
  the spec's seed and the tensor's canonical (llama.cpp) name, so the same spec gives a
  byte-identical file and the three name styles hold identical arrays.

Name styles:

``canonical``
    llama.cpp's own names (``blk.0.attn_q.weight``), what stock llama.cpp expects.
``hf``
    Hugging Face transformers names (``model.layers.0.self_attn.q_proj.weight``).
``meta``
    Meta (original LLaMA checkpoint) names (``layers.0.attention.wq.weight``).

The non-canonical names are found by inverting :class:`gguf.TensorNameMap`, so every
name written in the ``hf`` and ``meta`` styles maps back to its canonical name through
that same map.  Stock llama.cpp refuses ``hf``/``meta`` files (it looks tensors up by
canonical name only); they exist to exercise name-translation code.

Supported architectures: ``qwen3``, ``qwen3moe`` and the hybrid Gated-DeltaNet + attention
``qwen35`` and ``qwen35moe`` (layer ``i`` is a recurrent DeltaNet layer unless
``(i + 1) % full_attention_interval == 0``; the tensor set per layer kind, the shapes and the
``ssm.*`` keys follow llama.cpp b11312's ``src/models/qwen35*.cpp`` loaders) and ``gemma2``, whose
even layers attend through a sliding window of ``sliding_window`` tokens (``src/models/gemma2.cpp``: tied
output, post-attention and post-FFN norms, soft-capped logits) and ``gemma3`` (five sliding layers to one
full one, q/k norms; written with its own ``output.weight``, which llama.cpp takes when present).  Adding one
means adding an :class:`_ArchSupport` entry to ``_ARCHS`` (its hyper-parameter keys, which
block tensors each layer holds, shape overrides), shape rules for any new tensor kinds in
``_SHAPES`` and, for tensors not named ``*.weight``, an entry in ``_SUFFIXES``.

The hybrid archs have no ``meta`` names for their DeltaNet tensors (``gguf.TensorNameMap``
lists none), so they support the ``canonical`` and ``hf`` styles only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, get_args

import gguf
import numpy as np
import numpy.typing as npt

__all__ = [
    "SUPPORTED_ARCHS",
    "DType",
    "NameStyle",
    "TensorPlanEntry",
    "TinyModelInfo",
    "TinyModelSpec",
    "canonical_to_styled",
    "noise_array",
    "omitted_tensors",
    "tensor_data",
    "tensor_plan",
    "write_gguf_file",
    "write_noise_model",
    "write_tiny_model",
]

DType = Literal["f16", "f32"]
NameStyle = Literal["canonical", "hf", "meta"]

_DTYPES: Final[tuple[str, ...]] = get_args(DType)
_NAME_STYLES: Final[tuple[str, ...]] = get_args(NameStyle)

#: Standard deviation of the random matrices (keeps activations small and finite).
WEIGHT_SCALE: Final[float] = 0.02

_HASH_CHUNK: Final[int] = 1 << 20


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape and identity of a tiny model; equal specs give byte-identical files.

    ``n_expert``, ``n_expert_used`` and ``n_ff_exp`` are used by MoE architectures
    (``qwen3moe``, ``qwen35moe``) only and ignored otherwise; ``n_ff_shexp`` (shared expert)
    by ``qwen35moe`` only.  The ``ssm_*`` fields and ``full_attention_interval`` are used by
    the hybrid archs (``qwen35``, ``qwen35moe``): ``ssm_state_size`` is the DeltaNet head
    size, ``ssm_group_count`` the number of key heads, ``ssm_time_step_rank`` the number of
    value heads (a multiple of the key heads); the inner size is
    ``ssm_state_size * ssm_time_step_rank``, as in the real checkpoints.  ``sliding_window``
    is the attention window of the sliding-window layers of ``gemma2`` (every even layer) and ``gemma3``
    (five of every six), llama.cpp's default patterns for those archs; ignored otherwise.
    """

    arch: str = "qwen3"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    context_length: int = 4096
    rope_freq_base: float = 1e6
    rms_norm_eps: float = 1e-6
    seed: int = 0
    dtype: DType = "f16"
    name_style: NameStyle = "canonical"
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: int = 32
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16
    ssm_group_count: int = 2
    ssm_time_step_rank: int = 4
    full_attention_interval: int = 2
    sliding_window: int = 64

    def __post_init__(self) -> None:
        if self.arch not in _ARCHS:
            raise ValueError(f"unsupported arch {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, not {self.dtype!r}")
        if self.name_style not in _NAME_STYLES:
            raise ValueError(f"name_style must be one of {_NAME_STYLES}, not {self.name_style!r}")
        for attr in (
            "n_layer",
            "n_embd",
            "n_head",
            "n_head_kv",
            "head_dim",
            "n_ff",
            "context_length",
            "n_expert",
            "n_expert_used",
            "n_ff_exp",
            "n_ff_shexp",
            "ssm_conv_kernel",
            "ssm_state_size",
            "ssm_group_count",
            "ssm_time_step_rank",
            "full_attention_interval",
            "sliding_window",
        ):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{attr} must be a positive int, not {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, not {self.seed!r}")
        if self.n_head % self.n_head_kv != 0:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, not {self.head_dim}")
        if self.n_expert_used > self.n_expert:
            raise ValueError(f"n_expert_used ({self.n_expert_used}) exceeds n_expert ({self.n_expert})")
        if not (self.rope_freq_base > 0 and self.rms_norm_eps > 0):
            raise ValueError("rope_freq_base and rms_norm_eps must be positive")
        if self.name_style not in _ARCHS[self.arch].name_styles:
            raise ValueError(
                f"arch {self.arch!r} supports name styles {_ARCHS[self.arch].name_styles}, "
                f"not {self.name_style!r}"
            )
        if self.ssm_time_step_rank % self.ssm_group_count != 0:
            raise ValueError(
                f"ssm_time_step_rank ({self.ssm_time_step_rank}) must be a multiple of "
                f"ssm_group_count ({self.ssm_group_count})"
            )
        if self.ssm_conv_kernel < 2:
            raise ValueError(f"ssm_conv_kernel must be at least 2, not {self.ssm_conv_kernel}")

    @property
    def ssm_inner_size(self) -> int:
        """DeltaNet inner (value) size: value head size x value heads."""
        return self.ssm_state_size * self.ssm_time_step_rank

    def is_recurrent(self, bid: int) -> bool:
        """True when layer ``bid`` of a hybrid arch is a DeltaNet layer (always False otherwise)."""
        if self.arch not in _HYBRID_ARCHS:
            return False
        return (bid + 1) % self.full_attention_interval != 0

    @property
    def model_arch(self) -> gguf.MODEL_ARCH:
        """The ``gguf.MODEL_ARCH`` member for :attr:`arch`."""
        return _model_arch(self.arch)

    @property
    def default_name(self) -> str:
        """The ``general.name`` written into the file."""
        return f"tiny-{self.arch}-{self.n_layer}L-{self.n_embd}d-seed{self.seed}"


@dataclass(frozen=True)
class TensorPlanEntry:
    """One tensor of a tiny model.

    ``canonical`` is llama.cpp's name (``blk.0.attn_q.weight``), ``name`` the name in the
    spec's style, ``shape`` the numpy shape (the reverse of ggml's ``ne``) and ``dtype``
    the numpy dtype stored in the file.
    """

    canonical: str
    name: str
    kind: gguf.MODEL_TENSOR
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class TinyModelInfo:
    """What :func:`write_tiny_model` wrote."""

    path: Path
    sha256: str
    size: int
    tensor_count: int
    arch: str
    name_style: NameStyle
    n_vocab: int
    tensor_names: tuple[str, ...] = field(default=(), repr=False)


# ------------------------------------------------------------------ architectures


_ShapeFn = Callable[[TinyModelSpec, int], tuple[int, ...]]

_T = gguf.MODEL_TENSOR

# numpy shapes, i.e. ggml ``ne`` reversed: a weight applied as y = W x with
# x of n_in and y of n_out has numpy shape (n_out, n_in).
_SHAPES: Final[Mapping[gguf.MODEL_TENSOR, _ShapeFn]] = {
    _T.TOKEN_EMBD: lambda s, v: (v, s.n_embd),
    _T.OUTPUT: lambda s, v: (v, s.n_embd),
    _T.OUTPUT_NORM: lambda s, v: (s.n_embd,),
    _T.ATTN_NORM: lambda s, v: (s.n_embd,),
    _T.ATTN_Q: lambda s, v: (s.n_head * s.head_dim, s.n_embd),
    _T.ATTN_K: lambda s, v: (s.n_head_kv * s.head_dim, s.n_embd),
    _T.ATTN_V: lambda s, v: (s.n_head_kv * s.head_dim, s.n_embd),
    _T.ATTN_OUT: lambda s, v: (s.n_embd, s.n_head * s.head_dim),
    _T.ATTN_Q_NORM: lambda s, v: (s.head_dim,),
    _T.ATTN_K_NORM: lambda s, v: (s.head_dim,),
    _T.FFN_NORM: lambda s, v: (s.n_embd,),
    _T.FFN_GATE: lambda s, v: (s.n_ff, s.n_embd),
    _T.FFN_UP: lambda s, v: (s.n_ff, s.n_embd),
    _T.FFN_DOWN: lambda s, v: (s.n_embd, s.n_ff),
    _T.FFN_GATE_INP: lambda s, v: (s.n_expert, s.n_embd),
    _T.FFN_GATE_EXP: lambda s, v: (s.n_expert, s.n_ff_exp, s.n_embd),
    _T.FFN_UP_EXP: lambda s, v: (s.n_expert, s.n_ff_exp, s.n_embd),
    _T.FFN_DOWN_EXP: lambda s, v: (s.n_expert, s.n_embd, s.n_ff_exp),
    # hybrid (qwen35*) tensors, as llama-model's qwen35 loader creates them
    _T.ATTN_POST_NORM: lambda s, v: (s.n_embd,),
    _T.ATTN_QKV: lambda s, v: (2 * s.ssm_state_size * s.ssm_group_count + s.ssm_inner_size, s.n_embd),
    _T.ATTN_GATE: lambda s, v: (s.ssm_inner_size, s.n_embd),
    _T.SSM_CONV1D: lambda s, v: (
        2 * s.ssm_state_size * s.ssm_group_count + s.ssm_inner_size,
        s.ssm_conv_kernel,
    ),
    _T.SSM_DT: lambda s, v: (s.ssm_time_step_rank,),
    _T.SSM_A: lambda s, v: (s.ssm_time_step_rank,),
    _T.SSM_BETA: lambda s, v: (s.ssm_time_step_rank, s.n_embd),
    _T.SSM_ALPHA: lambda s, v: (s.ssm_time_step_rank, s.n_embd),
    _T.SSM_NORM: lambda s, v: (s.ssm_state_size,),
    _T.SSM_OUT: lambda s, v: (s.n_embd, s.ssm_inner_size),
    _T.FFN_GATE_INP_SHEXP: lambda s, v: (s.n_embd,),
    _T.FFN_GATE_SHEXP: lambda s, v: (s.n_ff_shexp, s.n_embd),
    _T.FFN_UP_SHEXP: lambda s, v: (s.n_ff_shexp, s.n_embd),
    _T.FFN_DOWN_SHEXP: lambda s, v: (s.n_embd, s.n_ff_shexp),
    # gemma2's extra norms around the attention and the FFN
    _T.FFN_PRE_NORM: lambda s, v: (s.n_embd,),
    _T.FFN_POST_NORM: lambda s, v: (s.n_embd,),
}

# Shape overrides per arch: qwen35's attention layers project the query and its output
# gate in one matrix (2 x n_head x head_dim rows).
_SHAPE_OVERRIDES: Final[Mapping[str, Mapping[gguf.MODEL_TENSOR, _ShapeFn]]] = {
    arch: {_T.ATTN_Q: lambda s, v: (2 * s.n_head * s.head_dim, s.n_embd)} for arch in ("qwen35", "qwen35moe")
}

# Tensors kept in F32 even in an f16 file, as convert_hf_to_gguf.py does (1-D norm
# weights are always F32 there; so is the MoE router).  The DeltaNet convolution stays F32
# too: ggml's CPU ssm_conv takes F32 only.
_ALWAYS_F32: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset(
    {_T.FFN_GATE_INP, _T.FFN_GATE_INP_SHEXP, _T.SSM_CONV1D}
)

# Name suffix per tensor kind where it is not ".weight".
_SUFFIXES: Final[Mapping[gguf.MODEL_TENSOR, str]] = {_T.SSM_A: "", _T.SSM_DT: ".bias"}

# Tensors whose random values are negated: llama.cpp stores ssm_a as -exp(A_log), and a
# positive decay would make the DeltaNet state grow without bound.
_NEGATIVE: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset({_T.SSM_A})

# Tensors that gguf.MODEL_TENSORS lists for an arch but that are optional in llama.cpp
# and absent from real checkpoints of it; tiny models leave them out.
_OPTIONAL: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset({_T.ROPE_FREQS, _T.FFN_GATE_UP_EXP})


def _write_common_hparams(w: gguf.GGUFWriter, s: TinyModelSpec, n_rot: int | None = None) -> None:
    w.add_context_length(s.context_length)
    w.add_block_count(s.n_layer)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim if n_rot is None else n_rot)
    w.add_rope_freq_base(s.rope_freq_base)
    w.add_layer_norm_rms_eps(s.rms_norm_eps)


def _write_moe_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    _write_common_hparams(w, s)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.n_ff_exp)


def _mrope_sections(n_rot: int) -> list[int]:
    """Interleaved-MRoPE sections over ``n_rot / 2`` pairs, split like Qwen3.5's [11, 11, 10, 0]."""
    pairs = n_rot // 2
    base, rem = divmod(pairs, 3)
    return [base + (rem > 0), base + (rem > 1), base, 0]


def _write_hybrid_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    # As convert_hf_to_gguf.py's Qwen3_5 classes: partial rotary factor 0.25, MRoPE
    # sections (a required key in llama.cpp's qwen35 loaders), the DeltaNet ssm.* keys.
    n_rot = max(2, s.head_dim // 4) // 2 * 2
    _write_common_hparams(w, s, n_rot)
    w.add_rope_dimension_sections(_mrope_sections(n_rot))
    w.add_ssm_conv_kernel(s.ssm_conv_kernel)
    w.add_ssm_state_size(s.ssm_state_size)
    w.add_ssm_group_count(s.ssm_group_count)
    w.add_ssm_time_step_rank(s.ssm_time_step_rank)
    w.add_ssm_inner_size(s.ssm_inner_size)
    w.add_full_attention_interval(s.full_attention_interval)


def _write_hybrid_moe_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    _write_hybrid_hparams(w, s)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.n_ff_exp)
    w.add_expert_shared_feed_forward_length(s.n_ff_shexp)


def _write_sliding_window_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    # As convert_hf_to_gguf.py's Gemma2Model: the window and the two soft-caps; no pattern key, so
    # llama.cpp b11312 uses gemma2's default (set_swa_pattern(2): layer i slides when i % 2 == 0).
    _write_common_hparams(w, s)
    w.add_sliding_window(s.sliding_window)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)


def _write_gemma3_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    # As convert_hf_to_gguf.py's Gemma3Model: the window and the local layers' RoPE base; gemma3's default
    # pattern (set_swa_pattern(6): five sliding layers, then one full one).
    _write_common_hparams(w, s)
    w.add_sliding_window(s.sliding_window)
    w.add_rope_freq_base_swa(10000.0)


# Which tensors each kind of hybrid layer holds (llama-model's qwen35 loaders): attention
# layers have separate q (with its gate) / k / v and q/k norms, DeltaNet layers the fused
# qkv, the output gate and the ssm_* tensors; both have the two norms and the FFN.
_ATTENTION_ONLY: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset(
    {_T.ATTN_Q, _T.ATTN_K, _T.ATTN_V, _T.ATTN_OUT, _T.ATTN_Q_NORM, _T.ATTN_K_NORM}
)
_RECURRENT_ONLY: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset(
    {_T.ATTN_QKV, _T.ATTN_GATE, _T.SSM_A, _T.SSM_CONV1D, _T.SSM_DT, _T.SSM_NORM, _T.SSM_BETA,
     _T.SSM_ALPHA, _T.SSM_OUT}
)  # fmt: skip


def _hybrid_block_kinds(s: TinyModelSpec, bid: int) -> frozenset[gguf.MODEL_TENSOR]:
    kinds = frozenset(gguf.MODEL_TENSORS[s.model_arch])
    return kinds - (_ATTENTION_ONLY if s.is_recurrent(bid) else _RECURRENT_ONLY)


@dataclass(frozen=True)
class _ArchSupport:
    """How to write one architecture.

    ``write_hparams`` writes its ``{arch}.*`` keys; ``block_kinds``, when set, says which of
    the arch's block tensors layer ``bid`` holds (default: all of them in every layer);
    ``name_styles`` are the styles whose names ``gguf.TensorNameMap`` covers for it.
    """

    write_hparams: Callable[[gguf.GGUFWriter, TinyModelSpec], None]
    block_kinds: Callable[[TinyModelSpec, int], frozenset[gguf.MODEL_TENSOR]] | None = None
    name_styles: tuple[str, ...] = _NAME_STYLES


_ARCHS: Final[Mapping[str, _ArchSupport]] = {
    "qwen3": _ArchSupport(write_hparams=_write_common_hparams),
    "qwen3moe": _ArchSupport(write_hparams=_write_moe_hparams),
    "qwen35": _ArchSupport(
        write_hparams=_write_hybrid_hparams, block_kinds=_hybrid_block_kinds, name_styles=("canonical", "hf")
    ),
    "qwen35moe": _ArchSupport(
        write_hparams=_write_hybrid_moe_hparams,
        block_kinds=_hybrid_block_kinds,
        name_styles=("canonical", "hf"),
    ),
    "gemma2": _ArchSupport(write_hparams=_write_sliding_window_hparams, name_styles=("canonical", "hf")),
    "gemma3": _ArchSupport(write_hparams=_write_gemma3_hparams, name_styles=("canonical", "hf")),
}

#: Hybrid (Gated-DeltaNet + attention) architectures.
_HYBRID_ARCHS: Final[frozenset[str]] = frozenset({"qwen35", "qwen35moe"})

#: Architectures :func:`write_tiny_model` can write.
SUPPORTED_ARCHS: Final[tuple[str, ...]] = tuple(_ARCHS)


def _model_arch(arch: str) -> gguf.MODEL_ARCH:
    for member, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return member
    raise ValueError(f"the gguf package does not know arch {arch!r}")


def omitted_tensors(arch: str) -> frozenset[gguf.MODEL_TENSOR]:
    """Tensors ``gguf.MODEL_TENSORS[arch]`` lists that tiny models deliberately omit.

    These are optional in llama.cpp for the arch (``rope_freqs`` for qwen3, for example).
    """
    return frozenset(t for t in gguf.MODEL_TENSORS[_model_arch(arch)] if t in _OPTIONAL)


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
    return gguf.TensorNameMap(_model_arch(arch), n_layer)


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


# ------------------------------------------------------------------------- weights


def tensor_plan(spec: TinyModelSpec, n_vocab: int) -> list[TensorPlanEntry]:
    """The tensors of ``spec`` in file order, for a tokenizer of ``n_vocab`` tokens.

    The set is ``gguf.MODEL_TENSORS[arch]`` minus :func:`omitted_tensors`; the order is
    ``token_embd``, the blocks (each in ``MODEL_TENSORS`` order), then the remaining
    global tensors, as ``convert_hf_to_gguf.py`` writes them.
    """
    if n_vocab <= 0:
        raise ValueError(f"n_vocab must be positive, not {n_vocab}")
    kinds = [k for k in gguf.MODEL_TENSORS[spec.model_arch] if k not in _OPTIONAL]
    missing = [gguf.TENSOR_NAMES[k] for k in kinds if k not in _SHAPES]
    if missing:
        raise ValueError(f"no shape rule for {spec.arch} tensors {missing}")
    block_kinds = [k for k in kinds if "{bid}" in gguf.TENSOR_NAMES[k]]
    global_kinds = [k for k in kinds if "{bid}" not in gguf.TENSOR_NAMES[k]]
    first = [k for k in global_kinds if k == _T.TOKEN_EMBD]
    last = [k for k in global_kinds if k != _T.TOKEN_EMBD]

    float_dtype: np.dtype[Any] = np.dtype(np.float16 if spec.dtype == "f16" else np.float32)
    f32: np.dtype[Any] = np.dtype(np.float32)

    def entry(kind: gguf.MODEL_TENSOR, bid: int | None) -> TensorPlanEntry:
        template = gguf.TENSOR_NAMES[kind]
        suffix = _SUFFIXES.get(kind, ".weight")
        canonical = (template.format(bid=bid) if bid is not None else template) + suffix
        shape = _SHAPE_OVERRIDES.get(spec.arch, {}).get(kind, _SHAPES[kind])(spec, n_vocab)
        dtype = f32 if len(shape) == 1 or kind in _ALWAYS_F32 else float_dtype
        name = canonical_to_styled(canonical, spec.arch, spec.n_layer, spec.name_style)
        return TensorPlanEntry(canonical=canonical, name=name, kind=kind, shape=shape, dtype=dtype)

    layer_kinds = _ARCHS[spec.arch].block_kinds
    plan = [entry(k, None) for k in first]
    for bid in range(spec.n_layer):
        held = layer_kinds(spec, bid) if layer_kinds is not None else None
        plan.extend(entry(k, bid) for k in block_kinds if held is None or k in held)
    plan.extend(entry(k, None) for k in last)
    return plan


def tensor_data(spec: TinyModelSpec, entry: TensorPlanEntry) -> npt.NDArray[Any]:
    """The deterministic array for one tensor.

    It depends on ``spec.seed``, the tensor's canonical name, shape and dtype only (never
    on the name style).  1-D weights (norms, ``ssm_dt``, the shared-expert gate) are
    ``1 + noise``, ``ssm_a`` is ``-(1 + noise)`` (a decaying DeltaNet state), everything else
    ``noise``, with noise ~ N(0, WEIGHT_SCALE^2).
    """
    return noise_array(spec.seed, entry.canonical, entry.shape, entry.dtype, negative=entry.kind in _NEGATIVE)


def noise_array(
    seed: int, canonical: str, shape: tuple[int, ...], dtype: np.dtype[Any], *, negative: bool = False
) -> npt.NDArray[Any]:
    """``noise`` (``1 + noise`` for 1-D tensors, negated with ``negative``) from an RNG seeded by ``seed`` and
    the tensor's canonical name: the weights of every tiny-model writer."""
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()
    seq = np.random.SeedSequence([seed, int.from_bytes(digest[:8], "little")])
    rng = np.random.default_rng(seq)
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(WEIGHT_SCALE)
    if len(shape) == 1:
        values += np.float32(1.0)
    if negative:
        values = -values
    return np.ascontiguousarray(values.astype(dtype))


# ----------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class _KV:
    key: str
    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None


def _load_tokenizer(vocab_gguf: Path) -> tuple[tuple[_KV, ...], int]:
    st = vocab_gguf.stat()
    return _load_tokenizer_cached(str(vocab_gguf.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _load_tokenizer_cached(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[_KV, ...], int]:
    reader = gguf.GGUFReader(path)
    kvs: list[_KV] = []
    n_vocab = 0
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = fld.types[0]
        sub_type: gguf.GGUFValueType | None = None
        value: Any = fld.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub_type = fld.types[-1]
            if len(fld.types) != 2:
                raise ValueError(f"{path}: nested array {key!r} is not supported")
            value = tuple(value)
        kvs.append(_KV(key=key, value=value, vtype=vtype, sub_type=sub_type))
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if n_vocab == 0:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens array; not a tokenizer GGUF?")
    return tuple(kvs), n_vocab


# -------------------------------------------------------------------------- writer


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_tiny_model(path: Path, spec: TinyModelSpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write the tiny model ``spec`` to ``path`` with the tokenizer of ``vocab_gguf``.

    ``vocab_gguf`` is a tokenizer-only GGUF (llama.cpp's ``models/ggml-vocab-qwen2.gguf``
    for the Qwen archs); all its ``tokenizer.*`` keys are copied, and the vocabulary size
    sets the embedding and output shapes.  The file is written to a temporary file in the
    same directory and renamed over ``path`` atomically.  Equal specs and vocab files give
    byte-identical output.
    """
    tokenizer_kvs, n_vocab = _load_tokenizer(Path(vocab_gguf))
    plan = tensor_plan(spec, n_vocab)
    support = _ARCHS[spec.arch]
    info = write_gguf_file(
        Path(path), spec.arch, spec.default_name, spec.dtype, lambda w: support.write_hparams(w, spec),
        tokenizer_kvs, ((item.name, tensor_data(spec, item)) for item in plan),
    )  # fmt: skip
    return dataclasses.replace(info, tensor_count=len(plan), name_style=spec.name_style, n_vocab=n_vocab)


def write_gguf_file(
    path: Path,
    arch: str,
    name: str,
    dtype: DType,
    write_hparams: Callable[[gguf.GGUFWriter], None],
    tokenizer_kvs: Iterable[_KV],
    tensors: Iterable[tuple[str, npt.NDArray[Any]]],
) -> TinyModelInfo:
    """Write a tiny model's GGUF (general keys, the arch's keys, the tokenizer, the tensors) to a temporary file
    beside ``path`` and rename it over ``path`` atomically; shared by every tiny-model writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    names: list[str] = []
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            writer.add_type(gguf.GGUFType.MODEL)
            writer.add_name(name)
            writer.add_description(
                "tiny random-weight test model written by llamaforge.gguf.tiny; not trained"
            )
            writer.add_file_type(
                gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
            )
            write_hparams(writer)
            for kv in tokenizer_kvs:
                writer.add_key_value(kv.key, kv.value, kv.vtype, sub_type=kv.sub_type)
            for tensor_name, data in tensors:
                writer.add_tensor(tensor_name, data)
                names.append(tensor_name)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        tmp.chmod(0o644)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return TinyModelInfo(
        path=path, sha256=_file_sha256(path), size=path.stat().st_size, tensor_count=len(names), arch=arch,
        name_style="canonical", n_vocab=0, tensor_names=tuple(names),
    )  # fmt: skip


Shapes = Callable[[int], Iterable[tuple[str, tuple[int, ...]]]]


def write_noise_model(
    path: Path,
    arch: str,
    name: str,
    dtype: DType,
    seed: int,
    write_hparams: Callable[[gguf.GGUFWriter], None],
    shapes: Shapes,
    vocab_gguf: Path,
) -> TinyModelInfo:
    """Write a model whose tensors are ``shapes(n_vocab)`` (name and numpy shape, in file order) filled with
    :func:`noise_array` (F32 for 1-D tensors, ``dtype`` for the rest), with the tokenizer of ``vocab_gguf``:
    the writers of the families laid out by hand (``tiny_mla``, ``tiny_shared_kv``)."""
    tokenizer_kvs, n_vocab = _load_tokenizer(Path(vocab_gguf))
    matrix: np.dtype[Any] = np.dtype(np.float16 if dtype == "f16" else np.float32)
    vector: np.dtype[Any] = np.dtype(np.float32)
    tensors = (
        (tensor, noise_array(seed, tensor, shape, vector if len(shape) == 1 else matrix))
        for tensor, shape in shapes(n_vocab)
    )
    info = write_gguf_file(Path(path), arch, name, dtype, write_hparams, tokenizer_kvs, tensors)
    return dataclasses.replace(info, n_vocab=n_vocab)
