"""The fit planner: will a GGUF model fit on a GPU at a given context, and with which llama-server flags?

The memory each placement needs comes from :mod:`llamaforge.serve.memory` (computed from the GGUF header the way
llama.cpp b11312 places and sizes its buffers); the planner searches the placements (``-ngl``, ``--n-cpu-moe``)
for the most that fits the card with its margin and writes the flags.

Host RAM (CPU weights, CPU layers' KV/state, the host compute and output buffers) is reported too. The
token-generation ceiling is memory bandwidth / bytes read per token as :func:`llamaforge.serve.bandwidth.
bytes_per_token` defines it, with the KV cache at depth ``--ctx`` (one slot at full context: the slowest
token), GPU part at the card's bandwidth, CPU part at the RAM bandwidth.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from llamaforge.core.errors import DoesNotFit, InvalidOption
from llamaforge.gguf.header import GGML_TYPES, GGUFHeader, read_header
from llamaforge.serve.bandwidth import Placement, bytes_per_token
from llamaforge.serve.cpu_buffers import CpuBuffers
from llamaforge.serve.gpus import find_gpu
from llamaforge.serve.launcher import CACHE_TYPES, LlamaFlags, Switch, check_cache_type
from llamaforge.serve.memory import DeviceMemory, GiB, MiB, Settings, estimate_memory, parse_size
from llamaforge.serve.shape import HYBRID_ARCHS, ModelShape, model_shape, weight_layout
from llamaforge.serve.synthetic import synthetic_header

__all__ = [
    "CACHE_TYPES",
    "DeviceMemory",
    "DoesNotFit",
    "FitPlan",
    "GiB",
    "MiB",
    "Settings",
    "estimate_memory",
    "parse_size",
    "plan_fit",
    "synthetic_header",
]

#: Default safety margin kept free on the GPU (the CUDA context, driver, fragmentation); llama.cpp's own
#: ``--fit`` keeps 1024 MiB free by default, on top of what the driver reports as free.
DEFAULT_MARGIN: Final = 1 * GiB
#: Default host RAM bandwidth for the CPU share of the token-generation ceiling (dual-channel DDR4-3200).
DEFAULT_RAM_BANDWIDTH_GBS: Final = 51.2
#: KV cache types llama.cpp accepts for ``-ctk`` / ``-ctv``.


@dataclass(frozen=True)
class FitPlan:
    """The answer of :func:`plan_fit`: placement, memory per device, flags and the speed ceiling."""

    model: str
    arch: str
    gpu: str | None
    vram_bytes: int
    margin_bytes: int
    settings: Settings
    n_layer: int
    attention_layers: int
    recurrent_layers: int
    n_gpu_layers: int
    max_gpu_layers: int
    n_cpu_moe: int
    gpu_memory: DeviceMemory
    host_memory: DeviceMemory
    flags: tuple[str, ...]
    tg_ceiling_tps: float | None
    bytes_per_token_gpu: int
    bytes_per_token_host: int
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        """True when the GPU total plus the margin fits the card (False only for a pinned placement)."""
        return self.gpu_memory.total + self.margin_bytes <= self.vram_bytes

    @property
    def fully_offloaded(self) -> bool:
        """True when every layer and every expert is on the GPU."""
        return self.n_gpu_layers == self.max_gpu_layers and self.n_cpu_moe == 0

    @property
    def command(self) -> str:
        """The recommended llama-server command line."""
        return shlex.join(["llama-server", *self.flags])

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (sizes in bytes)."""
        data = asdict(self)
        data["gpu_memory"]["total"] = self.gpu_memory.total
        data["host_memory"]["total"] = self.host_memory.total
        data["command"] = self.command
        data["fully_offloaded"] = self.fully_offloaded
        data["fits"] = self.fits
        data["flags"] = list(self.flags)
        data["notes"] = list(self.notes)
        return data


def check_settings(settings: Settings) -> None:
    if settings.ctx < 1 or settings.parallel < 1 or settings.ubatch < 1:
        raise InvalidOption("--ctx, --parallel and --ubatch must be positive")
    for flag, value in (("--cache-type-k", settings.cache_type_k), ("--cache-type-v", settings.cache_type_v)):
        try:
            check_cache_type(value)
        except ValueError as error:
            raise InvalidOption(f"{flag} {error}") from None
    if not settings.flash_attn and settings.cache_type_v not in ("f32", "f16", "bf16"):
        raise InvalidOption(
            f"a quantized V cache ({settings.cache_type_v}) needs flash attention",
            hint="use --flash-attn on (llama.cpp refuses -ctv q* with -fa off)",
        )


