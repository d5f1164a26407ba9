"""Latency of a read-only MCP tool call over stdio: p50/p95 of 200 `recipes_list` calls (goal: p50 <= 50 ms).

The server runs as a client would start it (`python -m mcp_server` as a subprocess, the real SDK client on the
other end); start-up and the first, warming call are not counted.
Usage: python benchmarks/mcp_latency.py [--calls 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]


def percentile(samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``samples``."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))]


async def measure(calls: int) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix="lf-mcp-bench-")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_server", "--read-only"],
        cwd=str(ROOT),
        env={"LLAMAFORGE_HOME": home, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
    )
    started = time.perf_counter()
    async with Client(params, read_timeout_seconds=60) as client:
        connected = time.perf_counter() - started
        await client.list_tools()
        warm = await client.call_tool("recipes_list", {})
        if warm.is_error:
            sys.exit(f"recipes_list failed: {warm.content}")
        samples = []
        for _ in range(calls):
            before = time.perf_counter()
            result = await client.call_tool("recipes_list", {})
            samples.append((time.perf_counter() - before) * 1000)
            assert not result.is_error and result.structured_content
    return {
        "calls": calls,
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p95_ms": round(percentile(samples, 0.95), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
        "max_ms": round(max(samples), 2),
        "startup_s": round(connected, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON")
    args = parser.parse_args()
    figures = anyio.run(measure, args.calls)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"recipes_list over stdio, {figures['calls']} calls (server start-up {figures['startup_s']} s, not counted)"
    )
    print(f"  p50  {figures['p50_ms']:8.2f} ms   (goal <= 50 ms)")
    print(f"  p95  {figures['p95_ms']:8.2f} ms")
    print(f"  mean {figures['mean_ms']:8.2f} ms   max {figures['max_ms']:.2f} ms")


if __name__ == "__main__":
    main()
