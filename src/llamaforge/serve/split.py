"""The fit planner over several devices: a head and llama.cpp RPC workers (``llama-server --rpc``).

llama.cpp b11312 puts the devices in this order (``llama_model_load_from_file_impl`` in src/llama.cpp): the RPC
servers first, in ``--rpc`` order ("to minimize network transfers"), then the head's own GPUs; the head's CPU
is no device of the split. ``llama_model_base::load_tensors`` (src/llama-model.cpp) then:

* takes one weight per device: ``--tensor-split`` when given, else each device's free memory;
* turns them into cumulative fractions (float32: ``split_sum += splits[i]``, then ``splits[i] /= split_sum``);
* puts block ``il`` (and the output layer as block ``n_layer``) on the device
  ``upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)``, where ``i_gpu_start = n_layer + 1 - ngl``
  and ``act_gpu_layers = min(ngl, n_layer + 1)``; blocks before ``i_gpu_start`` and ``token_embd`` stay on the
  head's CPU.

The KV cache of a layer lives on its layer's device, and every device with layers reserves a compute buffer
for them (the same per-device model as :mod:`llamaforge.serve.fit`). The plan always prints ``--tensor-split``
with the weights it used, so llama.cpp splits the same way whatever memory the devices report when it loads.
"""

from __future__ import annotations

import math
import re
import shlex
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llamaforge.core.errors import InvalidOption
from llamaforge.gguf.header import GGUFHeader
from llamaforge.serve.fit import (
    DEFAULT_MARGIN,
    check_cache_blocks,
    check_servable,
    check_settings,
    load_model_header,
)
from llamaforge.serve.launcher import DEFAULT_RPC_PORT, LlamaFlags
from llamaforge.serve.memory import (
    DeviceMemory,
    GiB,
    Settings,
    kv_layer_bytes,
    layer_peak,
    logits_bytes,
    mask_bytes,
    parse_device_memory,
    recurrent_layer_bytes,
)
from llamaforge.serve.shape import model_shape, weight_layout


def _f32(value: float) -> float:
    """``value`` rounded to float32, as llama.cpp computes the split points."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


@dataclass(frozen=True)
class SplitDevice:
    """One device of the split: an RPC worker (``endpoint`` host:port) or one of the head's GPUs (no endpoint)."""

    name: str
    memory_bytes: int
    endpoint: str | None = None


@dataclass(frozen=True)
class DeviceShare:
    """What the plan puts on one device: its blocks, the output layer, memory and whether it fits."""

    name: str
    endpoint: str | None
    memory_bytes: int
    layers: tuple[int, ...]
    output: bool
    memory: DeviceMemory
    fits: bool

    @property
    def layer_range(self) -> str:
        """The blocks as ``first-last`` (``-`` when none)."""
        return f"{self.layers[0]}-{self.layers[-1]}" if self.layers else "-"


@dataclass(frozen=True)
class SplitPlan:
    """The answer of :func:`plan_split`: the devices' shares, the head's host memory and the flags."""

    model: str
    arch: str
    n_layer: int
    n_gpu_layers: int
    tensor_split: tuple[float, ...]
    devices: tuple[DeviceShare, ...]
    head_host: DeviceMemory
    flags: tuple[str, ...]
    margin_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        """Every device holds its share plus the margin."""
        return all(device.fits for device in self.devices)

    @property
    def command(self) -> str:
        """The head's llama-server command line."""
        return shlex.join(["llama-server", "-m", self.model, *self.flags])

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (sizes in bytes; each device's ``memory`` with its total)."""
        data = asdict(self)
        for share, device in zip(self.devices, data["devices"], strict=True):
            device["memory"]["total"] = share.memory.total
            device["layer_range"] = share.layer_range
        data["head_host"]["total"] = self.head_host.total
        data["fits"], data["command"] = self.fits, self.command
        data["flags"], data["notes"] = list(self.flags), list(self.notes)
        data["tensor_split"] = list(self.tensor_split)
        return data


def assign_layers(n_layer: int, weights: Sequence[float], n_gpu_layers: int) -> list[int | None]:
    """The device index of blocks ``0..n_layer-1`` and of the output layer (index ``n_layer``), ``None`` for the
    head's CPU: llama.cpp's ``get_layer_buft_list`` over the cumulative float32 split points of ``weights``."""
    if not weights or any(weight < 0 for weight in weights) or sum(weights) <= 0:
        raise InvalidOption("the tensor split needs one non-negative weight per device, not all zero")
    points, total = [], 0.0
    for weight in weights:
        total = _f32(total + _f32(weight))
        points.append(total)
    points = [_f32(point / total) for point in points]
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer + 1)
    placement: list[int | None] = []
    for il in range(n_layer + 1):
        if il < start or il - start >= active:
            placement.append(None)
            continue
        fraction = _f32(_f32(float(il - start)) / active)
        index = next((i for i, point in enumerate(points) if point > fraction), len(points))
        placement.append(min(index, len(points) - 1))
    return placement


