"""The compute buffer of a dense transformer, by replaying llama.cpp's graph through ggml-alloc's allocator.

ggml-alloc (``ggml/src/ggml-alloc.c``, b11312) reserves the compute buffer by walking the worst-case graph in
node order: a node takes its parent's memory when the op can work in place (``ggml_op_can_inplace``: norms,
element-wise ops, RoPE, softmax) and the parent has no other consumer, otherwise the best-fitting free block
(``ggml_dyn_tallocr_alloc``: the smallest free block that fits, else the end of the buffer, which grows it);
a tensor is freed when its last consumer has run. The buffer is the highest offset ever used, so it is the
live activations *plus the holes* they leave: on a model whose FFN is three times as wide as the attention,
the FFN's gate, up and GLU outputs do not fit in the blocks the attention freed and the buffer grows by
them (a model of live bytes alone falls short there).

This module rebuilds that sequence for the archs whose graph it follows (``src/models/{qwen3,gemma2,gemma3}.cpp``,
``deepseek2.cpp`` with MLA and dense layers, and ``llm_graph_context::build_attn``): the inputs (tokens,
positions, the masks and the cache row indices: one per cache, the V indices per element without flash
attention), every layer's activations, the last layer reduced to the output rows (``inp_out_ids``), the output
norm and the logits of one output per slot, and replays it through the same best-fit allocator. Weights and
the KV cache live in their own buffers and are left out. Two residuals are measured rather than traced (see
:func:`simulate_compute`): the embeddings input that gemma and deepseek2 graphs keep, and one query block more
that qwen3 graphs of three layers or more reserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from llamaforge.serve.shape import ModelShape, row_bytes

__all__ = ["GRAPH_ARCHS", "GraphSettings", "simulate_compute"]

#: Archs whose graph :func:`simulate_compute` replays (their per-layer op order read from the same release's builders).
GRAPH_ARCHS: Final = frozenset(
    {"qwen3", "gemma2", "gemma3", "deepseek2"}
)  # deepseek2: MLA, dense layers only
_GEMMA: Final = frozenset({"gemma2", "gemma3"})
_QK_NORM: Final = frozenset({"qwen3", "gemma3"})
_EMBD_INPUT: Final = _GEMMA | {"deepseek2"}
_ALIGNMENT: Final = 32  # the CPU buffer type's (TENSOR_ALIGNMENT); GPU buffers align to 128-256 bytes


@dataclass(frozen=True)
class GraphSettings:
    """What the worst-case graph depends on: tokens of the ubatch, outputs, cells per cache, flash attention."""

    n_tokens: int
    n_outputs: int
    full_cells: int
    swa_cells: int
    flash_attn: bool
    cache_type_k: str = "f16"


@dataclass
class _Node:
    name: str
    size: int
    srcs: tuple[str, ...]
    inplace: bool = False  # the op can reuse a parent's memory
    output: bool = False  # never freed


class _Allocator:
    """``ggml_dyn_tallocr``: best fit among the free blocks but the last, else the last (growing the buffer)."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.free: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def _align(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._align(size)
        best = None
        for index, (_offset, block) in enumerate(self.free[:-1]):
            if block >= size and (best is None or block <= self.free[best][1]):
                best = index
        if best is None:
            best = len(self.free) - 1
        offset, block = self.free[best]
        if block == size:
            self.free.pop(best)
        else:
            self.free[best] = [offset + size, block - size]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        self.free.append([offset, self._align(size)])
        self.free.sort()
        merged: list[list[int]] = []
        for block in self.free:
            if merged and merged[-1][0] + merged[-1][1] == block[0]:
                merged[-1][1] += block[1]
            else:
                merged.append(block)
        self.free = merged


def _replay(inputs: Sequence[tuple[str, int]], nodes: Sequence[_Node], alignment: int) -> int:
    """The buffer ``ggml_gallocr_alloc_graph_impl`` reserves for ``nodes`` after allocating ``inputs``."""
    children: dict[str, int] = {}
    for node in nodes:
        for src in node.srcs:
            children[src] = children.get(src, 0) + 1
    sizes = dict(inputs) | {node.name: node.size for node in nodes}
    allocator = _Allocator(alignment)
    where: dict[str, int] = {name: allocator.alloc(size) for name, size in inputs}
    outputs = {node.name for node in nodes if node.output}
    for node in nodes:
        reused = None
        if node.inplace:
            reused = next(
                (
                    s
                    for s in node.srcs
                    if s in where and children[s] == 1 and s not in outputs and sizes[s] == node.size
                ),
                None,
            )
        if reused is not None:
            where[node.name] = where.pop(reused)
            children[reused] = 0
        elif node.size:  # size 0: a write into the KV cache (a view of its buffer)
            where[node.name] = allocator.alloc(node.size)
        for src in node.srcs:
            if src == reused or src not in children:
                continue
            children[src] -= 1
            if children[src] == 0 and src in where and src not in outputs:
                allocator.release(where.pop(src), sizes[src])
    return allocator.max_size


