"""serve.bandwidth: one bytes-per-token definition; the fit planner's tg ceiling and the smoke roofline agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_mini_vocab
from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.serve.bandwidth import Placement, bytes_per_token
from llamaforge.serve.fit import plan_fit
from llamaforge.serve.shape import is_expert_tensor, model_shape
from llamaforge.smoke.roofline import Bandwidth, roofline

pytestmark = pytest.mark.quick

HYBRID = {"full_attention_interval": 4, "ssm_state_size": 16, "ssm_group_count": 2, "ssm_time_step_rank": 4}
SPECS = {
    "qwen3": TinyModelSpec(arch="qwen3", n_layer=4),
    "qwen3moe": TinyModelSpec(arch="qwen3moe", n_layer=4, n_expert=8, n_expert_used=2),
    "qwen35": TinyModelSpec(arch="qwen35", n_layer=8, **HYBRID),  # type: ignore[arg-type]
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bandwidth")
    vocab = write_mini_vocab(root / "vocab.gguf", 1000)
    return {arch: write_tiny_model(root / f"{arch}.gguf", spec, vocab).path for arch, spec in SPECS.items()}


@pytest.mark.parametrize("arch", sorted(SPECS))
@pytest.mark.parametrize("depth", [512, 4096])
def test_fit_ceiling_and_roofline_count_the_same_bytes(
    models: dict[str, Path], arch: str, depth: int
) -> None:
    """The same model at the same KV depth: the fit plan (all on the GPU) and the roofline read equal bytes."""
    plan = plan_fit(models[arch], gpu="rtx3090", ctx=depth)
    header = read_header(models[arch])
    roof = roofline(100.0, Bandwidth(936.0, "given: test"), bytes_per_token(header, kv_depth=depth))
    assert plan.bytes_per_token_gpu + plan.bytes_per_token_host == roof["bytes_per_token"]
    assert roof["bytes_per_token_detail"]["kv_depth"] == depth
    assert any(f"depth {depth}" in note for note in plan.notes)
    assert any(f"depth {depth}" in note for note in roof["notes"])
    assert plan.tg_ceiling_tps is not None


def test_the_definition_part_by_part(models: dict[str, Path]) -> None:
    header = read_header(models["qwen35"])
    shape = model_shape(header)
    read = bytes_per_token(header, kv_depth=1000)
    attention, recurrent = len(shape.attention_layers), len(shape.recurrent_layers)
    assert (attention, recurrent) == (2, 6)
    # K and V of the attention layers only, f16, at depth 1000
    assert read.kv_cache == attention * 1000 * shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v) * 2
    # the recurrent state, F32, read and written
    assert read.recurrent_state == recurrent * (shape.conv_state_values + shape.ssm_state_values) * 4 * 2
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert read.embedding_row == embd.nbytes // shape.n_vocab
    others = sum(t.nbytes for t in header.tensors if t.name != "token_embd.weight")
    assert read.dense == others and read.experts_active == 0
    assert read.total == read.dense + read.embedding_row + read.kv_cache + read.recurrent_state
    assert read.gpu == 0 and read.host == read.total  # no placement: one memory
    deeper = bytes_per_token(header, kv_depth=2000)
    assert deeper.kv_cache == 2 * read.kv_cache and deeper.weights == read.weights


def test_placement_splits_gpu_and_host(models: dict[str, Path]) -> None:
    header = read_header(models["qwen3moe"])
    shape = model_shape(header)
    experts = sum(t.nbytes for t in header.tensors if is_expert_tensor(t.name))
    full = bytes_per_token(header, kv_depth=256, placement=Placement(shape.n_layer_all + 1))
    assert full.experts_active == experts * 2 // 8
    assert full.host == full.embedding_row  # token_embd stays on the CPU, everything else is on the GPU
    experts_on_cpu = bytes_per_token(header, kv_depth=256, placement=Placement(shape.n_layer_all + 1, 4))
    assert experts_on_cpu.total == full.total
    assert experts_on_cpu.host == full.embedding_row + full.experts_active
    cpu_only = bytes_per_token(header, kv_depth=256, placement=Placement(0))
    assert cpu_only.gpu == 0 and cpu_only.host == full.total
