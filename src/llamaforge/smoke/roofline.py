"""The memory roofline of token generation: how close measured tg comes to what bandwidth allows.

Generating one token reads every weight the token passes through once (all dense tensors, one row of the
embedding table, the active experts of a MoE layer) plus the KV cache so far, counted by the one definition
in :func:`llamaforge.serve.bandwidth.bytes_per_token` at the mean depth of llama-bench's tg test. So
``roof = bandwidth / bytes per token`` bounds tg from above and ``efficiency = tg / roof``. Every input is an
estimate and the report says so: the bandwidth is measured (a numpy copy on CPU) or read from the GPU table
(``recipes/gpus.toml``, spec sheets), and the bytes are counted from the GGUF header (a uniform expert-routing
assumption for MoE).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llamaforge.serve.bandwidth import TokenBytes
from llamaforge.serve.gpus import gpu_for_device


@dataclass(frozen=True)
class Bandwidth:
    """A memory bandwidth and where it comes from."""

    gbs: float
    source: str  # "measured: …", "spec sheet: …", "given: …"
    details: dict[str, Any] = field(default_factory=dict)


def _l3_bytes() -> int | None:
    try:
        raw = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text(encoding="ascii").strip()
    except OSError:
        return None
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else int(raw) if raw.isdigit() else None


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def probe_cpu_bandwidth(threads: int, *, repeats: int = 3, per_thread_bytes: int | None = None) -> Bandwidth:
    """Measure copy bandwidth with ``threads`` numpy copies in parallel (numpy releases the GIL for them).

    Each copy reads and writes its array, so bytes = 2 x size; the working set (sources plus destinations) is
    at least twice the last-level cache, so the figure is mostly DRAM's, not the cache's. The best of
    ``repeats`` rounds counts (the least disturbed); ``per_thread_bytes`` overrides the array size (tests).
    """
    threads = max(1, threads)
    l3 = _l3_bytes() or 32 * 2**20
    per_thread = max(64 * 2**20, math.ceil(l3 / threads))
    available = _available_bytes()
    if available is not None:  # never let the probe push the machine into swap
        per_thread = min(per_thread, max(16 * 2**20, available // (8 * threads)))
    per_thread = min(per_thread_bytes or per_thread, 2**30)
    n = per_thread // 8
    arrays = [(np.ones(n), np.zeros(n)) for _ in range(threads)]  # zeros + first copy: pages are touched
    for src, dst in arrays:
        np.copyto(dst, src)
    best = math.inf
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def copy(
            src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any], barrier: threading.Barrier = barrier
        ) -> None:
            barrier.wait()
            np.copyto(dst, src)

        workers = [threading.Thread(target=copy, args=pair) for pair in arrays]
        for worker in workers:
            worker.start()
        barrier.wait()
        start = time.perf_counter()
        for worker in workers:
            worker.join()
        best = min(best, time.perf_counter() - start)
    moved = 2 * threads * n * 8
    return Bandwidth(
        gbs=moved / best / 1e9,
        source=f"measured: numpy copy, {threads} thread(s), best of {repeats}",
        details={"bytes_per_round": moved, "best_round_s": best, "l3_bytes": _l3_bytes(), "threads": threads},
    )


def gpu_bandwidth(gpu_info: str) -> Bandwidth | None:
    """Spec-sheet bandwidth (``recipes/gpus.toml``) of the first GPU named in llama-bench's ``gpu_info``
    (None when the table does not know it)."""
    gpu = gpu_for_device(gpu_info.split(",", maxsplit=1)[0])
    if gpu is None:
        return None
    return Bandwidth(gpu.bandwidth_gbs, f"spec sheet: {gpu.name} (peak, not measured)")


def roofline(tg_tps: float, bandwidth: Bandwidth, token_bytes: TokenBytes) -> dict[str, Any]:
    """Roof (tokens/s that bandwidth allows) and efficiency of the measured tg, with what is estimated."""
    roof = bandwidth.gbs * 1e9 / token_bytes.total if token_bytes.total else math.inf
    notes = list(token_bytes.notes)
    l3 = bandwidth.details.get("l3_bytes")
    if isinstance(l3, int) and token_bytes.total <= l3:
        notes.append(
            f"bytes per token ({token_bytes.total / 2**20:.1f} MiB) fit in the L3 cache ({l3 / 2**20:.0f} MiB): "
            "weights may come from cache, so efficiency can exceed 1"
        )
    return {
        "measured_tg_tps": tg_tps,
        "bandwidth_gbs": bandwidth.gbs,
        "bandwidth_source": bandwidth.source,
        "bandwidth_details": bandwidth.details,
        "bytes_per_token": token_bytes.total,
        "bytes_per_token_detail": token_bytes.to_json(),
        "roof_tps": roof,
        "efficiency": tg_tps / roof if roof and math.isfinite(roof) else None,
        "estimated": ["bytes_per_token"] + ([] if bandwidth.source.startswith("given") else ["bandwidth"]),
        "notes": notes,
    }


def cpu_threads_default() -> int:
    """Threads llama.cpp uses by default on CPU when none are given (this process's usable cores)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
