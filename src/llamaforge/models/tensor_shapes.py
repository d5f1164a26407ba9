"""The tensor-shape check of ``models.verify``: each tensor's dimensions against the ones llama.cpp b11312 creates
for its architecture (``src/models/<arch>.cpp``), from the hyper-parameters in the header.

Like llama.cpp's tensor loaders, the widths come from layer 0 of a per-layer list (``n_head()``, ``n_ff()``) and
``key_length``/``value_length`` default to ``embedding_length / head_count``. A tensor that does not match is the
``check_tensor_dims: tensor ... has wrong shape`` that makes llama.cpp refuse the file, found without a build.
A per-layer value (``head_count``, ``head_count_kv``, ``feed_forward_length``) is then compared with its own layer's
tensors: llama.cpp sizes the weights by layer 0's value but the layer's KV cache and its split over GPUs by the
layer's own, so a layer whose value disagrees with its tensors (``head_count = [4, 4, 4, 0]``) is named.
The architectures with rules are the ones the project writes tiny models of (qwen2, qwen3, qwen3moe, qwen35,
qwen35moe, qwen3next, gemma2, gemma3), each checked against llama.cpp's own loader by
``tests/test_tensor_shapes.py``. Tensors this table does not model (the recurrent layers' SSM tensors, MTP
blocks, other architectures) are left to the load check; a missing or unknown tensor is the tensor-set check's
business.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from llamaforge.models.findings import Finding, Status

if TYPE_CHECKING:
    from llamaforge.gguf.header import GGUFHeader
    from llamaforge.models.inspect import LayerKind

_BLOCK_RE: Final = re.compile(r"^blk\.(\d+)\.(.+)$")
_GGML_MAX_DIMS: Final = 4


@dataclass(frozen=True)
class _Dims:
    """The hyper-parameters the tensor shapes are made of, as llama.cpp's loaders read them."""

    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_ff: int
    n_expert: int
    n_ff_exp: int
    n_ff_shexp: int
    attention_known: bool  # False with SWA head sizes of their own (which layer-0 size applies: not modelled)


# A shape is a tuple of (value, how it is made); the "how" names the metadata keys in the finding.
_Shape = tuple[tuple[int, str], ...]
_Rule = Callable[[_Dims], _Shape]


def _e(d: _Dims) -> tuple[int, str]:
    return d.n_embd, "embedding_length"


def _q(d: _Dims, factor: int = 1) -> tuple[int, str]:
    how = "head_count*key_length"
    return factor * d.n_head * d.head_k, f"{factor}*{how}" if factor > 1 else how


def _k(d: _Dims) -> tuple[int, str]:
    return d.n_head_kv * d.head_k, "head_count_kv*key_length"


def _v(d: _Dims) -> tuple[int, str]:
    return d.n_head_kv * d.head_v, "head_count_kv*value_length"


def _norm(d: _Dims) -> _Shape:
    return (_e(d),)


def _head_norm(d: _Dims) -> _Shape:
    return ((d.head_k, "key_length"),)


def _dense_ffn() -> dict[str, _Rule]:
    ff: Callable[[_Dims], tuple[int, str]] = lambda d: (d.n_ff, "feed_forward_length")  # noqa: E731
    return {
        "ffn_gate.weight": lambda d: (_e(d), ff(d)),
        "ffn_up.weight": lambda d: (_e(d), ff(d)),
        "ffn_down.weight": lambda d: (ff(d), _e(d)),
    }


def _moe_ffn(shared: bool) -> dict[str, _Rule]:
    exp: Callable[[_Dims], tuple[int, str]] = lambda d: (d.n_ff_exp, "expert_feed_forward_length")  # noqa: E731
    n_exp: Callable[[_Dims], tuple[int, str]] = lambda d: (d.n_expert, "expert_count")  # noqa: E731
    rules: dict[str, _Rule] = {
        "ffn_gate_inp.weight": lambda d: (_e(d), n_exp(d)),
        "ffn_gate_exps.weight": lambda d: (_e(d), exp(d), n_exp(d)),
        "ffn_up_exps.weight": lambda d: (_e(d), exp(d), n_exp(d)),
        "ffn_down_exps.weight": lambda d: (exp(d), _e(d), n_exp(d)),
        "ffn_gate_up_exps.weight": lambda d: (
            _e(d),
            (2 * d.n_ff_exp, "2*expert_feed_forward_length"),
            n_exp(d),
        ),
    }
    if shared:
        shexp: Callable[[_Dims], tuple[int, str]] = lambda d: (  # noqa: E731
            d.n_ff_shexp,
            "expert_shared_feed_forward_length",
        )
        rules |= {
            "ffn_gate_inp_shexp.weight": _norm,
            "ffn_gate_shexp.weight": lambda d: (_e(d), shexp(d)),
            "ffn_up_shexp.weight": lambda d: (_e(d), shexp(d)),
            "ffn_down_shexp.weight": lambda d: (shexp(d), _e(d)),
        }
    return rules