def _attention(shape: ModelShape, il: int, p: str, g: GraphSettings) -> list[_Node]:
    """Q, K, V projections, the cache writes and the attention of a standard layer (``build_attn``)."""
    t, f32 = g.n_tokens, 4
    q = shape.n_head * shape.head_dim_k * f32
    k, v = shape.n_head_kv * shape.head_dim_k * f32, shape.n_head_kv * shape.head_dim_v * f32
    out_v = shape.n_head * shape.head_dim_v * f32
    gemma, qk_norm = shape.arch in _GEMMA, shape.arch in _QK_NORM
    nodes: list[_Node] = []
    qkv = [("q", q), ("v", v), ("k", k)] if not gemma else [("q", q), ("k", k), ("v", v)]
    for which, width in qkv:
        nodes.append(_Node(p + which, width * t, (p + "attn_norm",)))
        if which != "v" and qk_norm:  # q/k norms and RoPE, in place
            nodes.append(_Node(p + which + "_n", width * t, (p + which,), True))
            nodes.append(_Node(p + which + "_r", width * t, (p + which + "_n",), True))
        elif which != "v":
            nodes.append(_Node(p + which + "_r", width * t, (p + which,), True))
    cache = "swa" if shape.is_swa(il) else "full"
    cells = g.swa_cells if cache == "swa" else g.full_cells
    # the cache writes consume K, then V (set_rows into the KV buffer)
    nodes += [
        _Node(p + "set_k", 0, (p + "k_r", f"k_idxs_{cache}")),
        _Node(p + "set_v", 0, (p + "v", f"v_idxs_{cache}")),
    ]
    if g.flash_attn:
        nodes.append(_Node(p + "attn", out_v * t, (p + "q_r", f"mask_{cache}")))
    else:
        kq = shape.n_head * cells * t * f32
        nodes += [
            _Node(p + "kq", kq, (p + "q_r",)),
            _Node(p + "kq_soft_max", kq, (p + "kq", f"mask_{cache}"), True),
            _Node(p + "kqv", out_v * t, (p + "kq_soft_max",)),
            _Node(p + "attn", out_v * t, (p + "kqv",)),  # cont of the permuted result
        ]
    return nodes


def _mla_attention(shape: ModelShape, p: str, g: GraphSettings) -> list[_Node]:
    """MLA attention (``src/models/deepseek2.cpp`` with ``is_mla``): the query's no-RoPE part absorbed into the
    latent, one latent K row cached, V a view of it, decompressed after the attention by ``attn_v_b``."""
    t, f32 = g.n_tokens, 4
    kv, rope = shape.head_dim_v, shape.head_dim_k - shape.head_dim_v  # value_length: the latent rank
    heads = shape.n_head
    nodes = [
        _Node(p + "q", heads * shape.head_dim_k_mla * f32 * t, (p + "attn_norm",)),
        _Node(p + "q_absorbed", heads * kv * f32 * t, (p + "q",)),
        _Node(p + "q_pe", heads * rope * f32 * t, (p + "q",)),  # RoPE on a view of q: not in place
        _Node(p + "q_cat", heads * (kv + rope) * f32 * t, (p + "q_absorbed", p + "q_pe")),
        _Node(p + "kv_cmpr_pe", (kv + rope) * f32 * t, (p + "attn_norm",)),
        _Node(p + "kv_norm", kv * f32 * t, (p + "kv_cmpr_pe",)),  # RMS norm of a view: not in place
        _Node(p + "kv_norm_mul", kv * f32 * t, (p + "kv_norm",), True),
        _Node(p + "k_pe", rope * f32 * t, (p + "kv_cmpr_pe",)),
        _Node(p + "k_cat", (kv + rope) * f32 * t, (p + "kv_norm_mul", p + "k_pe")),
        _Node(p + "set_k", 0, (p + "k_cat", "k_idxs_full")),
    ]
    if g.flash_attn:
        nodes.append(_Node(p + "latent", heads * kv * f32 * t, (p + "q_cat", "mask_full")))
    else:  # V: a contiguous copy of the latent part of the cached rows
        kq = heads * g.full_cells * t * f32
        nodes += [
            _Node(p + "v_cont", row_bytes(g.cache_type_k, kv) * g.full_cells, ()),
            _Node(p + "kq", kq, (p + "q_cat",)),
            _Node(p + "kq_soft_max", kq, (p + "kq", "mask_full"), True),
            _Node(p + "latent", heads * kv * f32 * t, (p + "v_cont", p + "kq_soft_max")),
        ]
    out_v = heads * shape.head_dim_v_mla * f32 * t
    return [*nodes, _Node(p + "v_b", out_v, (p + "latent",)), _Node(p + "attn", out_v, (p + "v_b",))]