def check_cache_blocks(shape: ModelShape, settings: Settings) -> None:
    # llama_init_from_model refuses a quantized cache whose block does not divide a layer's head size (the
    # sliding-window layers' own sizes included)
    k_dims = {
        shape.head_dim_k,
        shape.head_dim_k_swa if shape.swa and shape.head_dim_k_swa else shape.head_dim_k,
    }
    v_dims = {
        shape.head_dim_v,
        shape.head_dim_v_swa if shape.swa and shape.head_dim_v_swa else shape.head_dim_v,
    }
    for which, type_name, dims in (
        ("K", settings.cache_type_k, k_dims),
        ("V", settings.cache_type_v, v_dims),
    ):
        block = next(t for t in GGML_TYPES.values() if t.name.lower() == type_name).block_size
        head_dim = next((d for d in sorted(dims) if d % block), 0)
        if head_dim:
            raise InvalidOption(
                f"{which} cache type {type_name} (blocks of {block}) does not divide the head size {head_dim}",
                hint="llama.cpp refuses it; use f16 or bf16 for this model",
            )


def _flags(
    model: str, settings: Settings, ngl: int, n_cpu_moe: int, flash_attn_flag: Switch
) -> tuple[str, ...]:
    flags = LlamaFlags(
        n_gpu_layers=ngl,
        n_cpu_moe=n_cpu_moe or None,
        ctx=settings.ctx * settings.parallel,
        parallel=settings.parallel,
        cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v,
        flash_attn=flash_attn_flag,
        ubatch=settings.ubatch if settings.ubatch != 512 else None,
        kv_unified=True if settings.kv_unified else None,
        swa_full=settings.swa_full,
    )
    return ("-m", model, *flags.args())


def load_model_header(model: str | Path | GGUFHeader) -> tuple[str, GGUFHeader]:
    if isinstance(model, GGUFHeader):
        return model.source, model
    path = Path(model)
    if not path.is_file():
        raise InvalidOption(f"model file {path} does not exist")
    return str(path), read_header(path)


def check_servable(name: str, header: GGUFHeader) -> None:
    """Refuse a GGUF with no tensors (a vocab-only file, as llama.cpp's models/ggml-vocab-*.gguf): there is no
    model to place, so every figure of a plan would be made up; and one whose tensor shapes llama.cpp's loader
    refuses for its metadata (``models.verify``'s shape check): a plan would print flags for a model that does
    not load."""
    if not header.tensors:
        raise InvalidOption(
            f"{Path(name).name} has no tensors: a vocab-only file cannot be served",
            hint="give the model's GGUF with its weights (`invoke models.inspect FILE` shows what a file holds)",
        )
    from llamaforge.models.inspect import layer_kinds
    from llamaforge.models.tensor_shapes import check_tensor_shapes

    wrong = [
        finding for finding in check_tensor_shapes(header, layer_kinds(header)) if finding.status == "fail"
    ]
    if wrong:
        more = f" (and {len(wrong) - 1} more tensor kinds)" if len(wrong) > 1 else ""
        raise InvalidOption(
            f"{Path(name).name}: {wrong[0].message}{more}",
            hint=f"`invoke models.verify {name}` lists every finding; the file's metadata or tensors are damaged",
        )


