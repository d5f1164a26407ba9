"""Operation ``models.split`` (registered on import): a model planned over RPC workers and the head's GPUs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamaforge.core.errors import DoesNotFit, OperationFailed
from llamaforge.core.registry import Int32, OperationContext, Params, Result, Slots, operation, path_field
from llamaforge.serve.launcher import CacheType


class ModelSplitParams(Params):
    """Parameters of ``models.split``."""

    model: str = path_field(
        description="GGUF file, a model recipe whose file was fetched (`models.fetch`), or `tiny` / "
        "`tiny-q4_k_m`: the tiny qwen3 smoke models, written here on first use"
    )
    devices: str = Field(
        description="The devices in llama.cpp's order: RPC workers ADDR[:PORT]=SIZE first (in --rpc order), "
        "then the head's GPUs as gpu=SIZE; e.g. 10.0.0.2:50052=24GiB,10.0.0.3=8GiB"
    )
    ctx: Int32 = Field(description="Context (tokens) of each slot", ge=1)
    parallel: Slots = Field(1, description="Slots (concurrent sequences), at most 256")
    cache_type: CacheType = Field("f16", description="KV cache type for K and V")
    ubatch: Int32 = Field(512, ge=1, description="Physical batch size (-ub)")
    flash_attn: Literal["on", "off"] = Field("on", description="Flash attention")
    tensor_split: str | None = Field(
        None, description="Proportions per device, comma-separated (default: in proportion to their memory)"
    )
    n_gpu_layers: Int32 | None = Field(None, ge=0, description="-ngl (default: every block and the output)")
    margin: str = Field("1GiB", description="Memory to keep free on each device")


class SplitDeviceReport(Result):
    """One device's share."""

    name: str
    endpoint: str | None
    memory_bytes: int
    layers: list[int]
    layer_range: str
    output: bool
    memory: dict[str, int] = Field(
        description="weights, kv_cache, recurrent_state, compute, output, total (bytes)"
    )
    fits: bool


class ModelSplitResult(Result):
    """Which blocks each device holds, its memory, whether all fit, and the head's llama-server flags."""

    model: str
    arch: str
    n_layer: int
    n_gpu_layers: int
    tensor_split: list[float]
    devices: list[SplitDeviceReport]
    head_host: dict[str, int] = Field(description="The head's host memory (token_embd, CPU blocks, buffers)")
    flags: list[str] = Field(description="The head's llama-server flags (topology.deploy uses these)")
    margin_bytes: int
    notes: list[str]
    fits: bool
    command: str


@operation("models.split", ModelSplitParams, read_only=True, positional=("model",))
def models_split_op(params: ModelSplitParams, ctx: OperationContext) -> ModelSplitResult:
    """Plan a model across llama.cpp RPC workers (and the head's GPUs): blocks, memory per device, flags."""
    from llamaforge.models.argument import resolve_model_file
    from llamaforge.serve.fit import Settings, parse_size
    from llamaforge.serve.split import parse_devices, parse_tensor_split, plan_split

    # the options before the model, which may be written first (the tiny one fetches the llama.cpp source)
    devices = parse_devices(params.devices)
    tensor_split = parse_tensor_split(params.tensor_split) if params.tensor_split else None
    margin_bytes = parse_size(params.margin, "--margin")
    settings = Settings(
        params.ctx,
        params.parallel,
        params.cache_type,
        params.cache_type,
        params.ubatch,
        params.flash_attn == "on",
    )
    plan = plan_split(
        resolve_model_file(params.model),
        devices,
        settings,
        tensor_split=tensor_split,
        n_gpu_layers=params.n_gpu_layers,
        margin_bytes=margin_bytes,
    )
    data: dict[str, Any] = plan.to_json()
    outcome = ModelSplitResult.model_validate(data)
    if not plan.fits:
        short = [device.name for device in plan.devices if not device.fits]
        raise OperationFailed(
            f"the split does not fit on {', '.join(short)}",
            result=outcome,
            exit_code=DoesNotFit.exit_code,
            hint="add a worker, give --tensor-split to move blocks, lower --ctx or pick a smaller quant",
        )
    return outcome
