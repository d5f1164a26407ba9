"""Smoke harness overhead: smoke's tg tokens/s / raw llama-bench on the same binary and model (goal 0.97-1.03).

Each round runs raw llama-bench (the very command line the smoke's bench stage uses, straight from a shell's
point of view), then a full `smoke` operation (both stages), interleaved so drift hits both sides alike; the
ratio of medians is the harness overhead. The server stage's per-request decode tokens/s (concurrency 1) is
printed next to it for reference: it measures a different path (HTTP streaming, the server's batch loop), so it
is not held to the band.

Usage: python benchmarks/smoke_overhead.py [--build KEY|DIR] [--model FILE] [--rounds 5] [--threads 1]
Default: the newest published CPU build and the tiny Q4_0 qwen3 smoke model (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from llamaforge.build.store import build_dir, find_build, list_builds
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.models.tiny import tiny_smoke_model
from llamaforge.smoke.bench import bench_command

GOAL = (0.97, 1.03)


def raw_llama_bench_tg(command: list[str]) -> float:
    """tg tokens/s of one raw llama-bench run."""
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = json.loads(result.stdout)
    return float(next(row["avg_ts"] for row in rows if row["n_gen"] and not row["n_prompt"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", help="build key or directory (default: newest CPU build)")
    parser.add_argument("--model", help="GGUF file (default: the tiny Q4_0 qwen3 smoke model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tg", type=int, default=32)
    args = parser.parse_args()

    build = args.build or next((b["key"] for b in list_builds() if b.get("backend") == "cpu"), None)
    if build is None:
        sys.exit("no CPU build: run `invoke build` first or pass --build")
    model = Path(args.model) if args.model else tiny_smoke_model()
    # The CPU module sweep is a stage of its own, not the bench stage measured here: left out of each round.
    params: dict[str, Any] = {
        "build": build,
        "model": str(model),
        "threads": args.threads,
        "tg": args.tg,
        "repetitions": args.repetitions,
        "concurrency": [1],
        "requests": 4,
        "max_tokens": args.tg,
        "skip_cpu_modules": True,
    }
    directory = Path(build) if Path(build).is_dir() else build_dir(find_build(build)["key"])
    binary = directory / "bin" / "llama-bench" if (directory / "bin").is_dir() else directory / "llama-bench"
    command = bench_command(
        binary, model, pp=64, tg=args.tg, repetitions=args.repetitions, threads=args.threads
    )
    op = operations()["smoke"]
    rows = []
    for round_ in range(1, args.rounds + 1):
        raw_before = raw_llama_bench_tg(command)
        started = time.monotonic()
        result = result_json(op.run(op.params.model_validate(params), OperationContext()))
        smoke_s = time.monotonic() - started
        smoke_tg = next(t["avg_ts"] for t in result["bench"]["tests"] if t["kind"] == "tg")
        raw_after = raw_llama_bench_tg(command)
        raw = (raw_before + raw_after) / 2
        decode = result["server"]["levels"][0]["decode_tps"]["p50"]
        rows.append((raw, smoke_tg, decode, smoke_s))
        print(
            f"round {round_}: raw llama-bench tg{args.tg} {raw:7.1f} t/s | smoke bench stage {smoke_tg:7.1f} t/s "
            f"(ratio {smoke_tg / raw:.3f}) | smoke server decode p50 {decode:7.1f} t/s (ratio {decode / raw:.3f}) "
            f"| smoke run {smoke_s:.1f} s ({result['run_id']})",
            flush=True,
        )
    raw_m = statistics.median(r[0] for r in rows)
    smoke_m = statistics.median(r[1] for r in rows)
    decode_m = statistics.median(r[2] for r in rows)
    ratio = smoke_m / raw_m
    verdict = "within" if GOAL[0] <= ratio <= GOAL[1] else "OUTSIDE"
    print(f"\nmedians over {len(rows)} rounds ({args.threads} thread(s), {model.name}):")
    print(f"  raw llama-bench tg{args.tg}:            {raw_m:8.1f} t/s")
    print(f"  smoke bench stage tg{args.tg}:          {smoke_m:8.1f} t/s")
    print(f"  smoke server decode p50 (c=1):   {decode_m:8.1f} t/s (reference: HTTP streaming path)")
    print(f"  harness overhead ratio smoke/raw: {ratio:.3f} ({verdict} the {GOAL[0]}-{GOAL[1]} goal)")
    print(f"  server decode / raw llama-bench:  {decode_m / raw_m:.3f}")
    print(f"  smoke wall time (median):         {statistics.median(r[3] for r in rows):.1f} s")


if __name__ == "__main__":
    main()