def plan_fit(
    model: str | Path | GGUFHeader,
    *,
    ctx: int,
    gpu: str | None = None,
    vram_bytes: int | None = None,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    parallel: int = 1,
    ubatch: int = 512,
    flash_attn: bool | Literal["auto"] = True,
    n_gpu_layers: int | None = None,
    n_cpu_moe: int | None = None,
    kv_unified: bool = False,
    swa_full: bool = False,
    cpu_buffers: CpuBuffers = "plain",
    margin_bytes: int = DEFAULT_MARGIN,
    ram_bandwidth_gbs: float = DEFAULT_RAM_BANDWIDTH_GBS,
) -> FitPlan:
    """Plan how ``model`` (a GGUF path or a parsed header) runs in llama-server on one GPU.

    Give the card by name (``gpu="rtx3090"``, from ``recipes/gpus.toml``) or its memory (``vram_bytes``).
    ``ctx`` is the context of each of the ``parallel`` slots. The planner searches the largest ``-ngl`` and,
    for MoE models, the smallest ``--n-cpu-moe`` whose GPU total plus ``margin_bytes`` fits; pass
    ``n_gpu_layers`` / ``n_cpu_moe`` to evaluate a placement of your own instead. ``flash_attn="auto"`` is
    planned as on (what llama.cpp picks on CUDA for these models). ``kv_unified`` / ``swa_full`` plan
    ``--kv-unified`` / ``--swa-full`` (see :class:`Settings`); ``cpu_buffers`` the extra buffer types of the
    host CPU's module that CPU-resident weights go to (:mod:`llamaforge.serve.cpu_buffers`). Raises
    :class:`DoesNotFit` (with the host RAM a CPU-only run needs) when not even one layer fits,
    InvalidOption for bad settings or an unknown GPU.
    """
    card = find_gpu(gpu) if gpu is not None else None
    if card is not None and vram_bytes is not None:
        raise InvalidOption("give either --gpu or --vram, not both")
    if card is None and vram_bytes is None:
        raise InvalidOption("say which GPU: --gpu NAME (e.g. rtx3090) or --vram SIZE (e.g. 24GiB)")
    if card is not None and card.vram_bytes is None:
        raise InvalidOption(
            f"the GPU table has no memory size for {card.name}",
            hint="give the memory with --vram SIZE (e.g. 24GiB) instead of --gpu",
        )
    vram = card.vram_bytes if card is not None and card.vram_bytes is not None else int(vram_bytes or 0)
    settings = Settings(
        ctx,
        parallel,
        cache_type_k,
        cache_type_v,
        ubatch,
        flash_attn is not False,
        kv_unified,
        swa_full,
        cpu_buffers,
    )
    check_settings(settings)
    name, header = load_model_header(model)
    check_servable(name, header)
    shape = model_shape(header)
    check_cache_blocks(shape, settings)
    if n_cpu_moe and not shape.is_moe:
        raise InvalidOption(
            f"--n-cpu-moe {n_cpu_moe}: {Path(name).name} ({shape.arch}) is a dense model, it has no experts to "
            "keep on the CPU",
            hint="drop --n-cpu-moe; --n-gpu-layers N keeps whole layers on the CPU instead",
        )
    layout = weight_layout(shape, header.tensors)
    max_ngl = shape.n_layer_all + 1
    budget = vram - margin_bytes
    if vram <= 0:
        raise InvalidOption(
            f"--vram {vram / GiB:.1f} GiB: a GPU has memory to plan for",
            hint="give its size, e.g. --vram 24GiB",
        )
    if budget <= 0:
        raise InvalidOption(
            f"--margin {margin_bytes / GiB:.1f} GiB keeps all of the GPU's {vram / GiB:.1f} GiB free",
            hint="the margin is headroom for the CUDA context and the driver, e.g. 1GiB",
        )

    def evaluate(ngl: int, ncmoe: int) -> tuple[DeviceMemory, DeviceMemory]:
        return estimate_memory(
            shape, header.tensors, settings, n_gpu_layers=ngl, n_cpu_moe=ncmoe, layout=layout
        )

    candidates: list[tuple[int, int]]
    if n_gpu_layers is not None or n_cpu_moe is not None:
        candidates = [(min(n_gpu_layers if n_gpu_layers is not None else max_ngl, max_ngl), n_cpu_moe or 0)]
    elif shape.is_moe:
        # experts to the CPU first (attention and the shared weights stay fast), then whole layers
        candidates = [(max_ngl, m) for m in range(shape.n_layer + 1)]
        candidates += [(ngl, shape.n_layer) for ngl in range(max_ngl - 1, 0, -1)]
    else:
        candidates = [(ngl, 0) for ngl in range(max_ngl, 0, -1)]
    chosen = next((c for c in candidates if evaluate(*c)[0].total <= budget), None)
    pinned = n_gpu_layers is not None or n_cpu_moe is not None
    if chosen is None and not pinned:
        _, cpu_only = evaluate(0, 0)
        raise DoesNotFit(
            f"{Path(name).name} does not fit in {vram / GiB:.1f} GiB of GPU memory (keeping "
            f"{margin_bytes / GiB:.1f} GiB free) at {ctx} context x {parallel} slot(s), not even one layer",
            hint=f"a CPU-only run (-ngl 0) needs about {cpu_only.total / GiB:.1f} GiB of RAM; or lower --ctx, "
            "quantize the KV cache (--cache-type q8_0), or pick a smaller quant",
        )
    ngl, ncmoe = chosen if chosen is not None else candidates[0]
    gpu_memory, host_memory = evaluate(ngl, ncmoe)
    notes = []
    if chosen is None:
        notes.append(
            f"the placement you pinned needs {gpu_memory.total / GiB:.2f} GiB on the GPU, more than the "
            f"{budget / GiB:.2f} GiB available after the margin"
        )
    if ctx > shape.n_ctx_train > 0:
        notes.append(f"--ctx {ctx} exceeds the trained context ({shape.n_ctx_train}); llama.cpp warns")
    if flash_attn == "auto":
        notes.append("flash attention 'auto' planned as on (llama.cpp enables it on CUDA for this model)")
    if cpu_buffers != "plain" and host_memory.weights:
        notes.append(
            f"CPU-resident weights planned in the {cpu_buffers} CPU module's buffer types (repacked/AMX copies "
            "are counted beside the mapped file range, as llama.cpp reports them; --no-repack: plain)"
        )
    if shape.arch in HYBRID_ARCHS:
        notes.append(
            f"hybrid model: KV cache for {len(shape.attention_layers)} attention layers only; "
            f"{len(shape.recurrent_layers)} DeltaNet layers keep a fixed state per slot"
        )
    if shape.swa:
        swa_layers = sum(shape.swa)
        notes.append(
            f"sliding-window model: {swa_layers} of {len(shape.attention_layers)} attention layers keep "
            f"{settings.swa_cells(shape.n_swa)} KV cells per stream (window {shape.n_swa})"
            + (" (--swa-full: full size)" if swa_full else "")
        )
    if shape.n_layer_kv >= 0:
        notes.append(
            f"{shape.n_layer - shape.n_layer_kv} of {shape.n_layer} layers reuse an earlier layer's KV cache "
            "(no cache of their own)"
        )
    if shape.mla:
        notes.append(
            f"MLA: the KV cache holds one latent K row of {shape.kv_widths(0)[0]} values per cell and layer, no V"
        )
    read = bytes_per_token(
        header,
        kv_depth=ctx,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        placement=Placement(ngl, ncmoe),
    )
    gpu_bytes, host_bytes = read.gpu, read.host
    bandwidth = card.bandwidth_gbs if card is not None else None
    ceiling = None
    if bandwidth:
        seconds = gpu_bytes / (bandwidth * 1e9) + host_bytes / (ram_bandwidth_gbs * 1e9)
        ceiling = 1.0 / seconds if seconds > 0 else math.inf
        notes.append(f"tg ceiling: bytes read per token with the KV cache at depth {ctx} (one full slot)")
    fa_flag: Switch = "auto" if flash_attn == "auto" else ("on" if settings.flash_attn else "off")
    return FitPlan(
        model=name,
        arch=shape.arch,
        gpu=card.name if card else None,
        vram_bytes=vram,
        margin_bytes=margin_bytes,
        settings=settings,
        n_layer=shape.n_layer,
        attention_layers=len(shape.attention_layers),
        recurrent_layers=len(shape.recurrent_layers),
        n_gpu_layers=ngl,
        max_gpu_layers=max_ngl,
        n_cpu_moe=ncmoe,
        gpu_memory=gpu_memory,
        host_memory=host_memory,
        flags=_flags(name, settings, ngl, ncmoe, fa_flag),
        tg_ceiling_tps=ceiling,
        bytes_per_token_gpu=gpu_bytes,
        bytes_per_token_host=host_bytes,
        notes=tuple(notes),
    )


