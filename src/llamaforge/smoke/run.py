"""Smoke runs: does a build serve a model, and how fast?

A run has two stages, each optional: llama-bench (pp/tg tokens/s with repetitions, :mod:`smoke_bench`) and
llama-server on loopback measured with real streaming chat completions (TTFT, inter-token latency, tokens/s,
end-to-end latency per concurrency level, :mod:`smoke_server`). Thresholds turn the numbers into a pass/fail
verdict; the memory roofline (:mod:`smoke_roofline`) says how close tg comes to what bandwidth allows.
Everything lands in ``home()/smoke/<run-id>/``: report.json (all raw samples), summary.md, PNG plots, the
llama-bench output and the server log (:mod:`smoke_report`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.core.errors import InvalidOption, LlamaforgeError, ModelError, SmokeFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import home
from llamaforge.core.version import __version__
from llamaforge.gguf.header import read_header
from llamaforge.models.recipes import AnswerCheck
from llamaforge.runners.process import LOCAL, ProcessRunner
from llamaforge.serve.bandwidth import bytes_per_token
from llamaforge.serve.launcher import HOST, LlamaFlags, LlamaServer, ServerLaunch
from llamaforge.smoke.answers import check_answers, golden_stage
from llamaforge.smoke.bench import BenchRun, run_llama_bench
from llamaforge.smoke.cpu_features import build_cpu_level, diagnose, diagnosis_line, read_host_flags
from llamaforge.smoke.cpu_modules import SweepOptions, sweep_cpu_modules
from llamaforge.smoke.report import fresh_directory
from llamaforge.smoke.roofline import (
    Bandwidth,
    cpu_threads_default,
    gpu_bandwidth,
    probe_cpu_bandwidth,
    roofline,
)
from llamaforge.smoke.server import ChatRequest, run_level, stream_chat
from llamaforge.smoke.verdict import (
    SmokeThresholds,
    evaluate,
    summarize_level,
)

DEFAULT_PROMPT = "Write a short paragraph about the history of the printing press."
MAX_REQUESTS = 256  # per level: a smoke, not a load test


@dataclass(frozen=True)
class SmokeOptions:
    """How much to measure. Defaults suit the tiny CI model on two cores."""

    pp: int = 64
    tg: int = 32
    repetitions: int = 3
    threads: int | None = None  # None: llama.cpp's default
    concurrency: tuple[int, ...] = (1, 2)
    requests: int = 4  # per concurrency level
    max_tokens: int = 32
    prompt: str = DEFAULT_PROMPT
    ctx_per_slot: int = 1024
    port: int | None = None
    load_timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    bench_timeout_s: float = 600.0
    skip_bench: bool = False
    skip_server: bool = False
    skip_cpu_modules: bool = False  # else the sweep runs with llama-bench (when the build has modules)
    bandwidth_gbs: float | None = None
    golden: Path | None = None  # compare greedy tokens and top-n logprobs with this golden
    record_golden: Path | None = None  # record them to this file (from a reference build)
    server_args: tuple[str, ...] = ()  # more llama-server flags, checked (llamaforge.serve.server_args)

    def __post_init__(self) -> None:
        if self.golden is not None and self.record_golden is not None:
            raise InvalidOption("--golden and --record-golden exclude each other: record first, then compare")
        if (self.golden or self.record_golden) and self.skip_server:
            raise InvalidOption("--golden and --record-golden need the server stage (drop --skip-server)")
        if not self.concurrency or min(self.concurrency) < 1:
            raise InvalidOption(
                "concurrency levels must be >= 1", hint="e.g. --concurrency 1 --concurrency 4"
            )
        twice = sorted({level for level in self.concurrency if self.concurrency.count(level) > 1})
        if twice:
            # a level run twice was two server entries of one concurrency, which compare and the verdict key by it
            raise InvalidOption(
                f"--concurrency {', '.join(map(str, twice))} given more than once",
                hint="give each level once, e.g. --concurrency 1 --concurrency 4",
            )
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise InvalidOption(f"--requests must be 1..{MAX_REQUESTS} per level (a smoke, not a load test)")
        if min(self.pp, self.tg, self.repetitions, self.max_tokens) < 1:
            raise InvalidOption("--pp, --tg, --repetitions and --max-tokens must be >= 1")


@dataclass(frozen=True)
class SmokeTarget:
    """What is smoked: a build's binaries and a model file."""

    build_key: str
    build_dir: Path
    manifest: Mapping[str, Any]
    model: Path
    model_label: str
    answers: tuple[AnswerCheck, ...] = ()  # the model recipe's [[answers]]

    def binary(self, name: str) -> Path:
        """A binary of the build (``bin/NAME``, or ``NAME`` in a plain directory of binaries)."""
        for candidate in (self.build_dir / "bin" / name, self.build_dir / name):
            if candidate.is_file():
                return candidate
        raise SmokeFailed(f"build {self.build_key} has no {name}", hint="add it to the recipe's targets")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "model"


