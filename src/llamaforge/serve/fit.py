"""The fit planner: will a GGUF model fit on a GPU at a given context, and with which llama-server flags?

Everything is computed from the GGUF header (tensor sizes, hyper-parameters) the way llama.cpp b11312 places
and sizes its buffers:

* **weights** per device: ``token_embd`` stays on the CPU; with ``-ngl N`` the last ``N - 1`` repeating layers
  and the output layer (``output_norm``, ``output``; a tied ``token_embd`` is duplicated there) are on the GPU
  (``i_gpu_start = n_layer + 1 - N`` in ``llama_model_base::load_tensors``); ``--n-cpu-moe M`` keeps the expert
  tensors (``ffn_{up,down,gate,gate_up}_exps``) of layers ``0..M-1`` on the CPU.
* **KV cache** only for full-attention layers (hybrid qwen3next/qwen35/qwen35moe: layer ``i`` is recurrent unless
  ``(i + 1) % full_attention_interval == 0``), ``row_size(type, n_head_kv * head_dim)`` per cell, K and V, on
  the device of its layer; ``n_ctx`` padded to 256, one stream per sequence (``--parallel`` without
  ``--kv-unified``: ``n_ctx / n_seq`` cells each, padded to 256) or one shared stream (``--kv-unified``, also
  llama-server's default without ``--parallel``: 4 slots). Sliding-window layers (gemma2/3, cohere2, olmo2,
  gpt-oss; :data:`~llamaforge.serve.shape.SWA_ARCHS`) have their own cache (``llama_kv_cache_iswa``) of
  ``pad(min(n_ctx_seq, n_swa * (n_seq if unified else 1) + n_ubatch), 256)`` cells per stream, full-size with
  ``--swa-full``, and their own attention mask. Layers past ``n_layer_kv_from_start`` (gemma3n, gemma4:
  :data:`~llamaforge.serve.shape.SHARED_KV_ARCHS`) reuse an earlier layer's cache and hold none; MLA models
  (deepseek2) cache one latent K row (``key_length``) per cell and no V, with flash attention or without;
  without flash attention every V row is as wide as the widest layer's (``n_embd_v_gqa_max``).
* **recurrent state** for DeltaNet layers: ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` (conv) plus
  ``d_state * d_inner`` (state) F32 values per layer and sequence (``llama_memory_recurrent``).
* **compute buffer**: what ggml-alloc reserves for the worst-case graph (``n_ubatch`` tokens). For the archs of
  :data:`~llamaforge.serve.compute_graph.GRAPH_ARCHS` (qwen3, gemma2, gemma3, dense MLA deepseek2) the graph is
  rebuilt and replayed through ggml-alloc's best-fit allocator (:mod:`llamaforge.serve.compute_graph`: the
  holes count). For the others: the attention
  mask (``n_ctx_seq * n_ubatch``, F16 with flash attention, F32 without) and, without flash attention, the
  ``n_head * n_ctx_seq * n_ubatch`` F32 score matrix are exact; the activations of one layer are a per-token
  model (the largest of an attention, FFN, MoE and DeltaNet phase) fitted to the buffers stock llama.cpp
  b11312 reports for 300 generated models of random shapes (on 100 further shapes, the total compute buffer
  at context 512, where that model dominates: rms error 7.7 %, worst 26 %; see ``benchmarks/
  fit_accuracy.py``); the
  logits of the ``--parallel`` outputs (llama-server reserves one per slot); with partial offload, the
  largest CPU-resident weight that ggml copies to the GPU when it offloads a batched op.

Host RAM (CPU weights, CPU layers' KV/state, the host compute and output buffers) is reported too. The
token-generation ceiling is memory bandwidth / bytes read per token as :func:`llamaforge.serve.bandwidth.
bytes_per_token` defines it, with the KV cache at depth ``--ctx`` (one slot at full context: the slowest
token), GPU part at the card's bandwidth, CPU part at the RAM bandwidth.
"""

from __future__ import annotations

