"""CPU speed of the default build (every CPU variant, the best one loaded at run time) against a native build
(``--cpu native``: ``GGML_NATIVE=ON``) of the same source: llama-bench pp and tg, goal >= 0.97 of native for both.

Both builds come through `invoke build` (cache hits when they exist). The model is a random-weight qwen3 wide
enough for the layers to matter (hidden 1024, 12 layers, with its 151k-token embedding and output matrices),
written once with the project's GGUF writer, quantized to Q4_0 by default (``--dtype``: q4_0, q8_0 or f16; about
0.25, 0.47 or 0.9 GB), so the runs reach the CPU's quantized kernels: repacked Q4_0 with AVX2/AVX-512, AMX tiles
on Xeons with AMX. The CPU's model name is printed with the figures. Runs alternate between the builds (ABBA), so drift
on a shared machine hits both alike; the ratios are of medians. Each build's manifest gives its build time and
the log of its first llama-bench run names the CPU variant ggml loaded.

On a machine shared with other work, prefer ``--threads 1``: ggml's threads wait for each other at every graph
node by spinning, so when the scheduler takes one of them away, a many-thread run measures the machine's load,
not the build (on a loaded 2-core machine, 2-thread runs of one build varied 2-3x between rounds).

Usage: python benchmarks/cpu_speed.py [--rounds 4] [--threads N] [--pp 128] [--tg 32] [--repetitions 2]
       [--dtype q4_0|q8_0|f16] [--against DIR]   (compare with that build directory instead of building --cpu native)
       [--default DIR]   (that build directory as the default build, instead of `invoke build`)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from llamaforge.core.paths import home
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf.tiny import DType, TinyModelSpec, write_tiny_model
from llamaforge.smoke.bench import bench_command
from llamaforge.smoke.cpu_features import host_cpu
from llamaforge.smoke.roofline import cpu_threads_default

GOAL = 0.97
WIDE = TinyModelSpec(arch="qwen3", n_layer=12, n_embd=1024, n_head=16, n_head_kv=8, head_dim=64, n_ff=3072)


def wide_model(dtype: DType) -> Path:
    """The benchmark's qwen3 model in ``dtype`` (written once under home()/models/bench/)."""
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    path = home() / "models" / "bench" / f"qwen3-h1024-l12-{dtype}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tree = fetch_source(load_recipe("default").source)
        write_tiny_model(path, replace(WIDE, dtype=dtype), tree / "models" / "ggml-vocab-qwen2.gguf")
    return path


def cpu_model() -> str:
    """This machine's CPU, as /proc/cpuinfo names it (and whether it has AMX)."""
    model, features = host_cpu(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    return f"{model}{' (AMX)' if 'AMX_INT8' in features else ''}"


def build(cpu: str | None) -> dict[str, Any]:
    """`invoke build` of the default recipe (``cpu`` None: the recipe's level), the published build's manifest."""
    op = operations()["build"]
    params = {"recipe": "default", **({"cpu": cpu} if cpu else {})}
    result = result_json(op.run(op.params.model_validate(params), OperationContext()))
    path = Path(result["build"]["path"])
    manifest: dict[str, Any] = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    manifest["path"] = str(path)
    return manifest


def _published(directory: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    manifest["path"] = str(directory)
    return manifest


def bench_once(command: list[str]) -> tuple[float, float, str]:
    """pp and tg tokens/s of one llama-bench run, and its stderr."""
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = json.loads(result.stdout)
    pp = next(float(row["avg_ts"]) for row in rows if row["n_prompt"] and not row["n_gen"])
    tg = next(float(row["avg_ts"]) for row in rows if row["n_gen"] and not row["n_prompt"])
    return pp, tg, result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=cpu_threads_default())
    parser.add_argument("--pp", type=int, default=128)
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--dtype", choices=["q4_0", "q8_0", "f16"], default="q4_0")
    parser.add_argument(
        "--against", type=Path, help="a published build directory to compare with (default: native)"
    )
    parser.add_argument(
        "--default",
        type=Path,
        help="a published build directory to use as the default build (default: `invoke build`), e.g. one "
        "carried to a machine without Docker",
    )
    args = parser.parse_args()

    other = build("native") if args.against is None else _published(args.against)
    default = build(None) if args.default is None else _published(args.default)
    builds = {"default": default, "native" if args.against is None else "against": other}
    model = wide_model(args.dtype)
    print(f"model {model} ({model.stat().st_size / 2**20:.0f} MiB): {replace(WIDE, dtype=args.dtype)}")
    print(f"CPU: {cpu_model()}", flush=True)
    commands = {
        name: bench_command(
            Path(manifest["path"]) / "bin" / "llama-bench",
            model,
            pp=args.pp,
            tg=args.tg,
            repetitions=args.repetitions,
            threads=args.threads,
        )
        for name, manifest in builds.items()
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in builds}
    loaded: dict[str, str] = {}
    for round_ in range(1, args.rounds + 1):
        order = list(builds) if round_ % 2 else list(reversed(builds))  # ABBA
        for name in order:
            pp, tg, stderr = bench_once(commands[name])
            samples[name].append((pp, tg))
            found = re.findall(r"loaded CPU backend from (\S+)", stderr)
            loaded.setdefault(name, Path(found[-1]).name if found else "built in")
            print(
                f"round {round_} {name:8s} pp{args.pp} {pp:8.1f} t/s  tg{args.tg} {tg:7.2f} t/s", flush=True
            )
    medians = {
        name: (statistics.median(s[0] for s in rows), statistics.median(s[1] for s in rows))
        for name, rows in samples.items()
    }
    print(f"\nmedians over {args.rounds} rounds, {args.threads} thread(s), {args.dtype}, on {cpu_model()}:")
    for name, manifest in builds.items():
        pp, tg = medians[name]
        print(
            f"  {name:8s} (cpu {manifest.get('cpu')}, {loaded[name]}, {len(manifest['artifacts'])} artifacts, "
            f"build {manifest['key'][:12]} took {manifest['duration_s']:.0f} s): "
            f"pp {pp:.1f} t/s, tg {tg:.2f} t/s"
        )
    reference = list(builds)[1]
    # Three views of the same runs on a shared machine: ratio of medians; median of each round's pair (the two
    # runs of a round are adjacent, so they share the machine's load); ratio of the best runs (the least
    # disturbed by other load).
    for index, kind in enumerate(("pp", "tg")):
        ratio = medians["default"][index] / medians[reference][index]
        paired = statistics.median(
            ours[index] / theirs[index]
            for ours, theirs in zip(samples["default"], samples[reference], strict=True)
        )
        best = max(s[index] for s in samples["default"]) / max(s[index] for s in samples[reference])
        verdict = (
            ("meets" if ratio >= GOAL else "MISSES") + f" the >= {GOAL} goal" if reference == "native" else ""
        )
        print(
            f"  {kind}: default / {reference} = {ratio:.3f} (paired rounds {paired:.3f}, best runs {best:.3f}) "
            f"{verdict}"
        )


if __name__ == "__main__":
    main()
