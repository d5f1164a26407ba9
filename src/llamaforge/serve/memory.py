"""How much memory llama.cpp b11312 needs on each device for a model and llama-server settings.

Everything is computed from the GGUF header (tensor sizes, hyper-parameters) the way that release places
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
  reports for generated models of random shapes (``benchmarks/fit_accuracy.py`` measures its error on further
  shapes), a DeltaNet phase also holding two copies of every slot's recurrent state; the logits of the
  ``--parallel`` outputs (llama-server reserves one per slot); with partial offload, the largest CPU-resident
  weight that ggml copies to the GPU when it offloads a batched op.

Used by the fit planner (:mod:`llamaforge.serve.fit`) and the multi-GPU split (:mod:`llamaforge.serve.split`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from llamaforge.core.errors import InvalidOption
from llamaforge.gguf.header import TensorInfo
from llamaforge.serve.compute_graph import GRAPH_ARCHS, GraphSettings, simulate_compute
from llamaforge.serve.cpu_buffers import CpuBuffers, host_weight_buffers
from llamaforge.serve.shape import (
    ModelShape,
    WeightLayout,
    block_of,
    gpu_layers,
    is_expert_tensor,
    row_bytes,
    weight_layout,
)

__all__ = ["N_BATCH", "DeviceMemory", "GiB", "MiB", "Settings", "estimate_memory", "pad", "parse_size"]

GiB: Final = 1 << 30
MiB: Final = 1 << 20
# Archs whose attention layers project the query and an output gate together (2 x n_head x head_dim).
_GATED_Q_ARCHS: Final = frozenset({"qwen3next", "qwen35", "qwen35moe"})
# Archs that norm each block's output again before the residual add (Gemma's post-attention and post-FFN
# norms): one more n_embd-wide activation per token alive in every phase (fitted on gemma2: +2.0 MiB at
# n_embd 1024 x 512 tokens).
_POST_NORM_ARCHS: Final = frozenset({"gemma2", "gemma3"})
# llama-server defaults: -b 2048; ops with batches of at least 32 rows are offloaded to the GPU.
N_BATCH: Final = 2048
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
# qwen3next's DeltaNet layers project Q, K, V and the output gate Z in one matrix (ssm_in) and split it: the
# value width V (ssm.inner_size, Z's too) counts apart. Fitted like the others on 40 random qwen3next shapes,
# other phases fixed; on 30 further shapes the compute buffer at context 512 is off by 8.6 % rms (16.1 % with
# the qwen35 phase): `python benchmarks/fit_accuracy.py --random-shapes N` includes qwen3next.
_FUSED_RECURRENT_PHASE: Final = {"E": 3.0, "C": 2.25, "V": 4.5}
_FUSED_RECURRENT_ARCHS: Final = frozenset({"qwen3next"})
# While a DeltaNet layer holds the states of the ubatch's sequences (those read from the cache and the new ones
# written back: two copies), fewer per-token values are live. llama.cpp reserves its graph with one sequence per
# slot (n_seq_max), so the compute buffer grows with --parallel, which the per-token phase alone does not follow
# (a 16-slot qwen35 shape with 1 MiB of state per sequence and layer: 32.0 planned vs 61.5 MiB). Fitted on stock
# llama.cpp's CPU build, 4 hybrid shapes x 1 to 32 slots x ubatch 256/512 (28 loads): the slope is two states
# per sequence, with 0.85 of the per-token phase (0.95 for qwen3next's fused layers); planned within -4 % and
# +12 % of what llama.cpp reserves (it was -48 % at 16 slots).
_RECURRENT_STATE_COPIES: Final = 2
_STATE_PHASE_TOKEN_SHARE: Final = 0.85
_FUSED_STATE_PHASE_TOKEN_SHARE: Final = 0.95


_SIZE_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, what: str | None = None) -> int:
    """Bytes in ``24GiB``, ``24 GB`` (taken as GiB, as GPU memory is sold), ``24576MiB``, ``512M`` or a number;
    ``what`` (e.g. ``--margin``) names the value in the error."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(text)
    if not match:
        named = f"{what}: " if what else ""
        raise InvalidOption(f"{named}cannot read the size {text!r}", hint="e.g. 24GiB, 12GB, 24576MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[unit]
    if scale == 1 and number < 4096:  # a bare small number means GiB, not bytes
        scale = GiB
    return int(number * scale)


#: Less memory than any GPU (or RPC worker) has: a size below it is a unit left out, not a device.
MIN_DEVICE_MEMORY: Final = 256 * MiB
#: More memory than one GPU has (the largest hold under 300 GB; a Mac's unified memory at most 512 GB): a size
#: above it is a unit mistyped (TiB for GiB), which would plan every model to fit. RPC workers may be CPU hosts,
#: whose RAM can be larger: the bound is for GPUs only.
MAX_GPU_MEMORY: Final = 1 << 40


def parse_device_memory(text: str | int, what: str, *, gpu: bool = False) -> int:
    """Bytes of a device's memory ``what`` (``--vram``, a split device), as :func:`parse_size` reads them; a size
    of 1 byte to 256 MiB is refused: a bare number of 4096 or more is bytes, so ``24576`` (the MiB nvidia-smi
    prints) would plan a 24 KiB GPU. A ``gpu`` of more than 1 TiB is refused too. 0 stays 0, for the caller to
    name."""
    size = parse_size(text, what)
    if 0 < size < MIN_DEVICE_MEMORY:
        raise InvalidOption(
            f"{what} {str(text).strip()!r} is {size} bytes: less memory than any GPU has",
            hint="write the unit, e.g. 24576MiB or 24GiB (a bare number below 4096 is GiB, from 4096 on bytes)",
        )
    if gpu and size > MAX_GPU_MEMORY:
        raise InvalidOption(
            f"{what} {str(text).strip()!r} is {size / GiB:,.0f} GiB: more memory than any GPU has",
            hint="give one GPU's memory, e.g. 24GiB (TiB where GiB was meant?)",
        )
    return size


# --------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """The llama-server settings a plan is made for; ``ctx`` is the context of each of ``parallel`` slots.

    ``kv_unified``: one KV stream shared by all slots (``--kv-unified``; llama-server's default when
    ``--parallel`` is not given: 4 slots, unified) instead of one stream per slot. ``swa_full``: full-size
    caches for the sliding-window layers too (``--swa-full``). ``cpu_buffers``: the extra buffer types the
    host's CPU module offers for CPU-resident weights (:mod:`llamaforge.serve.cpu_buffers`); ``plain`` is
    llama-server ``--no-repack``.
    """

    ctx: int
    parallel: int = 1
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    ubatch: int = 512
    flash_attn: bool = True
    kv_unified: bool = False
    swa_full: bool = False
    cpu_buffers: CpuBuffers = "plain"

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
        total = pad(self.ctx * self.parallel, 256)
        return total if self.kv_unified else pad(total // self.parallel, 256)

    @property
    def n_tokens(self) -> int:
        """Tokens of the worst-case (reserve) batch: min(n_ctx, n_batch, n_ubatch)."""
        return min(self.n_ctx, N_BATCH, self.ubatch)

    def swa_cells(self, n_swa: int) -> int:
        """KV cells per stream of a sliding-window layer (``llama_kv_cache_iswa``): the window of every
        sequence the stream holds plus one ubatch, padded to 256, at most the full size."""
        if self.swa_full:
            return self.n_ctx_seq
        return pad(
            min(self.n_ctx_seq, n_swa * (self.parallel if self.kv_unified else 1) + self.n_tokens), 256
        )


def pad(value: int, to: int) -> int:
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
    if shape.arch in _FUSED_RECURRENT_ARCHS:
        fused = _FUSED_RECURRENT_PHASE
        values["recurrent"] = fused["E"] * e + fused["C"] * conv + fused["V"] * shape.ssm_inner_size
    else:
        values["recurrent"] = _RECURRENT_PHASE["E"] * e + _RECURRENT_PHASE["C"] * conv
    if shape.arch in _POST_NORM_ARCHS:
        values = {phase: value + e for phase, value in values.items()}
    return values


def layer_peak(shape: ModelShape, layers: Iterable[int], settings: Settings) -> int:
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
        recurrent = values["recurrent"] * t * 4
        states = (shape.conv_state_values + shape.ssm_state_values) * 4 * max(1, settings.parallel)
        share = (
            _FUSED_STATE_PHASE_TOKEN_SHARE
            if shape.arch in _FUSED_RECURRENT_ARCHS
            else _STATE_PHASE_TOKEN_SHARE
        )
        peak = max(peak, recurrent, share * recurrent + _RECURRENT_STATE_COPIES * states)
    return int(peak)


def mask_bytes(shape: ModelShape, settings: Settings) -> int:
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
        n_tokens=settings.n_tokens,
        n_outputs=min(settings.parallel, settings.n_tokens),
        full_cells=settings.n_ctx_seq,
        swa_cells=settings.swa_cells(shape.n_swa),
        flash_attn=settings.flash_attn,
        cache_type_k=settings.cache_type_k,
    )
    return simulate_compute(shape, layers, graph, with_output=with_output)


def logits_bytes(shape: ModelShape, settings: Settings) -> int:
    return shape.n_vocab * settings.parallel * 4 + settings.n_tokens * shape.n_embd * 4


def kv_layer_bytes(shape: ModelShape, settings: Settings, il: int) -> int:
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


def recurrent_layer_bytes(shape: ModelShape, settings: Settings) -> int:
    return (shape.conv_state_values + shape.ssm_state_values) * 4 * max(1, settings.parallel)


def cpu_resident(
    shape: ModelShape,
    tensors: Sequence[TensorInfo],
    on_gpu_layers: set[int],
    output_on_gpu: bool,
    n_cpu_moe: int,
) -> list[TensorInfo]:
    """The weights a placement keeps on the CPU, in file order; a tied output kept there is listed again as
    ``token_embd`` (llama.cpp duplicates it for the output matrix)."""
    resident: list[TensorInfo] = []
    embd: TensorInfo | None = None
    has_output = False
    for tensor in tensors:
        il = block_of(tensor.name)
        if il is not None:
            if il >= shape.n_layer:
                continue  # MTP layers
            on_gpu = il in on_gpu_layers and not (is_expert_tensor(tensor.name) and il < n_cpu_moe)
        elif tensor.name == "token_embd.weight":
            embd, on_gpu = tensor, False
        else:
            has_output = has_output or tensor.name == "output.weight"
            on_gpu = output_on_gpu
        if not on_gpu:
            resident.append(tensor)
    if embd is not None and not has_output and not output_on_gpu:
        resident.append(embd)
    return resident


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
    rs_layer = recurrent_layer_bytes(shape, settings)
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
            kv["gpu" if on_gpu else "host"] += kv_layer_bytes(shape, settings, il)
    weights["gpu" if output_on_gpu else "host"] += layout.output + layout.other
    if layout.tied and output_on_gpu:  # on the CPU the duplicate maps the same file bytes
        weights["gpu"] += layout.token_embd
    if settings.cpu_buffers != "plain":
        resident = cpu_resident(shape, tensors, on_gpu_layers, output_on_gpu, n_cpu_moe)
        weights["host"] = sum(host_weight_buffers(resident, settings.cpu_buffers).values())

    mask, logits = mask_bytes(shape, settings), logits_bytes(shape, settings)
    output_buffer = shape.n_vocab * settings.parallel * 4  # logits of one output per slot, host memory
    if not on_gpu_layers and not output_on_gpu:  # CPU only
        host_compute = _graph_compute(shape, range(shape.n_layer), settings, with_output=True)
        if host_compute is None:
            host_compute = max(mask + layer_peak(shape, range(shape.n_layer), settings), logits)
        host = DeviceMemory(weights["host"], kv["host"], state["host"], host_compute, output_buffer)
        return DeviceMemory(), host
    trunk_on_gpu = sorted(il for il in on_gpu_layers if il < shape.n_layer)
    gpu_graph = _graph_compute(shape, trunk_on_gpu, settings, with_output=output_on_gpu)
    gpu_compute = (
        gpu_graph
        if gpu_graph is not None
        else max(mask + layer_peak(shape, sorted(on_gpu_layers), settings), logits if output_on_gpu else 0)
    )
    if settings.n_tokens >= _OP_OFFLOAD_MIN_BATCH:
        gpu_compute += offloaded_weight
    host_compute = mask + settings.n_tokens * shape.n_embd * 4  # inputs staged in host memory
    if cpu_layers:
        host_compute += layer_peak(shape, cpu_layers, settings)
    if not output_on_gpu:
        host_compute = max(host_compute, logits)
    gpu = DeviceMemory(weights["gpu"], kv["gpu"], state["gpu"], gpu_compute)
    host = DeviceMemory(weights["host"], kv["host"], state["host"], host_compute, output_buffer)
    return gpu, host