import math
import re
import shlex
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from llamaforge.core.errors import DoesNotFit, InvalidOption, ToolFailed
from llamaforge.core.validation import suggest
from llamaforge.gguf.header import GGML_TYPES, GGUFHeader, TensorInfo, read_header
from llamaforge.runners.process import LOCAL, ProcessRunner
from llamaforge.serve.bandwidth import Placement, bytes_per_token
from llamaforge.serve.compute_graph import GRAPH_ARCHS, GraphSettings, simulate_compute
from llamaforge.serve.gpus import find_gpu
from llamaforge.serve.launcher import LlamaFlags, LlamaServer, ServerLaunch, Switch
from llamaforge.serve.loadlog import LoadLog, parse_load_log
from llamaforge.serve.shape import (
    HYBRID_ARCHS,
    SWA_ARCHS,
    ModelShape,
    WeightLayout,
    gpu_layers,
    model_shape,
    row_bytes,
    weight_layout,
)

if TYPE_CHECKING:
    from llamaforge.gguf.tiny import TinyModelSpec

__all__ = [
    "CACHE_TYPES",
    "DeviceMemory",
    "DoesNotFit",
    "FitPlan",
    "Settings",
    "estimate_memory",
    "parse_size",
    "plan_fit",
    "synthetic_header",
]

GiB: Final = 1 << 30
MiB: Final = 1 << 20
#: Default safety margin kept free on the GPU (the CUDA context, driver, fragmentation); llama.cpp's own
#: ``--fit`` keeps 1024 MiB free by default, on top of what the driver reports as free.
DEFAULT_MARGIN: Final = 1 * GiB
#: Default host RAM bandwidth for the CPU share of the token-generation ceiling (dual-channel DDR4-3200).
DEFAULT_RAM_BANDWIDTH_GBS: Final = 51.2
#: KV cache types llama.cpp accepts for ``-ctk`` / ``-ctv``.
CACHE_TYPES: Final = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# Archs whose attention layers project the query and an output gate together (2 x n_head x head_dim).
_GATED_Q_ARCHS: Final = frozenset({"qwen3next", "qwen35", "qwen35moe"})
# Archs that norm each block's output again before the residual add (Gemma's post-attention and post-FFN
# norms): one more n_embd-wide activation per token alive in every phase (fitted on gemma2: +2.0 MiB at
# n_embd 1024 x 512 tokens).
_POST_NORM_ARCHS: Final = frozenset({"gemma2", "gemma3"})
# llama-server defaults (b11312): -b 2048; ops with batches of at least 32 rows are offloaded to the GPU.
_N_BATCH: Final = 2048
_OP_OFFLOAD_MIN_BATCH: Final = 32

# Per-token activation model of one layer in F32 values (see the module docstring): coefficients of
# n_embd (E), query+gate width (Q), KV width (K), FFN width (F), active expert width (U = used * n_ff_exp),
# used * n_embd (UE), shared-expert width (S) and DeltaNet conv channels (C). Fitted (least squares on the
# relative error, rounded to quarters) to the compute buffers of 300 random-shape models at n_ubatch 512:
# `python benchmarks/fit_accuracy.py --random-shapes 100 --refit` redoes it.
_ATTN_PHASE: Final = {"E": 3.25, "Q": 2.0, "K": 0.75}
_FFN_PHASE: Final = {"E": 2.25, "F": 3.25}
_MOE_UP_PHASE: Final = {"E": 2.5, "U": 3.25}  # router, gate/up projections of the used experts
_MOE_DOWN_PHASE: Final = {"E": 2.75, "UE": 1.25, "U": 0.75}  # their down projections and weighting
_SHARED_EXPERT_PHASE: Final = {"E": 3.75, "S": 3.25}
_RECURRENT_PHASE: Final = {"E": 3.0, "C": 3.0}