def plan_split(
    model: str | Path | GGUFHeader,
    devices: Sequence[SplitDevice],
    settings: Settings,
    *,
    tensor_split: Sequence[float] | None = None,
    n_gpu_layers: int | None = None,
    margin_bytes: int = DEFAULT_MARGIN,
) -> SplitPlan:
    """Plan ``model`` over ``devices`` (RPC workers first, then the head's GPUs, as llama.cpp orders them):
    which blocks go where, each device's memory and whether it fits, and the head's llama-server flags.

    Without ``tensor_split`` the blocks are split in proportion to each device's memory, as llama.cpp does
    with the free memory the devices report; ``n_gpu_layers`` defaults to every block and the output layer.
    """
    if not devices:
        raise InvalidOption(
            "a split needs at least one device", hint="give the RPC workers (and their memory)"
        )
    if tensor_split is not None and len(tensor_split) != len(devices):
        raise InvalidOption(
            f"--tensor-split has {len(tensor_split)} values for {len(devices)} devices",
            hint="one proportion per device: the RPC workers in order, then the head's GPUs",
        )
    if starved := [device for device in devices if device.memory_bytes <= margin_bytes]:
        shown = ", ".join(f"{device.name} ({device.memory_bytes / GiB:.1f} GiB)" for device in starved)
        raise InvalidOption(
            f"--margin {margin_bytes / GiB:.1f} GiB keeps all the memory of {shown} free",
            hint="the margin is headroom kept free on each device (the CUDA context, the driver): lower --margin "
            "(e.g. 256MiB for a CPU worker), or give the device's real size",
        )
    check_settings(settings)
    name, header = load_model_header(model)
    check_servable(name, header)
    shape = model_shape(header)
    check_cache_blocks(shape, settings)
    layout = weight_layout(shape, header.tensors)
    n_layer = shape.n_layer_all
    ngl = n_layer + 1 if n_gpu_layers is None else min(n_gpu_layers, n_layer + 1)
    weights = (
        tuple(tensor_split)
        if tensor_split is not None
        else tuple(float(device.memory_bytes) for device in devices)
    )
    placement = assign_layers(n_layer, weights, ngl)
    per_device: list[list[int]] = [[] for _ in devices]
    for il, where in enumerate(placement[:n_layer]):
        if where is not None:
            per_device[where].append(il)
    output_at = placement[n_layer]
    mask, logits = mask_bytes(shape, settings), logits_bytes(shape, settings)
    rs_layer = recurrent_layer_bytes(shape, settings)
    shares = []
    for index, device in enumerate(devices):
        layers = per_device[index]
        weight = sum(layout.dense[il] + layout.experts[il] for il in layers)
        kv = sum(kv_layer_bytes(shape, settings, il) for il in layers if not shape.recurrent[il])
        state = rs_layer * sum(1 for il in layers if shape.recurrent[il])
        holds_output = output_at == index
        if holds_output:
            weight += layout.output + layout.other + (layout.token_embd if layout.tied else 0)
        compute = 0
        if layers or holds_output:
            compute = max(mask + layer_peak(shape, layers, settings), logits if holds_output else 0)
        memory = DeviceMemory(weight, kv, state, compute)
        fits = memory.total + margin_bytes <= device.memory_bytes
        shares.append(
            DeviceShare(
                device.name, device.endpoint, device.memory_bytes, tuple(layers), holds_output, memory, fits
            )
        )
    cpu_layers = [il for il, where in enumerate(placement[:n_layer]) if where is None]
    host_weights = layout.token_embd + sum(layout.dense[il] + layout.experts[il] for il in cpu_layers)
    host_kv = sum(kv_layer_bytes(shape, settings, il) for il in cpu_layers if not shape.recurrent[il])
    host_state = rs_layer * sum(1 for il in cpu_layers if shape.recurrent[il])
    host_compute = mask + settings.n_tokens * shape.n_embd * 4 + layer_peak(shape, cpu_layers, settings)
    if output_at is None:
        host_weights += layout.output + layout.other
        host_compute = max(host_compute, logits)
    head_host = DeviceMemory(
        host_weights, host_kv, host_state, host_compute, shape.n_vocab * settings.parallel * 4
    )
    proportions = _proportions(weights)
    rpc = [device.endpoint for device in devices if device.endpoint]
    flags = LlamaFlags(
        n_gpu_layers=ngl,
        ctx=settings.ctx * settings.parallel,
        parallel=settings.parallel,
        cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v,
        flash_attn="on" if settings.flash_attn else "off",
        fit="off",
        rpc=tuple(rpc) or None,
        tensor_split=proportions,
        kv_unified=True if settings.kv_unified else None,
        swa_full=settings.swa_full,
        log_verbosity=4,  # llama-server logs its load (which device holds which buffer) from level 4 only
    )
    notes = [] if tensor_split is not None else ["split in proportion to each device's memory"]
    short = [share.name for share in shares if not share.fits]
    if short:
        notes.append("does not fit on " + ", ".join(short))
    return SplitPlan(
        model=name,
        arch=shape.arch,
        n_layer=n_layer,
        n_gpu_layers=ngl,
        tensor_split=proportions,
        devices=tuple(shares),
        head_host=head_host,
        flags=tuple(flags.args()),
        margin_bytes=margin_bytes,
        notes=tuple(notes),
    )


