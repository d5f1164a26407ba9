"""The compute-buffer replay of ggml-alloc: the allocator's best fit, and whole graphs against the buffer sizes
stock llama.cpp b11312 printed for the same shapes (CPU build, ``~llama_context: CPU compute buffer size is``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import TinyModelSpec
from llamaforge.gguf.tiny.mla import TinyMLASpec, write_tiny_mla_model
from llamaforge.serve.compute_graph import GraphSettings, _Allocator, _Node, _replay, simulate_compute
from llamaforge.serve.fit import MiB, Settings, estimate_memory, synthetic_header
from llamaforge.serve.shape import model_shape

pytestmark = pytest.mark.quick

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
        _Node("x", 2, ()),
        _Node("a", 2, ("x",)),
        _Node("b", 2, ("a",)),
        _Node("c", 6, ("b",)),
        _Node("d", 6, ("c",)),
        _Node("e", 6, ("c", "d")),
    ]
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


@pytest.fixture(scope="module")
def mla_models(tmp_path_factory: pytest.TempPathFactory) -> dict[TinyMLASpec, Path]:
    """Each MLA spec written once, with the real qwen2 tokenizer (151 936 tokens), as llama.cpp loaded it."""
    vocab = os.environ.get("LLAMAFORGE_TEST_VOCAB")
    if not vocab:
        pytest.skip("LLAMAFORGE_TEST_VOCAB is unset: point it at llama.cpp's models/ggml-vocab-qwen2.gguf")
    out = tmp_path_factory.mktemp("mla")
    specs = (TinyMLASpec(), TinyMLASpec(n_layer=4, n_embd=256, n_ff=1024))
    return {
        spec: write_tiny_mla_model(out / f"mla-{i}.gguf", spec, Path(vocab)).path
        for i, spec in enumerate(specs)
    }


@pytest.mark.parametrize(
    ("spec", "settings", "printed_mib"),
    [
        (TinyMLASpec(), Settings(ctx=512), 2.51),
        (TinyMLASpec(), Settings(ctx=1024, flash_attn=False), 12.01),
        (TinyMLASpec(n_layer=4, n_embd=256, n_ff=1024), Settings(ctx=1024), 8.76),
        (TinyMLASpec(n_layer=4, n_embd=256, n_ff=1024), Settings(ctx=1024, flash_attn=False), 13.13),
    ],
)
def test_mla_graph_matches_llamacpp(
    mla_models: dict[TinyMLASpec, Path], spec: TinyMLASpec, settings: Settings, printed_mib: float
) -> None:
    # the compute buffers b11312 printed for these models
    header = read_header(mla_models[spec])
    shape = model_shape(header)
    planned = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)[1].compute / MiB
    assert planned == pytest.approx(printed_mib, abs=0.01)
