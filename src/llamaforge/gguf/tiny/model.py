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

Supported architectures: ``qwen2`` (Qwen2/2.5: no Q/K norms; the optional Q/K/V biases left out), ``qwen3``,
``qwen3moe`` and the hybrid Gated-DeltaNet + attention
``qwen35`` and ``qwen35moe`` (layer ``i`` is a recurrent DeltaNet layer unless
``(i + 1) % full_attention_interval == 0``; the tensor set per layer kind, the shapes and the
``ssm.*`` keys follow llama.cpp b11312's ``src/models/qwen35*.cpp`` loaders), ``qwen3next`` (qwen35moe's
layout with the DeltaNet input fused: ``ssm_in``, ``ssm_ba``; no MRoPE; llama.cpp's names only) and ``gemma2``, whose
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, get_args

import gguf
import numpy as np
import numpy.typing as npt

from llamaforge.gguf.tiny.file import (
    DType,
    TinyModelInfo,
    load_tokenizer,
    matrix_dtype,
    noise_array,
    write_gguf_file,
    write_noise_model,
)
from llamaforge.gguf.tiny.names import NameStyle, canonical_to_styled, model_arch

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


_DTYPES: Final[tuple[str, ...]] = get_args(DType)
_NAME_STYLES: Final[tuple[str, ...]] = get_args(NameStyle)


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
        if self.arch == "qwen2" and self.n_head * self.head_dim != self.n_embd:
            # llama.cpp's qwen2 loader sizes Q and the output projection n_embd x n_embd
            raise ValueError(
                f"qwen2 needs n_head x head_dim == n_embd ({self.n_embd}), not {self.n_head} x {self.head_dim}"
            )
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
        return model_arch(self.arch)

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
    # qwen3next's DeltaNet input: Q, K, V and the output gate Z in one matrix, beta and alpha in another
    _T.SSM_IN: lambda s, v: (2 * s.ssm_state_size * s.ssm_group_count + 2 * s.ssm_inner_size, s.n_embd),
    _T.SSM_BETA_ALPHA: lambda s, v: (2 * s.ssm_time_step_rank, s.n_embd),
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
    arch: {_T.ATTN_Q: lambda s, v: (2 * s.n_head * s.head_dim, s.n_embd)}
    for arch in ("qwen35", "qwen35moe", "qwen3next")
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
    # As convert_hf_to_gguf.py's Qwen3_5 and Qwen3Next classes: partial rotary factor 0.25, MRoPE
    # sections (a required key in llama.cpp's qwen35 loaders; qwen3next has none), the DeltaNet ssm.* keys.
    n_rot = max(2, s.head_dim // 4) // 2 * 2
    _write_common_hparams(w, s, n_rot)
    if s.arch != "qwen3next":
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
    # llama.cpp uses gemma2's default (set_swa_pattern(2): layer i slides when i % 2 == 0).
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
    {
        _T.ATTN_QKV,
        _T.ATTN_GATE,
        _T.SSM_IN,
        _T.SSM_BETA_ALPHA,
        _T.SSM_A,
        _T.SSM_CONV1D,
        _T.SSM_DT,
        _T.SSM_NORM,
        _T.SSM_BETA,
        _T.SSM_ALPHA,
        _T.SSM_OUT,
    }
)


def _hybrid_block_kinds(s: TinyModelSpec, bid: int) -> frozenset[gguf.MODEL_TENSOR]:
    kinds = frozenset(gguf.MODEL_TENSORS[s.model_arch])
    return kinds - (_ATTENTION_ONLY if s.is_recurrent(bid) else _RECURRENT_ONLY)


def _qwen3next_block_kinds(s: TinyModelSpec, bid: int) -> frozenset[gguf.MODEL_TENSOR]:
    # convert_hf_to_gguf.py writes Qwen3-Next's DeltaNet input fused (ssm_in: in_proj_qkvz, ssm_beta_alpha:
    # in_proj_ba); llama.cpp's loader also takes the split attn_qkv + attn_gate, which qwen35 files hold
    return _hybrid_block_kinds(s, bid) - {_T.ATTN_QKV, _T.ATTN_GATE}


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
    "qwen2": _ArchSupport(write_hparams=_write_common_hparams),  # Qwen2/2.5: no Q/K norms, biases left out
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
    "qwen3next": _ArchSupport(
        write_hparams=_write_hybrid_moe_hparams,
        block_kinds=_qwen3next_block_kinds,
        name_styles=("canonical",),
    ),
    "gemma2": _ArchSupport(write_hparams=_write_sliding_window_hparams, name_styles=("canonical", "hf")),
    "gemma3": _ArchSupport(write_hparams=_write_gemma3_hparams, name_styles=("canonical", "hf")),
}

#: Hybrid (Gated-DeltaNet + attention) architectures.
_HYBRID_ARCHS: Final[frozenset[str]] = frozenset({"qwen35", "qwen35moe", "qwen3next"})

#: Architectures :func:`write_tiny_model` can write.
SUPPORTED_ARCHS: Final[tuple[str, ...]] = tuple(_ARCHS)


def omitted_tensors(arch: str) -> frozenset[gguf.MODEL_TENSOR]:
    """Tensors ``gguf.MODEL_TENSORS[arch]`` lists that tiny models deliberately omit.

    These are optional in llama.cpp for the arch (``rope_freqs`` for qwen3, for example).
    """
    return frozenset(t for t in gguf.MODEL_TENSORS[model_arch(arch)] if t in _OPTIONAL)


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

    float_dtype = matrix_dtype(spec.dtype)
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


def write_tiny_model(path: Path, spec: TinyModelSpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write the tiny model ``spec`` to ``path`` with the tokenizer of ``vocab_gguf``.

    ``vocab_gguf`` is a tokenizer-only GGUF (llama.cpp's ``models/ggml-vocab-qwen2.gguf``
    for the Qwen archs); all its ``tokenizer.*`` keys are copied, and the vocabulary size
    sets the embedding and output shapes.  The file is written to a temporary file in the
    same directory and renamed over ``path`` atomically.  Equal specs and vocab files give
    byte-identical output.
    """
    tokenizer_kvs, n_vocab = load_tokenizer(Path(vocab_gguf))
    plan = tensor_plan(spec, n_vocab)
    support = _ARCHS[spec.arch]
    info = write_gguf_file(
        Path(path),
        spec.arch,
        spec.default_name,
        spec.dtype,
        lambda w: support.write_hparams(w, spec),
        tokenizer_kvs,
        ((item.name, tensor_data(spec, item)) for item in plan),
    )
    return dataclasses.replace(info, tensor_count=len(plan), name_style=spec.name_style, n_vocab=n_vocab)