def _attention(
    q: Callable[[_Dims], tuple[int, str]],
    k: Callable[[_Dims], tuple[int, str]],
    v: Callable[[_Dims], tuple[int, str]],
    out: Callable[[_Dims], tuple[int, str]],
    head_norms: bool,
) -> dict[str, _Rule]:
    """``create_tensor_qkv`` (fused or apart, with the optional biases) and the output projection."""

    def fused(d: _Dims) -> tuple[int, str]:
        return q(d)[0] + k(d)[0] + v(d)[0], f"{q(d)[1]} + {k(d)[1]} + {v(d)[1]}"

    rules: dict[str, _Rule] = {
        "attn_q.weight": lambda d: (_e(d), q(d)),
        "attn_k.weight": lambda d: (_e(d), k(d)),
        "attn_v.weight": lambda d: (_e(d), v(d)),
        "attn_qkv.weight": lambda d: (_e(d), fused(d)),
        "attn_q.bias": lambda d: (q(d),),
        "attn_k.bias": lambda d: (k(d),),
        "attn_v.bias": lambda d: (v(d),),
        "attn_qkv.bias": lambda d: (fused(d),),
        "attn_output.weight": lambda d: (out(d), _e(d)),
    }
    if head_norms:
        rules |= {"attn_q_norm.weight": _head_norm, "attn_k_norm.weight": _head_norm}
    return rules


def _v_as_k(d: _Dims) -> tuple[int, str]:
    # qwen2/qwen3's loaders size K with n_embd_gqa, which is n_embd_v_gqa
    return _v(d)


@dataclass(frozen=True)
class _ArchShapes:
    """Per-layer rules by name suffix (``attn_q.weight``); ``attention`` only on layers with a KV cache."""

    every: Mapping[str, _Rule]
    attention: Mapping[str, _Rule]


def _shapes() -> Mapping[str, _ArchShapes]:
    qwen2 = _attention(_e, _v_as_k, _v, _e, head_norms=False)
    qwen3 = _attention(_q, _v_as_k, _v, _q, head_norms=True)
    gated = _attention(lambda d: _q(d, 2), _k, _v, _q, head_norms=True)  # Q carries its output gate
    gemma = _attention(_q, _k, _v, _q, head_norms=False)
    post = {"attn_norm.weight": _norm, "attn_post_norm.weight": _norm}
    gemma_norms = {**post, "ffn_norm.weight": _norm, "ffn_post_norm.weight": _norm}
    ffn_norm = {"attn_norm.weight": _norm, "ffn_norm.weight": _norm}
    return {
        "qwen2": _ArchShapes(every={**ffn_norm, **_dense_ffn()}, attention=qwen2),
        "qwen3": _ArchShapes(every={**ffn_norm, **_dense_ffn()}, attention=qwen3),
        "qwen3moe": _ArchShapes(every={**ffn_norm, **_moe_ffn(shared=False)}, attention=qwen3),
        "qwen35": _ArchShapes(every={**post, **_dense_ffn()}, attention=gated),
        "qwen35moe": _ArchShapes(every={**post, **_moe_ffn(shared=True)}, attention=gated),
        "qwen3next": _ArchShapes(every={**post, **_moe_ffn(shared=True)}, attention=gated),
        "gemma2": _ArchShapes(every={**gemma_norms, **_dense_ffn()}, attention=gemma),
        "gemma3": _ArchShapes(
            every={**gemma_norms, **_dense_ffn()},
            attention={**gemma, "attn_q_norm.weight": _head_norm, "attn_k_norm.weight": _head_norm},
        ),
    }


_ARCH_SHAPES: Final = _shapes()
# token_embd and output: their widths and rows are the structure check's
_GLOBAL: Final[Mapping[str, _Rule]] = {"output_norm.weight": _norm}