def _proportions(weights: Sequence[float]) -> tuple[float, ...]:
    """The split weights as short proportions for ``--tensor-split`` (GiB when they are byte counts)."""
    scale = GiB if min(weights) >= GiB else 1
    return tuple(round(weight / scale, 3) for weight in weights)


def parse_devices(spec: str, *, default_port: int = DEFAULT_RPC_PORT) -> list[SplitDevice]:
    """``ADDR[:PORT]=SIZE,...`` (RPC workers, in ``--rpc`` order) as devices; ``gpu=SIZE`` names a head GPU."""
    devices: list[SplitDevice] = []
    for part in (item.strip() for item in spec.split(",")):
        if not part:
            continue
        where, sep, size = part.partition("=")
        if not sep or not where:
            raise InvalidOption(
                f"device {part!r} has no memory size",
                hint="write ADDR:PORT=SIZE, e.g. 10.0.0.2:50052=24GiB, or gpu=24GiB for the head's own GPU",
            )
        memory = parse_device_memory(size, f"the memory of device {where}")
        if memory <= 0:
            raise InvalidOption(
                f"device {part!r} has no memory",
                hint="give each device the memory it has, e.g. 10.0.0.2:50052=24GiB; leave out a device that has none",
            )
        if where == "gpu":
            gpus = len([device for device in devices if device.endpoint is None])
            devices.append(SplitDevice(f"head GPU{gpus}", memory))
            continue
        endpoint = _endpoint(where, default_port)
        devices.append(SplitDevice(f"RPC {endpoint}", memory, endpoint))
    if not devices:
        raise InvalidOption(
            "no devices given", hint="e.g. --devices 10.0.0.2:50052=24GiB,10.0.0.3:50052=8GiB"
        )
    endpoints = [device.endpoint.lower() for device in devices if device.endpoint]
    twice = sorted({endpoint for endpoint in endpoints if endpoints.count(endpoint) > 1})
    if twice:
        raise InvalidOption(
            f"RPC workers given twice: {', '.join(twice)}",
            hint="name each worker once (a worker listed twice would count its memory twice)",
        )
    heads = [device for device in devices if device.endpoint is None]
    if heads and devices.index(heads[0]) < len(devices) - len(heads):
        raise InvalidOption(
            "the head's GPUs come after the RPC workers",
            hint="llama.cpp orders RPC servers first; list gpu=SIZE last",
        )
    return devices


def _endpoint(where: str, default_port: int) -> str:
    """``ADDR[:PORT]`` of one RPC worker as ``host:port``: a host name or address, a port from 1 to 65535."""
    host, sep, port = where.rpartition(":") if ":" in where else (where, "", "")
    example = f"write ADDR:PORT=SIZE, e.g. 10.0.0.2:50052=24GiB (the port defaults to {default_port})"
    if host.startswith("[") or where.count(":") > 1:
        # the pinned llama.cpp's --rpc splits host:port at the first ':' and connects over IPv4 only: the head aborts
        raise InvalidOption(
            f"RPC worker {where!r} is IPv6: llama.cpp's RPC backend speaks IPv4 only",
            hint="give the worker's IPv4 address or host name, e.g. 10.0.0.2:50052=24GiB",
        )
    if not host or not re.fullmatch(r"[A-Za-z0-9.\-]+", host):
        raise InvalidOption(f"RPC worker {where!r} has no valid host", hint=example)
    if not sep:
        return f"{host}:{default_port}"
    if not (port.isascii() and port.isdigit()):
        raise InvalidOption(f"RPC worker {where!r}: port {port!r} is not a number", hint=example)
    if not 1 <= int(port) <= 65535:
        raise InvalidOption(f"RPC worker {where!r}: port {port} is out of range (1-65535)", hint=example)
    return f"{host}:{int(port)}"


def parse_tensor_split(text: str) -> list[float]:
    """``3,1`` (or ``3/1``, as llama.cpp accepts it) as proportions."""
    try:
        parts = [float(part) for part in text.replace("/", ",").split(",") if part.strip()]
    except ValueError:
        parts = []
    if not parts or not all(math.isfinite(part) and part >= 0 for part in parts) or not any(parts):
        raise InvalidOption(
            f"--tensor-split {text!r} is not a list of proportions (numbers, none negative, not all 0)",
            hint="e.g. 3,1",
        )
    return parts
