"""KV layouts beyond full attention and sliding windows: MLA (deepseek2: one latent K row per cell, no V) and
layers that reuse an earlier layer's cache (gemma4: ``attention.shared_kv_layers``, smaller heads on the sliding
layers), plus llama.cpp's ``--fit`` projection.

Unit tests read the tiny models' headers and check the planner's per-layer KV against the formulas llama.cpp
b11312 uses; the llama.cpp-tier tests load the same models in a stock llama-server and compare every buffer (KV,
weights and output exactly to its printing precision, compute within 5 %: the MLA graph is replayed through
ggml-alloc's allocator, gemma4's comes from the fitted per-token model) and check that llama.cpp's own
projection is read from the log.

The loads run with ``--no-repack`` (``Settings.cpu_buffers`` "plain"): weights stay in plain CPU buffers on every
CPU. On a Xeon with AMX, b11312 puts the MLA model's weights in the AMX buffer type and then aborts with
``GGML_ASSERT(*cur_backend_id != -1)`` (ggml-backend.cpp:1294) before it is ready, a scheduler bug of its own;
the buffer types are checked separately (tests/test_fit.py::test_cpu_buffer_types_match_this_cpu).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import AnyTinySpec, write_any_tiny_model
from llamaforge.gguf.tiny.mla import TinyMLASpec
from llamaforge.gguf.tiny.shared_kv import TinySharedKVSpec
from llamaforge.serve.bandwidth import bytes_per_token
from llamaforge.serve.fit import MiB, Settings, estimate_memory
from llamaforge.serve.loadlog import parse_load_log
from llamaforge.serve.measure import measure_with_llamacpp
from llamaforge.serve.shape import model_shape
from test_fit import mini_vocab  # noqa: F401  (the module's tokenizer fixture)

pytestmark = pytest.mark.quick

SPECS: dict[str, AnyTinySpec] = {"mla": TinyMLASpec(), "shared": TinySharedKVSpec()}
CATEGORIES = ("weights", "kv_cache", "recurrent_state", "compute", "output")


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory, mini_vocab: Path) -> dict[str, Path]:  # noqa: F811
    out = tmp_path_factory.mktemp("families")
    return {
        name: write_any_tiny_model(out / f"{name}.gguf", spec, mini_vocab).path
        for name, spec in SPECS.items()
    }


def test_mla_caches_one_latent_k_row_per_cell(family_models: dict[str, Path]) -> None:
    header = read_header(family_models["mla"])
    shape = model_shape(header)
    spec = SPECS["mla"]
    assert isinstance(spec, TinyMLASpec)
    assert shape.mla and shape.n_head_kv == 1
    assert shape.kv_widths(0) == (spec.kv_lora_rank + spec.rope_dim, 0)
    for flash_attn in (True, False):  # no V with or without flash attention
        settings = Settings(ctx=4096, flash_attn=flash_attn)
        _gpu, host = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)
        assert host.kv_cache == 4096 * spec.n_layer * (spec.kv_lora_rank + spec.rope_dim) * 2
    read = bytes_per_token(header, kv_depth=1000)
    assert read.kv_cache == 1000 * spec.n_layer * (spec.kv_lora_rank + spec.rope_dim) * 2


def test_shared_layers_hold_no_cache_and_heads_differ_per_kind(family_models: dict[str, Path]) -> None:
    header = read_header(family_models["shared"])
    shape = model_shape(header)
    spec = SPECS["shared"]
    assert isinstance(spec, TinySharedKVSpec)
    assert shape.swa == spec.swa_pattern and shape.n_layer_kv == spec.n_layer_kv == 4
    assert [shape.has_kv(il) for il in range(shape.n_layer)] == [True] * 4 + [False] * 2
    assert shape.kv_widths(0) == (2 * spec.head_dim_swa, 2 * spec.head_dim_swa)
    assert shape.kv_widths(3) == (2 * spec.head_dim, 2 * spec.head_dim)
    settings = Settings(ctx=4096)
    swa_cells = settings.swa_cells(shape.n_swa)
    _gpu, host = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)
    # layers 0-2 slide (window cache, 16-wide heads), layer 3 is full; layers 4 and 5 reuse 2 and 3
    assert host.kv_cache == 3 * swa_cells * 2 * (2 * 16) * 2 + 4096 * 2 * (2 * 32) * 2
    # without flash attention V is transposed and every V row is as wide as the widest
    _gpu, no_fa = estimate_memory(shape, header.tensors, Settings(ctx=4096, flash_attn=False), n_gpu_layers=0)
    assert no_fa.kv_cache == 3 * swa_cells * (2 * 16 + 2 * 32) * 2 + 4096 * 2 * (2 * 32) * 2


def test_writers_are_deterministic(tmp_path: Path, mini_vocab: Path) -> None:  # noqa: F811
    for name, spec in SPECS.items():
        first = write_any_tiny_model(tmp_path / f"{name}-a.gguf", spec, mini_vocab)
        second = write_any_tiny_model(tmp_path / f"{name}-b.gguf", spec, mini_vocab)
        assert first.sha256 == second.sha256 and first.n_vocab == 1000


def test_shared_kv_spec_rejects_a_pattern_llamacpp_cannot_reuse() -> None:
    with pytest.raises(ValueError, match="must be sliding and full"):
        TinySharedKVSpec(swa_pattern=(True, False, True, True, True, False))


def test_parse_fit_projection() -> None:
    # as b11312's llama-server printed them for a tiny qwen3 on a CPU build (--fit on, -c 8192)
    lines = [
        "0.00.704.284 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   "
        "context   compute    unaccounted |",
        "0.00.704.299 I common_memory_breakdown_print: |   - Host               |                  747 =   653 +  "
        "    64 +      30                |",
        "0.00.770.814 I common_params_fit_impl: projected to use 747 MiB of host memory vs. 24105 MiB of total "
        "host memory",
        "0.01.683.474 I load_tensors:   CPU_Mapped model buffer size =   653.52 MiB",
        "1.00.488.674 I common_memory_breakdown_print: |   - Host               |                  999 =   900 +  "
        "    69 +      30                |",
    ]
    projection = parse_load_log(lines).projection
    assert projection is not None and projection.total_mib == 747 and projection.memory == "host"
    host = projection.devices["Host"]
    assert (host.self_mib, host.model_mib, host.context_mib, host.compute_mib) == (747, 653, 64, 30)


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize(
    "settings",
    [Settings(ctx=4096), Settings(ctx=8192, parallel=2, flash_attn=False)],
    ids=["4k", "8k-x2-no-fa"],
)
def test_families_match_llamacpp(
    name: str, settings: Settings, stock_build: Path, family_models: dict[str, Path]
) -> None:
    """Stock llama-server loads both families; its caches are the planner's, and its --fit projection is read."""
    model = family_models[name]
    header = read_header(model)
    shape = model_shape(header)
    _gpu, planned = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)
    reported = measure_with_llamacpp(
        stock_build / "bin" / "llama-server", model, settings, fit_projection=True
    )
    for category in CATEGORIES:
        estimate, actual = getattr(planned, category), reported.total(category)
        tolerance = (0.05 if category == "compute" else 0.005) * actual + 0.005 * MiB
        assert abs(estimate - actual) <= tolerance, (category, estimate / MiB, actual / MiB)
    assert reported.kv_cache is not None
    if name == "shared":  # the reused layers are in neither cache
        assert reported.swa_kv_cache is not None
        assert reported.kv_cache.layers + reported.swa_kv_cache.layers == shape.n_layer_kv
    else:
        assert reported.kv_cache.layers == shape.n_layer
    projection = reported.projection
    assert projection is not None and projection.memory == "host"
    host = projection.devices["Host"]
    assert host.model_mib == int(reported.total("weights") / MiB)
    assert host.context_mib == int((reported.total("kv_cache") + reported.total("recurrent_state")) / MiB)
