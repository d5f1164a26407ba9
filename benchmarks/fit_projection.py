"""llama.cpp's own ``--fit`` projection next to the fit planner's estimate and the real allocation (used by
fit_accuracy.py).

b11312's ``common_params_fit_impl`` sizes the load without allocating and prints, in whole MiB (rounded down),
``self = model + context + compute`` per device and ``projected to use N MiB``; its context is the KV cache
plus the recurrent state, and the output buffer is not in it. So the three are compared on that total
(weights + KV + recurrent state + compute) and per part; "closer" is whichever is nearer the real allocation,
with llama.cpp's figures as printed (its rounding down costs it up to 1 MiB per part).
"""

from __future__ import annotations

import statistics
from typing import Any

from llamaforge.serve.fit import DeviceMemory, MiB
from llamaforge.serve.loadlog import LoadLog

PARTS = {"model": ("weights",), "context": ("kv_cache", "recurrent_state"), "compute": ("compute",)}


def projection_row(planned: DeviceMemory, reported: LoadLog) -> dict[str, Any] | None:
    """Ours, llama.cpp's projection and the real allocation in MiB, per part and in total (None when the log
    has no projection)."""
    projection = reported.projection
    if projection is None or "Host" not in projection.devices:
        return None
    theirs = projection.devices["Host"]
    row: dict[str, Any] = {}
    for part, categories in PARTS.items():
        row[part] = {
            "ours_mib": sum(getattr(planned, c) for c in categories) / MiB,
            "llamacpp_projection_mib": getattr(theirs, f"{part}_mib"),
            "real_mib": sum(reported.total(c) for c in categories) / MiB,  # type: ignore[arg-type]
        }
    ours = sum(row[p]["ours_mib"] for p in PARTS)
    real = sum(row[p]["real_mib"] for p in PARTS)
    row["total"] = {
        "ours_mib": ours,
        "llamacpp_projection_mib": projection.total_mib,
        "real_mib": real,
        "ours_error_pct": 100 * (ours - real) / real,
        "llamacpp_error_pct": 100 * (projection.total_mib - real) / real,
    }
    ours_off, theirs_off = abs(ours - real), abs(projection.total_mib - real)
    row["closer"] = "ours" if ours_off < theirs_off else "llama.cpp" if theirs_off < ours_off else "tie"
    return row


def summarize_projection(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print and return how ours and llama.cpp's projection compare with the real totals."""
    compared = [row["projection"] for row in rows if row.get("projection")]
    if not compared:
        print("\nno --fit projection in the logs")
        return {}
    ours = [abs(p["total"]["ours_error_pct"]) for p in compared]
    theirs = [abs(p["total"]["llamacpp_error_pct"]) for p in compared]
    closer = {who: sum(p["closer"] == who for p in compared) for who in ("ours", "llama.cpp", "tie")}
    summary = {
        "cases": len(compared),
        "ours_max_abs_error_pct": max(ours),
        "ours_mean_abs_error_pct": statistics.fmean(ours),
        "llamacpp_max_abs_error_pct": max(theirs),
        "llamacpp_mean_abs_error_pct": statistics.fmean(theirs),
        "closer": closer,
    }
    print(
        f"\ntotal (weights + KV + state + compute) vs the real allocation, {len(compared)} loads: "
        f"ours max {max(ours):.2f} % mean {statistics.fmean(ours):.2f} %; llama.cpp --fit projection "
        f"max {max(theirs):.2f} % mean {statistics.fmean(theirs):.2f} % (whole MiB, rounded down); closer: "
        f"ours {closer['ours']}, llama.cpp {closer['llama.cpp']}, tie {closer['tie']}"
    )
    return summary