def smoke_root() -> Path:
    """Directory of smoke runs and comparisons."""
    return home() / "smoke"


def new_run_dir(model_label: str, build_key: str) -> tuple[str, Path]:
    """A fresh ``smoke/<run-id>/`` (UTC time, model, build key prefix)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{_slug(model_label)}-{build_key[:8]}"
    path = fresh_directory(smoke_root(), base, "smoke run")
    return path.name, path


def _bench_stage(
    target: SmokeTarget, options: SmokeOptions, run_dir: Path, cancel: CancelToken, runner: ProcessRunner
) -> BenchRun:
    return run_llama_bench(
        target.binary("llama-bench"),
        target.model,
        run_dir,
        pp=options.pp,
        tg=options.tg,
        repetitions=options.repetitions,
        threads=options.threads,
        timeout_s=options.bench_timeout_s,
        cancel=cancel,
        runner=runner,
    )


def _cpu_modules_stage(
    target: SmokeTarget,
    options: SmokeOptions,
    run_dir: Path,
    reporter: Reporter,
    cancel: CancelToken,
    runner: ProcessRunner,
) -> dict[str, Any]:
    reporter(Event("stage", "CPU modules: llama-bench with each one on its own", stage="cpu-modules"))
    sweep_options = SweepOptions(threads=options.threads, timeout_s=options.bench_timeout_s)
    return sweep_cpu_modules(
        target.binary("llama-bench"),
        target.model,
        run_dir / "cpu-modules",
        sweep_options,
        cpu_level=build_cpu_level(target.manifest),
        reporter=reporter,
        cancel=cancel,
        runner=runner,
    )


def _server_stage(
    target: SmokeTarget,
    options: SmokeOptions,
    thresholds: SmokeThresholds,
    run_dir: Path,
    reporter: Reporter,
    cancel: CancelToken,
    runner: ProcessRunner,
) -> dict[str, Any]:
    slots = max(options.concurrency)
    # -lv 4: llama-server logs its system_info line (the CPU features in use) only at trace verbosity.
    flags = LlamaFlags(
        ctx=slots * options.ctx_per_slot,
        parallel=slots,
        threads=options.threads,
        threads_batch=options.threads,
        log_verbosity=4,
        extra=options.server_args,
    )
    launch = ServerLaunch(
        binary=target.binary("llama-server"),
        model=target.model,
        flags=flags,
        log_path=run_dir / "server.log",
        port=options.port,
        load_timeout_s=options.load_timeout_s,
    )
    data: dict[str, Any] = {}
    with LlamaServer(launch, reporter, cancel, runner) as server:
        data.update(
            pid=server.pid,
            port=server.port,
            command=server.command,
            startup_s=server.startup_s,
            busy_ports=server.busy_ports,
        )
        reporter(
            Event(
                "info",
                f"llama-server ready on 127.0.0.1:{server.port} in {server.startup_s:.1f} s",
                stage="server",
            )
        )
        # The non-empty-answer request goes first: it also warms the server up before anything is timed.
        prompt = thresholds.non_empty_answer or "Say hello."
        answer = stream_chat(
            server.port,
            ChatRequest(prompt, 64, ignore_eos=False),
            index=0,
            concurrency=1,
            timeout=options.request_timeout_s,
            t0=time.perf_counter(),
        )
        cancel.raise_if_cancelled()
        data["non_empty_answer"] = dataclasses.asdict(answer) if thresholds.non_empty_answer else None
        data["warmup"] = None if thresholds.non_empty_answer else dataclasses.asdict(answer)
        base_url = f"http://{HOST}:{server.port}"
        if target.answers:
            reporter(Event("stage", f"server: {len(target.answers)} checked answers", stage="server"))
            outcomes = check_answers(base_url, target.answers, timeout=options.request_timeout_s)
            data["answers"] = [dataclasses.asdict(outcome) for outcome in outcomes]
        if options.golden or options.record_golden:
            path = options.record_golden or options.golden
            reporter(Event("stage", f"server: greedy tokens for the golden {path}", stage="server"))
            data["golden"] = golden_stage(
                base_url,
                golden=options.golden,
                record_golden=options.record_golden,
                timeout=options.request_timeout_s,
                source={
                    "build": target.build_key,
                    "model": target.model_label,
                    "size": target.model.stat().st_size,
                },
            )
        cancel.raise_if_cancelled()
        levels = []
        for concurrency in options.concurrency:
            reporter(
                Event(
                    "stage",
                    f"server: {options.requests} streaming requests at concurrency {concurrency}",
                    stage="server",
                )
            )
            level = run_level(
                server.port,
                ChatRequest(options.prompt, options.max_tokens),
                concurrency=concurrency,
                requests=options.requests,
                timeout=options.request_timeout_s,
                reporter=reporter,
                cancel=cancel,
            )
            levels.append(
                {**summarize_level(level), "samples": [dataclasses.asdict(s) for s in level.samples]}
            )
        data["levels"] = levels
    return data


def _roofline_stage(
    target: SmokeTarget, options: SmokeOptions, bench: BenchRun | None, reporter: Reporter
) -> dict[str, Any]:
    tg = bench.test("tg") if bench else None
    if bench is None or tg is None:
        return {"error": "needs the llama-bench tg figure"}
    bandwidth: Bandwidth | None
    if options.bandwidth_gbs:
        bandwidth = Bandwidth(options.bandwidth_gbs, "given: --bandwidth-gbs")
    elif not bench.gpu_info or bench.n_gpu_layers == 0:  # weights stream from host memory
        reporter(Event("stage", "roofline: measuring memory bandwidth", stage="roofline"))
        bandwidth = probe_cpu_bandwidth(bench.n_threads or cpu_threads_default())
    else:
        bandwidth = gpu_bandwidth(bench.gpu_info)
        if bandwidth is None:
            return {"error": f"no bandwidth known for GPU {bench.gpu_info!r}; pass --bandwidth-gbs"}
    try:
        token_bytes = bytes_per_token(read_header(target.model), kv_depth=tg.n_depth + tg.n_gen / 2)
    except (ModelError, InvalidOption) as error:
        return {"error": error.message}
    return roofline(tg.avg_ts, bandwidth, token_bytes)


def _cpu_features_stage(
    target: SmokeTarget, run_dir: Path, reporter: Reporter, runner: ProcessRunner
) -> dict[str, Any]:
    logs = [
        path.read_text(encoding="utf-8", errors="replace")
        for path in (run_dir / "server.log", run_dir / "bench.log")
        if path.is_file()
    ]
    diagnosis = diagnose(logs, read_host_flags(runner), target.manifest)
    if diagnosis["warning"]:
        reporter(
            Event(
                "warning",
                f"{diagnosis['warning']}: {diagnosis['cause']}; fix: {diagnosis['fix']}",
                stage="cpu",
            )
        )
    return diagnosis


def _host() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": cpu_threads_default(),
        "python": platform.python_version(),
    }


def run_smoke(
    target: SmokeTarget,
    options: SmokeOptions,
    thresholds: SmokeThresholds,
    sources: Mapping[str, str],
    *,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> dict[str, Any]:
    """Run the stages, judge, write the run directory; returns the full report (raw samples included).

    ``runner`` starts llama-bench and llama-server (this host by default)."""
    from llamaforge.smoke.report import write_run_files

    cancel = cancel or CancelToken()
    started, started_at = time.monotonic(), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run_id, run_dir = new_run_dir(target.model_label, target.build_key)
    report: dict[str, Any] = {
        "schema": 1,
        "run_id": run_id,
        "run_dir": str(run_dir),
        "started_at": started_at,
        "llamaforge_version": __version__,
        "host": _host(),
        "build": {
            "key": target.build_key,
            "path": str(target.build_dir),
            "recipe": (target.manifest.get("recipe") or {}).get("name"),
            "backend": target.manifest.get("backend"),
            "cuda_architectures": target.manifest.get("cuda_architectures", []),
            "patches": [p["name"] for p in target.manifest.get("patches", [])],
        },
        "model": {
            "path": str(target.model),
            "label": target.model_label,
            "size": target.model.stat().st_size,
        },
        "options": {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()
        },
        "thresholds": {**thresholds.model_dump(), "sources": dict(sources)},
        "bench": None,
        "server": None,
        "roofline": None,
        "cpu_features": None,
        "cpu_modules": None,
    }
    reporter(Event("info", f"smoke run {run_id} in {run_dir}", stage="smoke"))
    try:
        bench = None
        # Before llama-bench: when the loader's pick crashes, report.json still holds every module's outcome.
        if not options.skip_bench and not options.skip_cpu_modules:
            report["cpu_modules"] = _cpu_modules_stage(target, options, run_dir, reporter, cancel, runner)
        if not options.skip_bench:
            reporter(
                Event(
                    "stage",
                    f"llama-bench: pp{options.pp} tg{options.tg} x{options.repetitions}",
                    stage="bench",
                )
            )
            bench = _bench_stage(target, options, run_dir, cancel, runner)
            report["bench"] = dataclasses.asdict(bench)
            report["model"].update(
                type=bench.model_type, n_params=bench.model_n_params, bytes=bench.model_size
            )
        if not options.skip_server:
            reporter(Event("stage", "llama-server: starting on 127.0.0.1", stage="server"))
            report["server"] = _server_stage(target, options, thresholds, run_dir, reporter, cancel, runner)
        cancel.raise_if_cancelled()
        report["cpu_features"] = _cpu_features_stage(target, run_dir, reporter, runner)
        report["roofline"] = _roofline_stage(target, options, bench, reporter)
        report["roofline"]["cpu_diagnosis"] = diagnosis_line(report["cpu_features"])
        report["verdict"] = evaluate(report, thresholds, sources)
    except (LlamaforgeError, KeyboardInterrupt) as error:
        report["error"] = error.render() if isinstance(error, LlamaforgeError) else "interrupted"
        report["wall_s"] = time.monotonic() - started
        (run_dir / "report.json").write_text(
            json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8"
        )
        raise
    report["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    report["wall_s"] = time.monotonic() - started
    reporter(Event("stage", "writing report, summary and plots", stage="report"))
    report["files"] = write_run_files(report, run_dir)
    return report


def result_view(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without raw per-request samples (those stay in report.json), for CLI and tool results."""
    view = dict(report)
    if report.get("server"):
        server = dict(report["server"])
        server["levels"] = [{k: v for k, v in level.items() if k != "samples"} for level in server["levels"]]
        view["server"] = server
    return view