def summarize(plan: FitPlan) -> list[str]:
    """A few human lines about ``plan`` (GiB, the flags, the speed ceiling)."""
    gpu, host = plan.gpu_memory, plan.host_memory
    where = (
        "all layers on the GPU"
        if plan.n_gpu_layers == plan.max_gpu_layers
        else (f"{plan.n_gpu_layers}/{plan.max_gpu_layers} layers on the GPU")
    )
    if plan.n_cpu_moe:
        where += f", experts of the first {plan.n_cpu_moe} layers on the CPU"
    lines = [
        f"{Path(plan.model).name} ({plan.arch}): {where}",
        f"GPU {gpu.total / GiB:.2f} of {plan.vram_bytes / GiB:.1f} GiB (weights {gpu.weights / GiB:.2f}, KV "
        f"{gpu.kv_cache / GiB:.2f}, recurrent {gpu.recurrent_state / GiB:.3f}, compute {gpu.compute / GiB:.2f}; "
        f"{plan.margin_bytes / GiB:.1f} GiB kept free)",
        f"host RAM {host.total / GiB:.2f} GiB (weights {host.weights / GiB:.2f}, KV {host.kv_cache / GiB:.2f}, "
        f"compute+output {(host.compute + host.output) / GiB:.2f})",
        plan.command,
    ]
    if plan.tg_ceiling_tps is not None:
        lines.append(f"token generation ceiling ~{plan.tg_ceiling_tps:.0f} tok/s (memory bandwidth bound)")
    lines.extend(plan.notes)
    return lines
