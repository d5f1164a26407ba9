"""The compute-buffer replay of ggml-alloc: the allocator's best fit, and whole graphs against the buffer sizes
stock llama.cpp b11312 printed for the same shapes (CPU build, ``~llama_context: CPU compute buffer size is``)."""

from __future__ import annotations

import dataclasses

import pytest

from llamaforge.gguf.tiny import TinyModelSpec
from llamaforge.serve.compute_graph import GraphSettings, _Allocator, _Node, _replay, simulate_compute
from llamaforge.serve.fit import MiB, Settings, synthetic_header
from llamaforge.serve.shape import model_shape

QWEN3_WIDE = TinyModelSpec(
    arch="qwen3", n_layer=2, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072
)


def test_best_fit_takes_the_smallest_hole_and_grows_only_when_none_fits() -> None:
    allocator = _Allocator(alignment=32)
    a, b, c = allocator.alloc(100), allocator.alloc(300), allocator.alloc(200)
    allocator.release(a, 100)
    allocator.release(c, 200)  # merges with the tail
    assert allocator.alloc(96) == a  # the 128-byte hole (100 aligned), not the tail
    assert allocator.alloc(1000) == c  # nothing else fits: the tail, which grows the buffer
    assert allocator.max_size == c + 1024
    assert b == 128


def test_holes_the_attention_leaves_grow_the_buffer() -> None:
    # the 2-unit blocks freed early are too small for the 6-unit tensors: 20 units, not the 18 of c, d, e
    nodes = [
        _Node("x", 2, ()), _Node("a", 2, ("x",)), _Node("b", 2, ("a",)), _Node("c", 6, ("b",)),
        _Node("d", 6, ("c",)), _Node("e", 6, ("c", "d")),
    ]  # fmt: skip
    assert _replay([], nodes, alignment=1) == 20


@pytest.mark.parametrize(
    ("n_layer", "settings", "printed_mib"),
    [
        (2, Settings(ctx=512), 22.5117),  # FA on: the FFN outgrows the attention's holes by one n_embd row
        (2, Settings(ctx=8192, ubatch=256), 15.01),
        (4, Settings(ctx=512), 26.51),  # three layers and more: one query block more (measured)
        (8, Settings(ctx=512), 26.51),
    ],
)
def test_dense_graph_matches_llamacpp(n_layer: int, settings: Settings, printed_mib: float) -> None:
    spec = dataclasses.replace(QWEN3_WIDE, n_layer=n_layer)
    shape = model_shape(synthetic_header(spec, n_vocab=151936, weight_type="F16"))
    graph = GraphSettings(settings.n_tokens, 1, settings.n_ctx_seq, 0, settings.flash_attn)
    simulated = simulate_compute(shape, range(shape.n_layer), graph, with_output=True) / MiB
    assert simulated == pytest.approx(printed_mib, abs=0.005)
