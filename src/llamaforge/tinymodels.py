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

Supported architectures: ``qwen3`` and ``qwen3moe``.  Adding one (``qwen35`` say) means
adding an :class:`_ArchSupport` entry to ``_ARCHS`` (its hyper-parameter keys, and which
block tensors each layer holds: hybrid archs alternate recurrent and attention layers),
shape rules for any new tensor kinds in ``_SHAPES`` and, for tensors not named
``*.weight`` (``ssm_a``, ``ssm_dt.bias``), an entry in ``_SUFFIXES``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
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
    "omitted_tensors",
    "tensor_data",
    "tensor_plan",
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
    (``qwen3moe``) only and ignored otherwise.
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
}

# Tensors kept in F32 even in an f16 file, as convert_hf_to_gguf.py does (1-D norm
# weights are always F32 there; so is the MoE router).
_ALWAYS_F32: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset({_T.FFN_GATE_INP})

# Name suffix per tensor kind where it is not ".weight" (none for qwen3/qwen3moe).
_SUFFIXES: Final[Mapping[gguf.MODEL_TENSOR, str]] = {}

# Tensors that gguf.MODEL_TENSORS lists for an arch but that are optional in llama.cpp
# and absent from real checkpoints of it; tiny models leave them out.
_OPTIONAL: Final[frozenset[gguf.MODEL_TENSOR]] = frozenset({_T.ROPE_FREQS})


def _write_common_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    w.add_context_length(s.context_length)
    w.add_block_count(s.n_layer)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_freq_base)
    w.add_layer_norm_rms_eps(s.rms_norm_eps)


def _write_moe_hparams(w: gguf.GGUFWriter, s: TinyModelSpec) -> None:
    _write_common_hparams(w, s)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.n_ff_exp)


@dataclass(frozen=True)
class _ArchSupport:
    """How to write one architecture.

    ``write_hparams`` writes its ``{arch}.*`` keys; ``block_kinds``, when set, says which of
    the arch's block tensors layer ``bid`` holds (default: all of them in every layer).
    """

    write_hparams: Callable[[gguf.GGUFWriter, TinyModelSpec], None]
    block_kinds: Callable[[TinyModelSpec, int], frozenset[gguf.MODEL_TENSOR]] | None = None


_ARCHS: Final[Mapping[str, _ArchSupport]] = {
    "qwen3": _ArchSupport(write_hparams=_write_common_hparams),
    "qwen3moe": _ArchSupport(write_hparams=_write_moe_hparams),
}

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
        shape = _SHAPES[kind](spec, n_vocab)
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
    on the name style).  Norm weights are ``1 + noise``, everything else ``noise``, with
    noise ~ N(0, WEIGHT_SCALE^2).
    """
    digest = hashlib.sha256(entry.canonical.encode("utf-8")).digest()
    seq = np.random.SeedSequence([spec.seed, int.from_bytes(digest[:8], "little")])
    rng = np.random.default_rng(seq)
    values = rng.standard_normal(entry.shape, dtype=np.float32) * np.float32(WEIGHT_SCALE)
    if len(entry.shape) == 1:
        values += np.float32(1.0)
    return np.ascontiguousarray(values.astype(entry.dtype))


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
    path = Path(path)
    tokenizer_kvs, n_vocab = _load_tokenizer(Path(vocab_gguf))
    plan = tensor_plan(spec, n_vocab)
    support = _ARCHS[spec.arch]

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, spec.arch)
        try:
            writer.add_type(gguf.GGUFType.MODEL)
            writer.add_name(spec.default_name)
            writer.add_description(
                "tiny random-weight test model written by llamaforge.tinymodels; not trained"
            )
            writer.add_file_type(
                gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32
            )
            support.write_hparams(writer, spec)
            for kv in tokenizer_kvs:
                writer.add_key_value(kv.key, kv.value, kv.vtype, sub_type=kv.sub_type)
            for item in plan:
                writer.add_tensor(item.name, tensor_data(spec, item))
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
        path=path,
        sha256=_file_sha256(path),
        size=path.stat().st_size,
        tensor_count=len(plan),
        arch=spec.arch,
        name_style=spec.name_style,
        n_vocab=n_vocab,
        tensor_names=tuple(item.name for item in plan),
    )