def check_tensor_shapes(header: GGUFHeader, kinds: list[LayerKind]) -> list[Finding]:
    """One fail finding per tensor kind whose shape llama.cpp would refuse (its layers named), or none.

    ``kinds`` is :func:`llamaforge.models.inspect.layer_kinds` of the header. Architectures without rules here,
    and headers whose hyper-parameters cannot be read (the structure check names those), get no finding."""
    arch = header.architecture or ""
    rules = _ARCH_SHAPES.get(arch)
    dims = _read_dims(header) if rules is not None else None
    if rules is None or dims is None:
        return []
    wrong: dict[tuple[str, tuple[int, ...], tuple[int, ...]], tuple[list[int], str]] = {}
    per_layer = _per_layer_values(header)
    disagree: dict[tuple[str, Status], dict[int, _Disagreement]] = {}
    for tensor in header.tensors:
        match = _BLOCK_RE.match(tensor.name)
        if match is None:
            block, suffix = None, tensor.name
            rule = _GLOBAL.get(suffix)
        else:
            block, suffix = int(match.group(1)), match.group(2)
            kind = kinds[block] if block < len(kinds) else None
            if kind is None or kind == "mtp":
                continue
            rule = rules.every.get(suffix)
            if rule is None and kind == "attention" and dims.attention_known:
                rule = rules.attention.get(suffix)
        if rule is None:
            continue
        expected = rule(dims)
        want = _padded(tuple(value for value, _ in expected))
        got = _padded(tensor.shape)
        if got != want:
            how = " x ".join(name for _, name in expected)
            layers, _ = wrong.setdefault((suffix, got, want), ([], how))
            if block is not None:
                layers.append(block)
        elif block is not None:
            for key, layer_dims in _layer_dims(dims, per_layer, block, header):
                if _padded(tuple(value for value, _ in rule(layer_dims))) != want:
                    value = per_layer[key][block]
                    by_block = disagree.setdefault((key, _severity(header, key, value)), {})
                    by_block.setdefault(block, _Disagreement(block, value, tensor.name, got))
    return [
        *(
            _finding(arch, suffix, got, want, layers, how)
            for (suffix, got, want), (layers, how) in wrong.items()
        ),
        *(
            _layer_finding(header, key, status, list(found.values()), per_layer[key][0])
            for (key, status), found in disagree.items()
        ),
    ]


#: The per-layer keys (one value, or one per block) the shapes are made of.
_PER_LAYER_KEYS: Final = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


@dataclass(frozen=True)
class _Disagreement:
    """A block whose own value of a per-layer key does not give the shape of ``tensor`` (which is layer 0's)."""

    block: int
    value: int
    tensor: str
    shape: tuple[int, ...]


def _per_layer_values(header: GGUFHeader) -> dict[str, list[int]]:
    """The per-layer keys given as a list of counts, one per block (another length, or a value that is no count,
    is the structure check's finding)."""
    arch = header.architecture
    values: dict[str, list[int]] = {}
    for key in _PER_LAYER_KEYS:
        value = header.metadata.get(f"{arch}.{key}")
        if isinstance(value, list | tuple) and all(_is_count(item) for item in value):
            values[key] = list(value)
    return values


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _layer_dims(
    dims: _Dims, per_layer: Mapping[str, list[int]], block: int, header: GGUFHeader
) -> list[tuple[str, _Dims]]:
    """For each per-layer key whose value in ``block`` is not layer 0's: the widths with that block's value."""
    kv_given = f"{header.architecture}.attention.head_count_kv" in header.metadata
    changed: list[tuple[str, _Dims]] = []
    for key, values in per_layer.items():
        if block >= len(values) or values[block] == values[0]:
            continue
        value = values[block]
        if key == "feed_forward_length":
            layer = replace(dims, n_ff=value)
        elif key == "attention.head_count_kv":
            layer = replace(dims, n_head_kv=value)
        else:  # llama.cpp's head_count_kv defaults to head_count, layer by layer
            layer = replace(dims, n_head=value, n_head_kv=dims.n_head_kv if kv_given else value)
        changed.append((key, layer))
    return changed


def _kv_follows(header: GGUFHeader, key: str) -> bool:
    """True when ``key`` sizes the KV cache per layer: head_count_kv, or head_count when it stands for it."""
    kv_given = f"{header.architecture}.attention.head_count_kv" in header.metadata
    return key == "attention.head_count_kv" or (key == "attention.head_count" and not kv_given)


