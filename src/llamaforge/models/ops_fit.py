"""Operation ``models.fit`` (registered on import): its parameter and result models and one call into the fit
planner (:mod:`llamaforge.serve.fit`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamaforge.core.errors import OperationFailed
from llamaforge.core.guard import refuse_if_read_only
from llamaforge.core.registry import (
    Int32,
    OperationContext,
    Params,
    Result,
    Slots,
    absent,
    operation,
    path_field,
)
from llamaforge.serve.launcher import CacheType


class ModelFitParams(Params):
    """Parameters of ``models.fit``."""

    model: str = path_field(
        description="GGUF file, a model recipe whose file was fetched (`models.fetch`), or `tiny` / "
        "`tiny-q4_k_m`: the tiny qwen3 smoke models, written here on first use"
    )
    gpu: str | None = Field(None, description="GPU from recipes/gpus.toml, e.g. rtx3090, rtx4090, a100-80gb")
    vram: str | None = Field(None, description="GPU memory instead of --gpu, e.g. 24GiB (no speed estimate)")
    ctx: Int32 = Field(description="Context (tokens) of each slot", ge=1)
    cache_type: CacheType | None = Field(
        None, description="KV cache type for K and V, e.g. q8_0 (default f16)"
    )
    cache_type_k: CacheType | None = Field(None, description="K cache type (overrides --cache-type)")
    cache_type_v: CacheType | None = Field(None, description="V cache type (overrides --cache-type)")
    parallel: Slots = Field(1, description="Slots (concurrent sequences) of llama-server, at most 256")
    ubatch: Int32 = Field(512, description="Physical batch size (-ub)", ge=1)
    kv_unified: bool = Field(False, description="One KV cache shared by all slots (--kv-unified)")
    swa_full: bool = Field(False, description="Full-size KV cache for sliding-window layers (--swa-full)")
    flash_attn: Literal["on", "off", "auto"] = Field("on", description="Flash attention: on, off or auto")
    n_gpu_layers: Int32 | None = Field(None, description="Evaluate this -ngl instead of searching", ge=0)
    n_cpu_moe: Int32 | None = Field(None, description="Evaluate this --n-cpu-moe instead of searching", ge=0)
    margin: str = Field("1GiB", description="GPU memory to keep free (CUDA context, driver, headroom)")
    cpu_buffers: Literal["auto", "plain", "avx2", "avx512", "amx"] = Field(
        "auto",
        description="Buffer types of the host CPU's module for CPU-resident weights: amx (Xeons with "
        "AMX), avx512, avx2 (repacked Q4_0/Q4_K/IQ4_NL), plain (--no-repack); auto: this machine's CPU",
    )
    plot: str | None = path_field(
        None, description="Write the memory breakdown chart to this file: .png, .svg or .pdf by its suffix"
    )


class FitMemory(Result):
    """Bytes one device (the GPU, or host RAM) holds, by category."""

    weights: int
    kv_cache: int
    recurrent_state: int
    compute: int
    output: int
    total: int


class ModelFitResult(Result):
    """Where the model's layers and experts go, the memory per device, the llama-server flags and the speed
    ceiling (``models.fit`` fails when a pinned placement does not fit)."""

    model: str
    arch: str
    gpu: str | None
    vram_bytes: int
    margin_bytes: int
    settings: dict[str, Any] = Field(
        description="ctx per slot, parallel, cache types, ubatch, flash attention, kv_unified, swa_full"
    )
    n_layer: int
    attention_layers: int
    recurrent_layers: int
    n_gpu_layers: int
    max_gpu_layers: int
    n_cpu_moe: int
    gpu_memory: FitMemory
    host_memory: FitMemory
    flags: list[str] = Field(description="llama-server flags of the plan")
    tg_ceiling_tps: float | None = Field(description="Token generation ceiling from memory bandwidth, tok/s")
    bytes_per_token_gpu: int
    bytes_per_token_host: int
    notes: list[str]
    command: str
    fully_offloaded: bool
    fits: bool
    summary: list[str]
    exit_code: int
    plot: str | None = absent("The chart written with --plot (PNG, SVG or PDF)")


@operation(
    "models.fit",
    ModelFitParams,
    read_only=True,
    positional=("model",),
    cli="llamaforge.models.render:models_fit_cli",
    html="llamaforge.models.render:models_fit_html",
)
def models_fit_op(params: ModelFitParams, ctx: OperationContext) -> ModelFitResult:
    """Plan how a model fits on a GPU: layers, experts, KV cache, compute buffer, llama-server flags, speed."""
    from llamaforge.models.argument import resolve_model_file
    from llamaforge.serve.cpu_buffers import host_cpu_buffers
    from llamaforge.serve.fit import DoesNotFit, GiB, parse_size, plan_fit, summarize
    from llamaforge.serve.fit_chart import plot_path, save_fit_chart
    from llamaforge.serve.gpus import find_gpu
    from llamaforge.serve.memory import parse_device_memory

    plot = plot_path(params.plot) if params.plot is not None else None
    # the options before the model, which may be written first (the tiny one fetches the llama.cpp source)
    if params.gpu is not None:
        find_gpu(params.gpu)
    vram_bytes = parse_device_memory(params.vram, "--vram", gpu=True) if params.vram is not None else None
    margin_bytes = parse_size(params.margin, "--margin")
    path = resolve_model_file(params.model)
    # the first type given (an empty one too: the planner refuses it, it is no "leave it out")
    cache_k = next(v for v in (params.cache_type_k, params.cache_type, "f16") if v is not None)
    cache_v = next(v for v in (params.cache_type_v, params.cache_type, "f16") if v is not None)
    flash_attn: bool | Literal["auto"] = "auto" if params.flash_attn == "auto" else params.flash_attn == "on"
    plan = plan_fit(
        path,
        gpu=params.gpu,
        vram_bytes=vram_bytes,
        ctx=params.ctx,
        cache_type_k=cache_k,
        cache_type_v=cache_v,
        parallel=params.parallel,
        ubatch=params.ubatch,
        flash_attn=flash_attn,
        n_gpu_layers=params.n_gpu_layers,
        n_cpu_moe=params.n_cpu_moe,
        kv_unified=params.kv_unified,
        swa_full=params.swa_full,
        margin_bytes=margin_bytes,
        cpu_buffers=host_cpu_buffers() if params.cpu_buffers == "auto" else params.cpu_buffers,
    )
    data = plan.to_json()
    data["summary"] = summarize(plan)
    data["exit_code"] = 0 if plan.fits else DoesNotFit.exit_code  # a pinned placement that does not fit
    if plot is not None:
        refuse_if_read_only(f"write the plot {params.plot}")
        data["plot"] = str(save_fit_chart([data], plot))
        data["summary"].append(f"memory chart written to {data['plot']}")
    outcome = ModelFitResult.model_validate(data)
    if not plan.fits:
        raise OperationFailed(
            f"the pinned placement (-ngl {plan.n_gpu_layers}, --n-cpu-moe {plan.n_cpu_moe}) does not fit: it needs "
            f"{(plan.gpu_memory.total + plan.margin_bytes) / GiB:.2f} GiB with the margin, the GPU has "
            f"{plan.vram_bytes / GiB:.1f} GiB",
            result=outcome,
            exit_code=DoesNotFit.exit_code,
            hint="leave --n-gpu-layers/--n-cpu-moe out to search for a placement that fits",
        )
    return outcome
