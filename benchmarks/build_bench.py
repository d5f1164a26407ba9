"""Build benchmarks, measured side by side in one run (ratios, not absolute times: machines are noisy).

P1: cold `invoke build` (Docker, CPU, empty ccache) / raw `cmake -G Ninja` of the same targets in the same image.
P2: unchanged inputs -> cached result: wall time of `invoke build` as a user runs it (median of 5).
P3: rebuild after changing one patch (warm ccache) / the cold build.

Needs Docker, the base image (`invoke images.bootstrap`) and the llama.cpp sdist in LLAMAFORGE_SOURCE_MIRROR.
Usage: python benchmarks/build_bench.py   (about 20 minutes on 2 cores)

P1 alone, in ABBA order (raw, cold, cold, raw: a fresh store and an empty ccache volume for each cold build) so
a drift of the machine's load hits both sides alike; --cpu LEVEL builds one CPU level instead of the recipe's:
    python benchmarks/build_bench.py --p1 [--cpu x86-64-v3]

P2 alone, on a store that already holds the build (LLAMAFORGE_HOME), optionally against another checkout of
llamaforge, alternating runs so both sides see the same machine:
    python benchmarks/build_bench.py --p2 [--runs 7] [--baseline DIR] [-- BUILD OPTIONS ...]
Both trees compile their modules on every run where no bytecode can be kept (PYTHONDONTWRITEBYTECODE, or a
checkout from before tasks.py let Python write it under Invoke): `python -m compileall -q DIR/src` evens that.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    return elapsed, result.stdout


def make_series(directory: Path, source: Path, text: str) -> Path:
    """A one-patch series that adds ``text`` to the --version banner (a real diff against b11312)."""
    relative = "common/build-info.cpp.in"
    original = (source / relative).read_text(encoding="utf-8")
    anchor = '    fprintf(stream, "built with %s for %s\\n", llama_compiler(), llama_build_target());\n'
    work = Path(tempfile.mkdtemp())
    for side, content in (
        ("a", original),
        ("b", original.replace(anchor, anchor + f'    fprintf(stream, "{text}\\n");\n')),
    ):
        (work / side / "common").mkdir(parents=True)
        (work / side / relative).write_text(content, encoding="utf-8")
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", f"a/{relative}", f"b/{relative}"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "0001-banner.patch").write_text(diff, encoding="utf-8")
    (directory / "series").write_text("0001-banner.patch\n", encoding="utf-8")
    return directory


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def hit_series(
    trees: dict[str, Path], runs: int, options: list[str]
) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU times of cache-hit `invoke build --json` runs, one per tree in turn, each with that tree first
    on PYTHONPATH (the source and tasks.py) and run from it, as a user runs `invoke` in a checkout. The CPU time
    (user + system) is the steadier figure on a shared machine. One untimed run per tree first: it leaves what a
    tree keeps between runs (its CLI index, its rendered build files) in the store, as any earlier run would."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in trees}
    for round_ in range(runs + 1):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
            cpu = child_cpu()
            elapsed, out = timed([sys.executable, "-m", "invoke", "build", *options, "--json"], env, cwd=tree)
            assert json.loads(out)["build"]["cached"], f"{name}: expected a cache hit"
            if round_ == 0:
                continue  # the untimed run
            times[name][0].append(elapsed)
            times[name][1].append(child_cpu() - cpu)
    return times


def raw_cmake(plan: Any, source: Path, env: dict[str, str]) -> float:
    """Seconds of plain `cmake -G Ninja` + `cmake --build` of the plan's targets in its builder image (the source
    mounted read-only, no ccache)."""
    assert plan.environment.image is not None
    raw_args = " ".join(f"'{arg}'" for arg in plan.cmake_args)
    targets = " ".join(plan.targets)
    raw_script = (
        f"cmake -S /src -B /tmp/b {raw_args} -DGGML_CCACHE=OFF >/dev/null"
        f" && cmake --build /tmp/b --target {targets} >/dev/null"
    )
    print("P1 raw cmake -G Ninja in the builder image ...", flush=True)
    command = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{source}:/src:ro",
        plan.environment.image.tag,
        "bash",
        "-c",
        raw_script,
    ]
    raw, _ = timed(command, env)
    return raw


def p1_only(cpu: str | None) -> None:
    """P1 in ABBA order: raw, cold, cold, raw; each cold build in a fresh store with an empty ccache volume."""
    sys.path.insert(0, str(ROOT / "src"))
    from llamaforge.build.executors.docker import DockerExecutor
    from llamaforge.build.plan import BuildOptions, plan_build
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    recipe = load_recipe("default")
    source = fetch_source(recipe.source)
    plan = plan_build(recipe, BuildOptions(cpu=cpu))
    DockerExecutor().prepare_environment(plan, lambda event: None)  # the builder image, not timed
    options = ["--cpu", cpu] if cpu else []
    raws, colds = [], []
    for side in ("raw", "cold", "cold", "raw"):
        if side == "raw":
            raws.append(raw_cmake(plan, source, dict(os.environ)))
            print(f"   raw: {raws[-1]:.1f} s", flush=True)
            continue
        home = Path(tempfile.mkdtemp(prefix="lf-bench-home-"))
        volume = f"llamaforge-bench-ccache-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "LLAMAFORGE_HOME": str(home), "LLAMAFORGE_CCACHE_VOLUME": volume}
        print("P1 cold invoke build (fresh store, empty ccache volume) ...", flush=True)
        try:
            cold, _ = timed([sys.executable, "-m", "invoke", "build", *options, "--json"], env)
        finally:
            subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
        colds.append(cold)
        print(f"   invoke build: {cold:.1f} s", flush=True)
    ratio = sum(colds) / sum(raws)
    print(
        f"P1 cold invoke build / raw cmake ({plan.cpu}, {len(plan.targets)} targets) = {sum(colds):.1f} s / "
        f"{sum(raws):.1f} s = {ratio:.3f}  (runs: raw {[round(v, 1) for v in raws]}, cold "
        f"{[round(v, 1) for v in colds]}; goal <= 1.05)"
    )


def p2_only(arguments: argparse.Namespace) -> None:
    """P2 alone on the store in LLAMAFORGE_HOME: median cache-hit time, beside a baseline checkout if given."""
    trees = {"this tree": ROOT}
    if arguments.baseline is not None:
        trees = {"baseline": arguments.baseline.resolve(), **trees}
    times = hit_series(trees, arguments.runs, arguments.options)
    for name, (wall, cpu) in times.items():
        print(
            f"P2 cached invoke build ({name}), median of {len(wall)} = {statistics.median(wall):.2f} s "
            f"(min {min(wall):.2f}, max {max(wall):.2f}; CPU median {statistics.median(cpu):.2f} s; goal <= 0.5 s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--p1", action="store_true", help="only P1, ABBA: raw, cold, cold, raw")
    parser.add_argument("--cpu", help="--p1: build this CPU level (e.g. x86-64-v3) instead of the recipe's")
    parser.add_argument("--p2", action="store_true", help="only P2, on the build store in LLAMAFORGE_HOME")
    parser.add_argument("--runs", type=int, default=7, help="cache hits per tree (--p2)")
    parser.add_argument("--baseline", type=Path, help="another llamaforge checkout to time beside this one")
    parser.add_argument("options", nargs="*", help="`invoke build` options, after --")
    arguments = parser.parse_args()
    if arguments.p1:
        p1_only(arguments.cpu)
    elif arguments.p2:
        p2_only(arguments)
    else:
        full_run()


def full_run() -> None:
    """P1, P2 and P3 in a fresh store and ccache volume."""
    home = Path(tempfile.mkdtemp(prefix="lf-bench-home-"))
    volume = f"llamaforge-bench-ccache-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LLAMAFORGE_HOME": str(home), "LLAMAFORGE_CCACHE_VOLUME": volume}
    invoke = [sys.executable, "-m", "invoke"]

    sys.path.insert(0, str(ROOT / "src"))
    os.environ.update(env)
    from llamaforge.build.executors.docker import DockerExecutor
    from llamaforge.build.plan import BuildOptions, plan_build
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    source = fetch_source(load_recipe("default").source)
    series_a = make_series(home / "series-a", source, "bench patch A")
    series_b = make_series(home / "series-b", source, "bench patch B")
    plan = plan_build(load_recipe("default"), BuildOptions(patches=str(series_a)))

    # Builder image first (not timed), so neither side of P1 pays for it.
    DockerExecutor().prepare_environment(plan, lambda event: None)

    raw = raw_cmake(plan, source, env)
    print(f"   raw: {raw:.1f} s", flush=True)
    print("P1 cold invoke build (empty ccache volume) ...", flush=True)
    cold, out = timed([*invoke, "build", "--patches", str(series_a), "--json"], env)
    print(f"   invoke build: {cold:.1f} s", flush=True)
    key = json.loads(out)["build"]["key"]

    hits = hit_series({"this tree": ROOT}, 5, ["--patches", str(series_a)])["this tree"][0]

    print("P3 rebuild after changing the patch (warm ccache) ...", flush=True)
    changed, out = timed([*invoke, "build", "--patches", str(series_b), "--json"], env)
    assert json.loads(out)["build"]["key"] != key

    subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
    print()
    print(
        f"P1 cold invoke build / raw cmake  = {cold:.1f} s / {raw:.1f} s = {cold / raw:.3f}  (goal <= 1.05)"
    )
    print(
        f"P2 cached invoke build, median of 5 = {statistics.median(hits):.2f} s "
        f"(min {min(hits):.2f}, max {max(hits):.2f}; goal <= 0.5 s)"
    )
    print(
        f"P3 one-patch rebuild / cold build = {changed:.1f} s / {cold:.1f} s = {changed / cold:.3f}  (goal <= 0.1)"
    )


if __name__ == "__main__":
    main()
