"""Smoke stage 1: llama-bench prompt processing (pp) and token generation (tg), parsed from ``-o json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llamaforge.build.recipes import pinned_llama_cpp
from llamaforge.core.errors import SmokeFailed, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.runners.process import LOCAL, ProcessRunner

TestKind = Literal["pp", "tg", "pg"]


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test: its shape and tokens/s over the repetitions."""

    name: str  # compare-llama-bench style: pp512, tg128, pp512+tg128, with " @ d1024" for a depth
    kind: TestKind
    n_prompt: int
    n_gen: int
    n_depth: int
    avg_ts: float
    stddev_ts: float
    avg_ns: int
    stddev_ns: int
    samples_ts: list[float] = field(default_factory=list)
    samples_ns: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class BenchRun:
    """What llama-bench reported: build identity, model, hardware and the tests."""

    build_commit: str
    build_number: int
    backends: str
    cpu_info: str
    gpu_info: str
    model_type: str
    model_size: int
    model_n_params: int
    n_threads: int
    n_gpu_layers: int
    tests: list[BenchTest]

    def test(self, kind: TestKind) -> BenchTest | None:
        """The first test of ``kind`` (pp, tg or pg)."""
        return next((test for test in self.tests if test.kind == kind), None)


def _test_name(n_prompt: int, n_gen: int, n_depth: int) -> tuple[str, TestKind]:
    kind: TestKind
    if n_prompt and n_gen:
        name, kind = f"pp{n_prompt}+tg{n_gen}", "pg"
    elif n_gen:
        name, kind = f"tg{n_gen}", "tg"
    else:
        name, kind = f"pp{n_prompt}", "pp"
    return (f"{name} @ d{n_depth}" if n_depth else name), kind


def parse_llama_bench(text: str) -> BenchRun:
    """Parse llama-bench ``-o json`` output (a JSON array with one object per test)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise SmokeFailed(
            f"llama-bench printed no valid JSON ({error.msg} at char {error.pos})",
            hint="run llama-bench by hand with -o json; a crash mid-run leaves a truncated array",
        ) from None
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise SmokeFailed("llama-bench printed no test results", hint="check bench.log in the run directory")
    tests = []
    try:
        for row in rows:
            name, kind = _test_name(int(row["n_prompt"]), int(row["n_gen"]), int(row.get("n_depth", 0)))
            tests.append(
                BenchTest(
                    name=name,
                    kind=kind,
                    n_prompt=int(row["n_prompt"]),
                    n_gen=int(row["n_gen"]),
                    n_depth=int(row.get("n_depth", 0)),
                    avg_ts=float(row["avg_ts"]),
                    stddev_ts=float(row["stddev_ts"]),
                    avg_ns=int(row["avg_ns"]),
                    stddev_ns=int(row["stddev_ns"]),
                    samples_ts=[float(v) for v in row.get("samples_ts", [])],
                    samples_ns=[int(v) for v in row.get("samples_ns", [])],
                )
            )
        first: dict[str, Any] = rows[0]
        return BenchRun(
            build_commit=str(first["build_commit"]),
            build_number=int(first["build_number"]),
            backends=str(first.get("backends", "")),
            cpu_info=str(first.get("cpu_info", "")),
            gpu_info=str(first.get("gpu_info", "")),
            model_type=str(first["model_type"]),
            model_size=int(first["model_size"]),
            model_n_params=int(first["model_n_params"]),
            n_threads=int(first.get("n_threads", 0)),
            n_gpu_layers=int(first.get("n_gpu_layers", 0)),
            tests=tests,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise SmokeFailed(
            f"llama-bench JSON lacks an expected field or value: {error}",
            hint=f"this llama-bench may be older or newer than the formats llamaforge knows ({pinned_llama_cpp()})",
        ) from None


def bench_command(
    binary: Path, model: Path, *, pp: int, tg: int, repetitions: int, threads: int | None
) -> list[str]:
    """The llama-bench command line of the smoke stage (pp and tg tests, JSON on stdout)."""
    command = [
        str(binary),
        "-m",
        str(model),
        "-p",
        str(pp),
        "-n",
        str(tg),
        "-r",
        str(repetitions),
        "-o",
        "json",
    ]
    if threads:
        command += ["-t", str(threads)]
    return command


def run_llama_bench(
    binary: Path,
    model: Path,
    run_dir: Path,
    *,
    pp: int,
    tg: int,
    repetitions: int,
    threads: int | None,
    timeout_s: float,
    cancel: CancelToken,
    runner: ProcessRunner = LOCAL,
) -> BenchRun:
    """Run llama-bench through ``runner`` (``bench.json`` and ``bench.log`` in ``run_dir``) and parse its result."""
    command = bench_command(binary, model, pp=pp, tg=tg, repetitions=repetitions, threads=threads)
    log = run_dir / "bench.log"
    log.touch()
    loader: list[str] = []  # ggml's load_backend lines: a crash names the CPU module it ran

    def keep_loader(line: str) -> None:
        if "load_backend:" in line:
            loader.append(line)

    try:
        result = runner.run(
            command,
            timeout_s=timeout_s,
            cancel=cancel,
            log_path=log,
            what="llama-bench",
            on_line=keep_loader,
            hint="the log says why, e.g. a model file llama.cpp cannot load; on a timeout use fewer tokens",
        )
    except ToolFailed as error:
        raise error.as_crash("llama-bench", loader) from None
    (run_dir / "bench.json").write_text(result.stdout, encoding="utf-8")
    return parse_llama_bench(result.stdout)