_SIZE_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``24GiB``, ``24 GB`` (taken as GiB, as GPU memory is sold), ``24576MiB``, ``512M`` or a number."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(text)
    if not match:
        raise InvalidOption(f"cannot read the size {text!r}", hint="e.g. 24GiB, 12GB, 24576MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[unit]
    if scale == 1 and number < 4096:  # a bare small number means GiB, not bytes
        scale = GiB
    return int(number * scale)


# --------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """The llama-server settings a plan is made for; ``ctx`` is the context of each of ``parallel`` slots.

    ``kv_unified``: one KV stream shared by all slots (``--kv-unified``; llama-server's default when
    ``--parallel`` is not given: 4 slots, unified) instead of one stream per slot. ``swa_full``: full-size
    caches for the sliding-window layers too (``--swa-full``).
    """

    ctx: int
    parallel: int = 1
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    ubatch: int = 512
    flash_attn: bool = True
    kv_unified: bool = False
    swa_full: bool = False

    @property
    def n_ctx(self) -> int:
        """All KV cells of a full-attention layer (``cparams.n_ctx``, padded to 256)."""
        return self.n_ctx_seq * self.n_stream

    @property
    def n_stream(self) -> int:
        """KV streams: one per slot, or one shared stream with ``kv_unified``."""
        return 1 if self.kv_unified else self.parallel

    @property
    def n_ctx_seq(self) -> int:
        """KV cells per stream, padded as llama_context pads them (to 256)."""
        total = _pad(self.ctx * self.parallel, 256)
        return total if self.kv_unified else _pad(total // self.parallel, 256)

    @property
    def n_tokens(self) -> int:
        """Tokens of the worst-case (reserve) batch: min(n_ctx, n_batch, n_ubatch)."""
        return min(self.n_ctx, _N_BATCH, self.ubatch)

    def swa_cells(self, n_swa: int) -> int:
        """KV cells per stream of a sliding-window layer (``llama_kv_cache_iswa``): the window of every
        sequence the stream holds plus one ubatch, padded to 256, at most the full size."""
        if self.swa_full:
            return self.n_ctx_seq
        return _pad(
            min(self.n_ctx_seq, n_swa * (self.parallel if self.kv_unified else 1) + self.n_tokens), 256
        )


def _pad(value: int, to: int) -> int:
    return -(-value // to) * to


# ----------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device (the GPU, or host RAM) holds, by category."""

    weights: int = 0
    kv_cache: int = 0
    recurrent_state: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        """All categories together."""
        return self.weights + self.kv_cache + self.recurrent_state + self.compute + self.output


def _phase_values(shape: ModelShape) -> dict[str, float]:
    """Per-token F32 activation values of each layer kind (the fitted ggml-alloc model)."""
    q = shape.n_head * shape.head_dim_k * (2 if shape.arch in _GATED_Q_ARCHS else 1)
    k = shape.n_head_kv * shape.head_dim_k
    e = shape.n_embd
    values = {"attention": _ATTN_PHASE["E"] * e + _ATTN_PHASE["Q"] * q + _ATTN_PHASE["K"] * k}
    if shape.is_moe:
        u, ue = shape.n_expert_used * shape.n_ff_exp, shape.n_expert_used * e
        up = _MOE_UP_PHASE["E"] * e + _MOE_UP_PHASE["U"] * u
        down = _MOE_DOWN_PHASE["E"] * e + _MOE_DOWN_PHASE["UE"] * ue + _MOE_DOWN_PHASE["U"] * u
        shared = _SHARED_EXPERT_PHASE["E"] * e + _SHARED_EXPERT_PHASE["S"] * shape.n_ff_shexp
        values["ffn"] = max(up, down, shared if shape.n_ff_shexp else 0)
    else:
        values["ffn"] = _FFN_PHASE["E"] * e + _FFN_PHASE["F"] * shape.n_ff
    conv = 2 * shape.ssm_group_count * shape.ssm_state_size + shape.ssm_inner_size
    values["recurrent"] = _RECURRENT_PHASE["E"] * e + _RECURRENT_PHASE["C"] * conv
    if shape.arch in _POST_NORM_ARCHS:
        values = {phase: value + e for phase, value in values.items()}
    return values


def _layer_peak(shape: ModelShape, layers: Iterable[int], settings: Settings) -> int:
    """Peak activation bytes of the given layers (without the mask), kq scores included without FA."""
    layers = list(layers)
    if not layers:
        return 0
    t = settings.n_tokens
    values = _phase_values(shape)
    has_attention = any(not shape.recurrent[il] for il in layers if il < shape.n_layer)
    has_recurrent = any(shape.recurrent[il] for il in layers if il < shape.n_layer)
    peak = values["ffn"] * t * 4
    if has_attention:
        attention = values["attention"] * t * 4
        if not settings.flash_attn:  # KQ scores, F32, over the largest cache these layers attend
            full = any(not shape.is_swa(il) for il in layers if il < shape.n_layer)
            cells = settings.n_ctx_seq if full else settings.swa_cells(shape.n_swa)
            attention += shape.n_head * cells * t * 4
        peak = max(peak, attention)
    if has_recurrent:
        peak = max(peak, values["recurrent"] * t * 4)
    return int(peak)


def _mask_bytes(shape: ModelShape, settings: Settings) -> int:
    """The attention masks: one over the full cache, one over the sliding-window cache where there is one."""
    layers = shape.attention_layers
    cells = 0
    if any(not shape.is_swa(il) for il in layers):
        cells += settings.n_ctx_seq
    if any(shape.is_swa(il) for il in layers):
        cells += settings.swa_cells(shape.n_swa)
    return cells * settings.n_tokens * (2 if settings.flash_attn else 4)


def _graph_compute(
    shape: ModelShape, layers: Iterable[int], settings: Settings, *, with_output: bool
) -> int | None:
    """The compute buffer replayed through ggml-alloc (:mod:`~llamaforge.serve.compute_graph`) for the archs
    whose graph it follows; None for the others (the fitted per-token model applies)."""
    layers = list(layers)
    if (
        shape.arch not in GRAPH_ARCHS
        or not layers
        or shape.is_moe
        or (shape.arch == "deepseek2" and not shape.mla)
    ):
        return None  # not a replayed graph, or no trunk layer here: the formulas below
    graph = GraphSettings(
        n_tokens=settings.n_tokens, n_outputs=min(settings.parallel, settings.n_tokens),
        full_cells=settings.n_ctx_seq, swa_cells=settings.swa_cells(shape.n_swa),
        flash_attn=settings.flash_attn, cache_type_k=settings.cache_type_k,
    )  # fmt: skip
    return simulate_compute(shape, layers, graph, with_output=with_output)


def _logits_phase(shape: ModelShape, settings: Settings) -> int:
    return shape.n_vocab * settings.parallel * 4 + settings.n_tokens * shape.n_embd * 4


def _kv_layer_bytes(shape: ModelShape, settings: Settings, il: int) -> int:
    """Layer ``il``'s KV cache: 0 when it reuses another layer's; K only with MLA; without flash attention
    (V stored transposed) every V row as wide as the widest (``n_embd_v_gqa_max``)."""
    if not shape.has_kv(il):
        return 0
    per_stream = settings.swa_cells(shape.n_swa) if shape.is_swa(il) else settings.n_ctx_seq
    cells = per_stream * settings.n_stream
    k_width, v_width = shape.kv_widths(il)
    if v_width and not settings.flash_attn:
        v_width = max(shape.kv_widths(layer)[1] for layer in range(shape.n_layer))
    k = row_bytes(settings.cache_type_k, k_width)
    v = row_bytes(settings.cache_type_v, v_width) if v_width else 0
    return (k + v) * cells


def _recurrent_layer_bytes(shape: ModelShape, settings: Settings) -> int:
    return (shape.conv_state_values + shape.ssm_state_values) * 4 * max(1, settings.parallel)


def estimate_memory(
    shape: ModelShape,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    *,
    n_gpu_layers: int,
    n_cpu_moe: int = 0,
    layout: WeightLayout | None = None,
) -> tuple[DeviceMemory, DeviceMemory]:
    """``(gpu, host)`` memory for ``-ngl n_gpu_layers --n-cpu-moe n_cpu_moe`` (``n_gpu_layers=0``: CPU only)."""
    layout = layout or weight_layout(shape, tensors)
    on_gpu_layers, output_on_gpu = gpu_layers(shape, n_gpu_layers)
    cpu_layers = [il for il in range(shape.n_layer) if il not in on_gpu_layers]
    weights = {"gpu": 0, "host": layout.token_embd}
    kv = {"gpu": 0, "host": 0}
    state = {"gpu": 0, "host": 0}
    rs_layer = _recurrent_layer_bytes(shape, settings)
    offloaded_weight = 0  # largest CPU weight an offloaded op copies to the GPU
    for il in range(shape.n_layer):
        on_gpu = il in on_gpu_layers
        experts_on_gpu = on_gpu and il >= n_cpu_moe
        weights["gpu" if on_gpu else "host"] += layout.dense[il]
        weights["gpu" if experts_on_gpu else "host"] += layout.experts[il]
        if not experts_on_gpu:
            offloaded_weight = max(offloaded_weight, layout.largest_expert[il])
        if not on_gpu:
            offloaded_weight = max(offloaded_weight, layout.largest_dense[il])
        if shape.recurrent[il]:
            state["gpu" if on_gpu else "host"] += rs_layer
        else:
            kv["gpu" if on_gpu else "host"] += _kv_layer_bytes(shape, settings, il)
    weights["gpu" if output_on_gpu else "host"] += layout.output + layout.other
    if layout.tied and output_on_gpu:  # on the CPU the duplicate maps the same file bytes
        weights["gpu"] += layout.token_embd

    mask, logits = _mask_bytes(shape, settings), _logits_phase(shape, settings)
    output_buffer = shape.n_vocab * settings.parallel * 4  # logits of one output per slot, host memory
    if not on_gpu_layers and not output_on_gpu:  # CPU only
        host_compute = _graph_compute(shape, range(shape.n_layer), settings, with_output=True)
        if host_compute is None:
            host_compute = max(mask + _layer_peak(shape, range(shape.n_layer), settings), logits)
        host = DeviceMemory(weights["host"], kv["host"], state["host"], host_compute, output_buffer)
        return DeviceMemory(), host
    trunk_on_gpu = sorted(il for il in on_gpu_layers if il < shape.n_layer)
    gpu_graph = _graph_compute(shape, trunk_on_gpu, settings, with_output=output_on_gpu)
    gpu_compute = (
        gpu_graph
        if gpu_graph is not None
        else max(mask + _layer_peak(shape, sorted(on_gpu_layers), settings), logits if output_on_gpu else 0)
    )
    if settings.n_tokens >= _OP_OFFLOAD_MIN_BATCH:
        gpu_compute += offloaded_weight
    host_compute = mask + settings.n_tokens * shape.n_embd * 4  # inputs staged in host memory
    if cpu_layers:
        host_compute += _layer_peak(shape, cpu_layers, settings)
    if not output_on_gpu:
        host_compute = max(host_compute, logits)
    gpu = DeviceMemory(weights["gpu"], kv["gpu"], state["gpu"], gpu_compute)
    host = DeviceMemory(weights["host"], kv["host"], state["host"], host_compute, output_buffer)
    return gpu, host


# ------------------------------------------------------------------------------------------------- plan


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


def _check_settings(settings: Settings) -> None:
    if settings.ctx < 1 or settings.parallel < 1 or settings.ubatch < 1:
        raise InvalidOption("--ctx, --parallel and --ubatch must be positive")
    for flag, value in (("--cache-type-k", settings.cache_type_k), ("--cache-type-v", settings.cache_type_v)):
        if value not in CACHE_TYPES:
            raise InvalidOption(
                f"{flag} {value!r} is not a KV cache type llama.cpp knows",
                hint=suggest(value, CACHE_TYPES, end=" ") + "one of " + ", ".join(CACHE_TYPES),
            )
    if not settings.flash_attn and settings.cache_type_v not in ("f32", "f16", "bf16"):
        raise InvalidOption(
            f"a quantized V cache ({settings.cache_type_v}) needs flash attention",
            hint="use --flash-attn on (llama.cpp refuses -ctv q* with -fa off)",
        )


def _check_cache_blocks(shape: ModelShape, settings: Settings) -> None:
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
        n_gpu_layers=ngl, n_cpu_moe=n_cpu_moe or None, ctx=settings.ctx * settings.parallel,
        parallel=settings.parallel, cache_type_k=settings.cache_type_k, cache_type_v=settings.cache_type_v,
        flash_attn=flash_attn_flag, ubatch=settings.ubatch if settings.ubatch != 512 else None,
        kv_unified=True if settings.kv_unified else None, swa_full=settings.swa_full,
    )  # fmt: skip
    return ("-m", model, *flags.args())