def _severity(header: GGUFHeader, key: str, value: int) -> Status:
    """A fail when llama.cpp cannot run the layer: its KV cache does not fit its K and V, or no heads for a
    layer with attention weights; a warning when it loads and runs the file by blk.0's value."""
    if _kv_follows(header, key) or (key == "attention.head_count" and value == 0):
        return "fail"
    return "warn"


def _layer_finding(
    header: GGUFHeader, key: str, status: Status, found: list[_Disagreement], first: int
) -> Finding:
    """A per-layer value that disagrees with its block's tensors, the first block named, the others counted."""
    arch = header.architecture
    one = found[0]
    more = ""
    if len(found) > 1:
        more = (
            f" (and another value than blk.0's in {len(found) - 1} more block{'s' if len(found) > 2 else ''})"
        )
    message = (
        f"{arch}.{key} is {one.value} for blk.{one.block}{more}, but {one.tensor} is {_shown(one.shape)}, as "
        f"blk.0's value {first} makes it: llama.cpp sizes every layer's weights by blk.0's value"
    )
    split = " (its split of attention over GPUs, -sm tensor, reads the layer's own)"
    if status == "warn":
        message += ", so it loads the file, but the metadata does not describe the layer's tensors"
        message += split if key == "attention.head_count" else ""
    elif _kv_follows(header, key):
        message += " and the layer's KV cache by the layer's own, which its K and V do not fit"
    else:
        message += f", and a layer without heads has no attention weights{split}"
    message += "; the metadata or the tensors are not the model's" if status == "fail" else ""
    return Finding("tensors", status, f"{arch}.{key}", message)


def _finding(
    arch: str, suffix: str, got: tuple[int, ...], want: tuple[int, ...], layers: list[int], how: str
) -> Finding:
    name = f"blk.{layers[0]}.{suffix}" if layers else suffix
    where = ""
    if len(layers) > 1:
        where = f" (and the same in {len(layers) - 1} more block{'s' if len(layers) > 2 else ''})"
    message = (
        f"{name} is {_shown(got)}{where}, but llama.cpp expects {_shown(want)} ({how}, from {arch}.* "
        "metadata): its loader refuses the file with 'wrong shape'; the metadata or the tensors are not the "
        "model's"
    )
    return Finding("tensors", "fail", name, message)


def _shown(shape: tuple[int, ...]) -> str:
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return " x ".join(str(dim) for dim in dims)


def _padded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as ggml holds it: trailing dimensions of 1 up to GGML_MAX_DIMS (as check_tensor_dims compares)."""
    return tuple(shape) + (1,) * max(_GGML_MAX_DIMS - len(shape), 0)


def _read_dims(header: GGUFHeader) -> _Dims | None:
    """The widths as llama.cpp's loaders take them (layer 0 of a per-layer list: a head_count list starting
    with 0 gives heads of size 0); None when a key the shapes need is absent, 0 or no count (the structure check
    reports those). Not ``serve.shape.model_shape``: the planner sizes memory by the largest value of a
    per-layer list, a loader by layer 0's."""
    arch = header.architecture
    meta = header.metadata

    def first(name: str) -> int | None:
        value = meta.get(f"{arch}.{name}")
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
        return value

    n_embd, n_head = first("embedding_length"), first("attention.head_count")
    if not n_embd or n_head is None or not (n_head or "attention.head_count" in _per_layer_values(header)):
        return None
    n_head_kv = first("attention.head_count_kv")
    head_k, head_v = first("attention.key_length"), first("attention.value_length")
    if not n_head:  # heads in later blocks only: llama.cpp reads no head size when blk.0 has none
        head_k = head_v = 0
    n_ff = first("feed_forward_length") or 0
    n_expert, n_used = first("expert_count") or 0, first("expert_used_count") or 0
    n_ff_exp = first("expert_feed_forward_length") or (n_ff // n_used if n_used else 0)
    return _Dims(
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head if n_head_kv is None else n_head_kv,
        head_k=n_embd // n_head if head_k is None else head_k,  # n_head is 0 only with head_k and head_v 0
        head_v=n_embd // n_head if head_v is None else head_v,
        n_ff=n_ff,
        n_expert=n_expert,
        n_ff_exp=n_ff_exp,
        n_ff_shexp=first("expert_shared_feed_forward_length") or n_ff,
        attention_known=not any(
            f"{arch}.attention.{key}" in meta for key in ("key_length_swa", "value_length_swa")
        ),
    )
