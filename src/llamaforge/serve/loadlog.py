"""What llama.cpp says while it loads a model: the buffers it allocated, its cache sizes, its parameter count.

One parser for every caller (the fit measurement, ``models.verify --load-check``). Buffers are named like the
fit planner's :class:`~llamaforge.serve.fit.DeviceMemory`, so a plan and a measurement compare field by field:

========================  ===================================================
``weights``               ``load_tensors: <type> model buffer size``
``kv_cache``              ``llama_kv_cache: <type> KV buffer size``
``recurrent_state``       ``llama_memory_recurrent: <type> RS buffer size``
``compute``               ``sched_reserve: <type> compute buffer size``
``output``                ``llama_context: <type> output buffer size``
========================  ===================================================

A model with sliding-window layers gets two KV caches (``llama_kv_cache_iswa``): llama.cpp prints the buffer and
``size`` lines of the full-attention cache, then those of the sliding-window one after ``creating     SWA KV
cache``; the buffers of both count as ``kv_cache``, their sizes are :attr:`LoadLog.kv_cache` and
:attr:`LoadLog.swa_kv_cache`.

With ``--fit on`` (b11312's ``common_params_fit_impl``) llama.cpp first sizes the load without allocating and
prints its projection, in whole MiB, before loading: one ``common_memory_breakdown_print`` row per device
(``self = model + context + compute``; context is the KV cache and recurrent state, the output buffer is not
counted) and ``projected to use N MiB of host|device memory``: :attr:`LoadLog.projection`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

BufferKind = Literal["weights", "kv_cache", "recurrent_state", "compute", "output"]
BUFFER_KINDS: Final[tuple[BufferKind, ...]] = ("weights", "kv_cache", "recurrent_state", "compute", "output")
_MiB: Final = 1 << 20

_BUFFER_LINES: Final[tuple[tuple[BufferKind, re.Pattern[str]], ...]] = (
    ("weights", re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")),
    ("kv_cache", re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s*([\d.]+) MiB")),
    ("recurrent_state", re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s*([\d.]+) MiB")),
    ("compute", re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s*([\d.]+) MiB")),
    ("output", re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s*([\d.]+) MiB")),
)
_CACHE_SIZE: Final = r": size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers"
_CACHE_LINES: Final = (
    ("kv_cache", re.compile(r"llama_kv_cache" + _CACHE_SIZE)),
    ("recurrent_state", re.compile(r"llama_memory_recurrent" + _CACHE_SIZE)),
)
_SWA_CACHE_START: Final = re.compile(r"llama_kv_cache_iswa: creating\s+SWA KV cache")
_MODEL_PARAMS: Final = re.compile(r"model params\s*=\s*(.+)$")
_BREAKDOWN_ROW: Final = re.compile(r"common_memory_breakdown_print: \|\s+- (.+?)\s+\|(.*)\|\s*$")
_PROJECTED: Final = re.compile(r"common_params_fit_impl: projected to use (\d+) MiB of (host|device) memory")
# llama.cpp's fit pass reads the file once without allocating; every load starts with this line.
_LOAD_START: Final = "llama_model_loader: loaded meta data"


@dataclass(frozen=True)
class CacheSize:
    """A cache llama.cpp sized: MiB, cells (tokens or sequences) and the layers that hold it."""

    mib: float
    cells: int
    layers: int


@dataclass(frozen=True)
class ProjectedMemory:
    """llama.cpp's ``--fit`` projection for one device (whole MiB, as it prints them)."""

    self_mib: int  # model + context + compute, summed in bytes before rounding down
    model_mib: int
    context_mib: int
    compute_mib: int


@dataclass(frozen=True)
class Projection:
    """What ``--fit`` projected before loading: per device (``Host``, ``CUDA0 (…)``) and the total it compared."""

    devices: dict[str, ProjectedMemory]
    total_mib: int
    memory: str  # "host" (no GPU) or "device"


@dataclass(frozen=True)
class LoadLog:
    """The last load in a llama.cpp log: ``buffers[kind][buffer type]`` in bytes (printed as MiB, 2 decimals)."""

    buffers: dict[BufferKind, dict[str, int]] = field(default_factory=dict)
    kv_cache: CacheSize | None = None
    recurrent_state: CacheSize | None = None
    model_params: str | None = None
    swa_kv_cache: CacheSize | None = None
    projection: Projection | None = None

    def total(self, kind: BufferKind) -> int:
        """Bytes of ``kind`` over all buffer types (0 when llama.cpp printed none)."""
        return sum(self.buffers.get(kind, {}).values())

    def buffers_mib(self) -> dict[str, dict[str, float]]:
        """The buffers in MiB, as llama.cpp printed them."""
        return {
            kind: {name: round(size / _MiB, 2) for name, size in per.items()}
            for kind, per in self.buffers.items()
        }


def parse_load_log(lines: Iterable[str]) -> LoadLog:
    """Read the buffer and cache lines of a llama.cpp load log (llama-server, llama-cli); the last load wins."""
    buffers: dict[BufferKind, dict[str, int]] = {}
    caches: dict[str, CacheSize] = {}
    params: str | None = None
    in_swa = False
    rows: dict[str, ProjectedMemory] = {}
    projection: Projection | None = None
    for line in lines:
        if projection is None:  # the fit pass comes before the load; later breakdowns are the real ones
            row = _BREAKDOWN_ROW.search(line)
            if row:
                numbers = [int(n) for n in re.findall(r"\d+", row.group(2))]
                if len(numbers) in (
                    4,
                    7,
                ):  # host: self = model + context + compute; devices: total, free first
                    own, model, context, compute = numbers[2:6] if len(numbers) == 7 else numbers
                    rows[row.group(1).strip()] = ProjectedMemory(own, model, context, compute)
            projected = _PROJECTED.search(line)
            if projected:
                projection = Projection(rows, int(projected.group(1)), projected.group(2))
        if _LOAD_START in line:
            buffers, caches, params, in_swa = {}, {}, None, False
        if _SWA_CACHE_START.search(line):
            in_swa = True
        for kind, pattern in _BUFFER_LINES:
            match = pattern.search(line)
            if match:
                per_type = buffers.setdefault(kind, {})
                per_type[match.group(1)] = per_type.get(match.group(1), 0) + round(
                    float(match.group(2)) * _MiB
                )
        for name, size_pattern in _CACHE_LINES:
            match = size_pattern.search(line)
            if match:
                which = "swa_kv_cache" if in_swa and name == "kv_cache" else name
                caches[which] = CacheSize(float(match.group(1)), int(match.group(2)), int(match.group(3)))
        match = _MODEL_PARAMS.search(line)
        if match:
            params = match.group(1).strip()
    return LoadLog(
        buffers,
        caches.get("kv_cache"),
        caches.get("recurrent_state"),
        params,
        caches.get("swa_kv_cache"),
        projection,
    )