def _load(model: str | Path | GGUFHeader) -> tuple[str, GGUFHeader]:
    if isinstance(model, GGUFHeader):
        return model.source, model
    path = Path(model)
    if not path.is_file():
        raise InvalidOption(f"model file {path} does not exist")
    return str(path), read_header(path)


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
    margin_bytes: int = DEFAULT_MARGIN,
    ram_bandwidth_gbs: float = DEFAULT_RAM_BANDWIDTH_GBS,
) -> FitPlan:
    """Plan how ``model`` (a GGUF path or a parsed header) runs in llama-server on one GPU.

    Give the card by name (``gpu="rtx3090"``, from ``recipes/gpus.toml``) or its memory (``vram_bytes``).
    ``ctx`` is the context of each of the ``parallel`` slots. The planner searches the largest ``-ngl`` and,
    for MoE models, the smallest ``--n-cpu-moe`` whose GPU total plus ``margin_bytes`` fits; pass
    ``n_gpu_layers`` / ``n_cpu_moe`` to evaluate a placement of your own instead. ``flash_attn="auto"`` is
    planned as on (what llama.cpp picks on CUDA for these models). ``kv_unified`` / ``swa_full`` plan
    ``--kv-unified`` / ``--swa-full`` (see :class:`Settings`). Raises :class:`DoesNotFit` (with the host
    RAM a CPU-only run needs) when not even one layer fits, InvalidOption for bad settings or an unknown GPU.
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
        ctx, parallel, cache_type_k, cache_type_v, ubatch, flash_attn is not False, kv_unified, swa_full
    )
    _check_settings(settings)
    name, header = _load(model)
    shape = model_shape(header)
    _check_cache_blocks(shape, settings)
    layout = weight_layout(shape, header.tensors)
    max_ngl = shape.n_layer_all + 1
    budget = vram - margin_bytes

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
    read = bytes_per_token(header, kv_depth=ctx, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                           placement=Placement(ngl, ncmoe))  # fmt: skip
    gpu_bytes, host_bytes = read.gpu, read.host
    bandwidth = card.bandwidth_gbs if card is not None else None
    ceiling = None
    if bandwidth:
        seconds = gpu_bytes / (bandwidth * 1e9) + host_bytes / (ram_bandwidth_gbs * 1e9)
        ceiling = 1.0 / seconds if seconds > 0 else math.inf
        notes.append(f"tg ceiling: bytes read per token with the KV cache at depth {ctx} (one full slot)")
    fa_flag: Switch = "auto" if flash_attn == "auto" else ("on" if settings.flash_attn else "off")
    return FitPlan(
        model=name, arch=shape.arch, gpu=card.name if card else None, vram_bytes=vram,
        margin_bytes=margin_bytes, settings=settings, n_layer=shape.n_layer,
        attention_layers=len(shape.attention_layers), recurrent_layers=len(shape.recurrent_layers),
        n_gpu_layers=ngl, max_gpu_layers=max_ngl, n_cpu_moe=ncmoe, gpu_memory=gpu_memory,
        host_memory=host_memory, flags=_flags(name, settings, ngl, ncmoe, fa_flag), tg_ceiling_tps=ceiling,
        bytes_per_token_gpu=gpu_bytes, bytes_per_token_host=host_bytes, notes=tuple(notes),
    )  # fmt: skip


# ------------------------------------------------------------------------------------ synthetic headers


def synthetic_header(
    spec: TinyModelSpec,
    *,
    n_vocab: int,
    weight_type: str = "Q4_K",
    output_type: str = "Q6_K",
    name: str | None = None,
) -> GGUFHeader:
    """A header-only description of a model shaped like ``spec`` (no file): to plan a model from its published
    hyper-parameters before downloading it, and for benchmarks. Matrices whose rows fit ``weight_type``'s block
    get that type (``output.weight``: ``output_type``), the rest F16; 1-D and always-F32 tensors F32."""
    from llamaforge.gguf.tiny import tensor_plan

    types = {t.name.lower(): t for t in GGML_TYPES.values()}
    arch = spec.arch
    meta: dict[str, Any] = {
        "general.architecture": arch, "general.name": name or spec.default_name,
        f"{arch}.block_count": spec.n_layer, f"{arch}.context_length": spec.context_length,
        f"{arch}.embedding_length": spec.n_embd, f"{arch}.feed_forward_length": spec.n_ff,
        f"{arch}.attention.head_count": spec.n_head, f"{arch}.attention.head_count_kv": spec.n_head_kv,
        f"{arch}.attention.key_length": spec.head_dim, f"{arch}.attention.value_length": spec.head_dim,
    }  # fmt: skip
    if "moe" in arch:
        meta.update({f"{arch}.expert_count": spec.n_expert, f"{arch}.expert_used_count": spec.n_expert_used,
                     f"{arch}.expert_feed_forward_length": spec.n_ff_exp})  # fmt: skip
        if arch in HYBRID_ARCHS:
            meta[f"{arch}.expert_shared_feed_forward_length"] = spec.n_ff_shexp
    if arch in SWA_ARCHS:
        meta[f"{arch}.attention.sliding_window"] = spec.sliding_window
    if arch in HYBRID_ARCHS:
        meta.update({
            f"{arch}.ssm.conv_kernel": spec.ssm_conv_kernel, f"{arch}.ssm.state_size": spec.ssm_state_size,
            f"{arch}.ssm.group_count": spec.ssm_group_count, f"{arch}.ssm.time_step_rank": spec.ssm_time_step_rank,
            f"{arch}.ssm.inner_size": spec.ssm_inner_size,
            f"{arch}.full_attention_interval": spec.full_attention_interval,
        })  # fmt: skip
    tensors: list[TensorInfo] = []
    offset = 0
    for entry in tensor_plan(spec, n_vocab):
        ne = entry.shape[::-1]
        wanted = types[(output_type if entry.canonical == "output.weight" else weight_type).lower()]
        if len(ne) == 1 or entry.dtype.itemsize == 4:
            ggml_type = types["f32"]
        elif ne[0] % wanted.block_size == 0:
            ggml_type = wanted
        else:
            ggml_type = types["f16"]
        count = math.prod(ne)
        nbytes = count // ggml_type.block_size * ggml_type.type_size
        tensors.append(TensorInfo(entry.canonical, tuple(ne), ggml_type, offset, nbytes))
        offset += _pad(nbytes, 32)
    return GGUFHeader(
        source=name or spec.default_name, file_size=offset, version=3, metadata=meta, value_types={},
        tensors=tensors, alignment=32, header_end=0, data_offset=0,
    )  # fmt: skip


# ------------------------------------------------------------------------------ llama.cpp's own figures


def measure_with_llamacpp(
    llama_server: Path,
    model: Path,
    settings: Settings,
    *,
    timeout_s: float = 120.0,
    threads: int = 1,
    runner: ProcessRunner = LOCAL,
    fit_projection: bool = False,
) -> LoadLog:
    """Load ``model`` in ``llama_server`` with ``settings`` and return the buffers it reports (CPU builds
    report everything as host buffers). The server is stopped as soon as it serves the model. With
    ``fit_projection`` llama.cpp's ``--fit`` runs first and its projection is in the result
    (:attr:`~llamaforge.serve.loadlog.LoadLog.projection`; it changes nothing when the model fits)."""
    flags = LlamaFlags(
        ctx=settings.ctx * settings.parallel, parallel=settings.parallel, cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v, flash_attn="on" if settings.flash_attn else "off",
        ubatch=settings.ubatch, batch=max(_N_BATCH, settings.ubatch), threads=threads,
        fit="on" if fit_projection else "off", warmup=False,
        kv_unified=settings.kv_unified, swa_full=settings.swa_full, log_verbosity=4,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="llamaforge-fit-") as scratch:
        launch = ServerLaunch(
            llama_server, model, flags, Path(scratch) / "server.log", load_timeout_s=timeout_s
        )
        with LlamaServer(launch, runner=runner) as server:
            lines = server.load_log
    reported = parse_load_log(lines)
    if not reported.buffers.get("compute"):
        raise ToolFailed(
            f"llama-server did not report its buffers loading {model.name}", command=server.command,
            returncode=0, tail=lines[-15:],
        )  # fmt: skip
    return reported