def _layer(shape: ModelShape, il: int, x: str, g: GraphSettings, last: bool) -> tuple[list[_Node], str]:
    """One layer's nodes (F32 activations) on input ``x``; returns them and the layer output's name."""
    t, f32 = g.n_tokens, 4
    e, gemma = shape.n_embd * f32, shape.arch in _GEMMA
    p = f"{il}."
    nodes = [_Node(p + "norm", e * t, (x,), inplace=True), _Node(p + "attn_norm", e * t, (p + "norm",), True)]
    if shape.mla:
        nodes += _mla_attention(shape, p, g)
    else:
        nodes += _attention(shape, il, p, g)
    nodes.append(_Node(p + "attn_out", e * t, (p + "attn",)))
    cur, residual = p + "attn_out", x
    if last:  # only the output rows go on (inp_out_ids)
        t = g.n_outputs
        nodes += [
            _Node(p + "rows", e * t, (cur, "out_ids")),
            _Node(p + "rows_res", e * t, (residual, "out_ids")),
        ]
        cur, residual = p + "rows", p + "rows_res"
    if gemma:  # post-attention norm, in place
        nodes += [
            _Node(p + "post_norm", e * t, (cur,), True),
            _Node(p + "post_mul", e * t, (p + "post_norm",), True),
        ]
        cur = p + "post_mul"
    nodes.append(_Node(p + "ffn_inp", e * t, (cur, residual), True))
    f = shape.n_ff * f32
    nodes += [
        _Node(p + "ffn_norm", e * t, (p + "ffn_inp",), True),
        _Node(p + "ffn_norm_mul", e * t, (p + "ffn_norm",), True),
        _Node(p + "gate", f * t, (p + "ffn_norm_mul",)),
        _Node(p + "up", f * t, (p + "ffn_norm_mul",)),
        _Node(p + "glu", f * t, (p + "gate", p + "up")),
        _Node(p + "down", e * t, (p + "glu",)),
    ]
    cur = p + "down"
    if gemma:
        nodes += [
            _Node(p + "ffn_post", e * t, (cur,), True),
            _Node(p + "ffn_post_mul", e * t, (p + "ffn_post",), True),
        ]
        cur = p + "ffn_post_mul"
    nodes.append(_Node(p + "l_out", e * t, (cur, p + "ffn_inp"), True))
    return nodes, p + "l_out"


def simulate_compute(
    shape: ModelShape,
    layers: Sequence[int],
    g: GraphSettings,
    *,
    with_output: bool,
    alignment: int = _ALIGNMENT,
) -> int:
    """Bytes ggml-alloc reserves for ``layers`` of ``shape`` (one backend's share of the graph), with the
    output norm and logits when ``with_output``. ``shape.arch`` must be in :data:`GRAPH_ARCHS`."""
    t, f32 = g.n_tokens, 4
    caches = {"swa" if shape.is_swa(il) else "full" for il in layers}
    v_idxs = t * 8 if g.flash_attn else t * shape.n_head_kv * shape.head_dim_v * 8
    mask_item = 2 if g.flash_attn else 4
    e = shape.n_embd * f32
    inputs = [("tokens", t * 4), ("pos", t * 4)]
    if shape.arch in _EMBD_INPUT:
        # measured: the embeddings input of the unused branch (ggml_build_forward_select in
        # llm_graph_context::build_inp_embd) stays allocated; qwen3's buffer shows none
        inputs.insert(1, ("inp_embd", e * t))
    for cache in sorted(caches):
        cells = g.swa_cells if cache == "swa" else g.full_cells
        inputs.append((f"k_idxs_{cache}", t * 8))
        if not shape.mla:  # MLA: no V cache, no V indices
            inputs.append((f"v_idxs_{cache}", v_idxs))
        inputs.append((f"mask_{cache}", cells * t * mask_item))
    inputs.append(("out_ids", g.n_outputs * 4))
    nodes = [_Node("embd", e * t, ("tokens",))]
    x = "embd"
    if shape.arch in _GEMMA:
        nodes.append(_Node("embd_scaled", e * t, ("embd",), True))
        x = "embd_scaled"
    ordered = sorted(layers)
    for il in ordered:
        layer_nodes, x = _layer(shape, il, x, g, last=il == shape.n_layer - 1)
        nodes += layer_nodes
    if with_output:
        rows = g.n_outputs if shape.n_layer - 1 in ordered else t
        nodes += [
            _Node("out_norm", e * rows, (x,), True),
            _Node("out_norm_mul", e * rows, ("out_norm",), True),
            _Node("logits", shape.n_vocab * rows * f32, ("out_norm_mul",), output=True),
        ]
    extra = 0
    if shape.arch == "qwen3" and len(ordered) >= 3:
        # Measured, not traced: from three layers on, llama.cpp's qwen3 buffer is one query block (n_head x head_dim
        # x n_tokens F32) larger than this replay of the node list llama.cpp prints (GGML_SCHED_DEBUG=2), at 3,
        # 4 and 8 layers alike; two-layer graphs match exactly.
        extra = shape.n_head * shape.head_dim_k * t * f32
    return _replay(inputs, nodes, alignment) + extra
