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
import math
import platform
import re
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamaforge import __version__
from llamaforge.core.errors import InvalidOption, LlamaforgeError, ModelError, SmokeFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import home
from llamaforge.core.validation import describe_errors, suggest
from llamaforge.gguf.header import read_header
from llamaforge.models.recipes import AnswerCheck
from llamaforge.runners.process import LOCAL, ProcessRunner
from llamaforge.serve.bandwidth import bytes_per_token
from llamaforge.serve.launcher import HOST, LlamaFlags, LlamaServer, ServerLaunch
from llamaforge.smoke.answers import answer_verdict_checks, check_answers, golden_stage
from llamaforge.smoke.bench import BenchRun, run_llama_bench
from llamaforge.smoke.cpu_features import diagnose, diagnosis_line, read_host_flags
from llamaforge.smoke.roofline import (
    Bandwidth,
    cpu_threads_default,
    gpu_bandwidth,
    probe_cpu_bandwidth,
    roofline,
)
from llamaforge.smoke.server import ChatRequest, LevelRun, run_level, stream_chat

DEFAULT_PROMPT = "Write a short paragraph about the history of the printing press."
NON_EMPTY_PROMPT = "What is the capital of France? Answer in one word."
MAX_REQUESTS = 256  # per level: a smoke, not a load test


class SmokeThresholds(BaseModel):
    """What a run must show to pass; each may come from the build recipe, the model recipe or the CLI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_tg_tps: float | None = Field(
        1.0, ge=0, description="Minimum llama-bench tg tokens/s (none: no check)"
    )
    max_ttft_ms: float | None = Field(
        10_000.0, gt=0, description="Maximum p95 time to first token at the lowest concurrency, ms"
    )
    non_empty_answer: str | None = Field(
        NON_EMPTY_PROMPT,
        description="A prompt the server must answer with a non-empty reply, whatever it says (none: skip); "
        "a model recipe's [[answers]] check what the reply says",
    )


def parse_threshold_items(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items and/or paths of TOML files with those keys; ``none`` clears a threshold."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            path = Path(item)
            if not path.is_file():
                raise InvalidOption(
                    f"--thresholds {item!r} is neither KEY=VALUE nor a TOML file",
                    hint="e.g. --thresholds min_tg_tps=20 --thresholds max_ttft_ms=500",
                )
            try:
                values.update(tomllib.loads(path.read_text(encoding="utf-8")))
            except tomllib.TOMLDecodeError as error:
                raise InvalidOption(f"thresholds file {path} is not valid TOML: {error}") from None
            continue
        key, raw = key.strip(), raw.strip()
        values[key] = None if raw.lower() in ("none", "off", "") else raw
    return values


def resolve_thresholds(
    layers: Sequence[tuple[str, Mapping[str, Any] | None]],
) -> tuple[SmokeThresholds, dict[str, str]]:
    """Merge threshold layers in order (later wins): the thresholds and, per key, the layer that set it."""
    merged: dict[str, Any] = {}
    sources = dict.fromkeys(SmokeThresholds.model_fields, "default")
    for origin, layer in layers:
        for key, value in (layer or {}).items():
            if key not in SmokeThresholds.model_fields:
                raise InvalidOption(
                    f"unknown threshold {key!r} (from {origin})",
                    hint=suggest(key, SmokeThresholds.model_fields, end=" ")
                    + "known: " + ", ".join(SmokeThresholds.model_fields),
                )  # fmt: skip
            merged[key] = value
            sources[key] = origin
    try:
        return SmokeThresholds.model_validate(merged), sources
    except ValidationError as error:
        raise InvalidOption(f"invalid thresholds: {describe_errors(error)}") from None


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
    bandwidth_gbs: float | None = None
    golden: Path | None = None  # compare greedy tokens and top-n logprobs with this golden
    record_golden: Path | None = None  # record them to this file (from a reference build)

    def __post_init__(self) -> None:
        if self.golden is not None and self.record_golden is not None:
            raise InvalidOption("--golden and --record-golden exclude each other: record first, then compare")
        if (self.golden or self.record_golden) and self.skip_server:
            raise InvalidOption("--golden and --record-golden need the server stage (drop --skip-server)")
        if not self.concurrency or min(self.concurrency) < 1:
            raise InvalidOption(
                "concurrency levels must be >= 1", hint="e.g. --concurrency 1 --concurrency 4"
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


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float] | None:
    """n, min, p50, p95, max and mean of ``values`` (None when there are none)."""
    if not values:
        return None
    return {"n": len(values), "min": min(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values), "mean": sum(values) / len(values)}  # fmt: skip


def summarize_level(level: LevelRun) -> dict[str, Any]:
    """Latency and throughput figures of one concurrency level, cross-checked with the server's timings."""
    ok = [s for s in level.samples if s.error is None and s.chunks]
    tokens = sum(s.completion_tokens for s in ok)
    server_tps = [
        s.server_timings["predicted_per_second"] for s in ok if "predicted_per_second" in s.server_timings
    ]
    client_tps = [s.decode_tps for s in ok if s.decode_tps]
    ratios = [
        s.decode_tps / s.server_timings["predicted_per_second"] for s in ok
        if s.decode_tps and s.server_timings.get("predicted_per_second")
    ]  # fmt: skip
    server_pp = [s.server_timings["prompt_per_second"] for s in ok if "prompt_per_second" in s.server_timings]
    ttft_gap = [
        s.ttft_ms - s.server_timings["prompt_ms"] for s in ok if s.ttft_ms and "prompt_ms" in s.server_timings
    ]
    return {
        "concurrency": level.concurrency,
        "requests": len(level.samples),
        "errors": [s.error for s in level.samples if s.error is not None],
        "wall_s": level.wall_s,
        "completion_tokens": tokens,
        "aggregate_tps": tokens / level.wall_s if level.wall_s > 0 else None,
        "ttft_ms": distribution([s.ttft_ms for s in ok if s.ttft_ms is not None]),
        "itl_ms": distribution([v for s in ok for v in s.itl_ms]),
        "e2e_ms": distribution([s.e2e_ms for s in ok if s.e2e_ms is not None]),
        "decode_tps": distribution(client_tps),
        "cross_check": {
            "server_decode_tps": distribution(server_tps),
            "server_prompt_tps": distribution(server_pp),
            "client_over_server_decode": distribution(ratios),
            "ttft_minus_server_prompt_ms": distribution(ttft_gap),
            "note": "client decode tok/s over the server's timings.predicted_per_second (1.0 = they agree); "
            "TTFT minus the server's prompt_ms is HTTP, queueing and first-token time",
        },
    }


def _check(name: str, status: str, value: Any, threshold: Any, source: str, detail: str) -> dict[str, Any]:
    return {"name": name, "status": status, "value": value, "threshold": threshold, "source": source,
            "detail": detail}  # fmt: skip


def evaluate(
    report: Mapping[str, Any], thresholds: SmokeThresholds, sources: Mapping[str, str]
) -> dict[str, Any]:
    """The verdict: each check passes, fails or is skipped (its stage did not run); any failure fails the run."""
    checks = []
    bench, server = report.get("bench"), report.get("server")
    tg = next((t for t in bench["tests"] if t["kind"] == "tg"), None) if bench else None
    if thresholds.min_tg_tps is not None:
        if tg is None:
            checks.append(_check("min_tg_tps", "skipped", None, thresholds.min_tg_tps, sources["min_tg_tps"],
                                 "llama-bench stage did not run"))  # fmt: skip
        else:
            passed = tg["avg_ts"] >= thresholds.min_tg_tps
            checks.append(_check("min_tg_tps", "pass" if passed else "fail", tg["avg_ts"], thresholds.min_tg_tps,
                                 sources["min_tg_tps"], f"llama-bench {tg['name']} average tokens/s"))  # fmt: skip
    levels = server["levels"] if server else []
    if thresholds.max_ttft_ms is not None:
        lowest = min(levels, key=lambda level: level["concurrency"]) if levels else {}
        ttft = lowest.get("ttft_ms")
        if ttft is None:
            checks.append(_check("max_ttft_ms", "skipped" if not server else "fail", None, thresholds.max_ttft_ms,
                                 sources["max_ttft_ms"], "no time to first token was measured"))  # fmt: skip
        else:
            passed = ttft["p95"] <= thresholds.max_ttft_ms
            detail = f"p95 TTFT at concurrency {lowest['concurrency']}"
            checks.append(_check("max_ttft_ms", "pass" if passed else "fail", ttft["p95"], thresholds.max_ttft_ms,
                                 sources["max_ttft_ms"], detail))  # fmt: skip
    if server:
        errors = [error for level in levels for error in level["errors"]]
        checks.append(_check("no_failed_requests", "fail" if errors else "pass", len(errors), 0, "built-in",
                             "; ".join(errors[:3]) or "every request streamed tokens"))  # fmt: skip
    if thresholds.non_empty_answer is not None:
        answer = server.get("non_empty_answer") if server else None
        source = sources["non_empty_answer"]
        if answer is None:
            checks.append(_check("non_empty_answer", "skipped", None, thresholds.non_empty_answer, source,
                                 "server stage did not run"))  # fmt: skip
        else:
            reply = answer["reply"].strip()
            detail = answer.get("error") or "a non-empty reply"
            checks.append(_check("non_empty_answer", "pass" if reply else "fail", reply[:200],
                                 thresholds.non_empty_answer, source, detail))  # fmt: skip
    checks += answer_verdict_checks(server or {})
    return {"passed": not any(check["status"] == "fail" for check in checks), "checks": checks}


def tiny_smoke_model(reporter: Reporter = null_reporter, cancel: CancelToken | None = None) -> Path:
    """The default smoke model: a tiny random-weight qwen3 GGUF, written once under ``home()/models/tiny/``.

    Its tokenizer comes from the default recipe's llama.cpp source (models/ggml-vocab-qwen2.gguf), so no hub
    is needed; the file name carries a digest of the spec, so a changed spec gets a new file.
    """
    import hashlib

    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    spec = TinyModelSpec(arch="qwen3")
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    path = home() / "models" / "tiny" / f"tiny-qwen3-{digest}.gguf"
    if not path.is_file():
        reporter(Event("stage", f"writing the tiny qwen3 smoke model {path.name}", stage="model"))
        tree = fetch_source(load_recipe("default").source, reporter=reporter, cancel=cancel)
        write_tiny_model(path, spec, tree / "models" / "ggml-vocab-qwen2.gguf")
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "model"


def smoke_root() -> Path:
    """Directory of smoke runs and comparisons."""
    return home() / "smoke"


def new_run_dir(model_label: str, build_key: str) -> tuple[str, Path]:
    """A fresh ``smoke/<run-id>/`` (UTC time, model, build key prefix)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{_slug(model_label)}-{build_key[:8]}"
    smoke_root().mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        try:
            (smoke_root() / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, smoke_root() / run_id
    raise SmokeFailed(f"cannot create a run directory under {smoke_root()}")


def _bench_stage(
    target: SmokeTarget, options: SmokeOptions, run_dir: Path, cancel: CancelToken, runner: ProcessRunner
) -> BenchRun:
    return run_llama_bench(
        target.binary("llama-bench"), target.model, run_dir, pp=options.pp, tg=options.tg,
        repetitions=options.repetitions, threads=options.threads, timeout_s=options.bench_timeout_s, cancel=cancel,
        runner=runner,
    )  # fmt: skip


def _server_stage(
    target: SmokeTarget, options: SmokeOptions, thresholds: SmokeThresholds, run_dir: Path,
    reporter: Reporter, cancel: CancelToken, runner: ProcessRunner,
) -> dict[str, Any]:  # fmt: skip
    slots = max(options.concurrency)
    # -lv 4: llama-server logs its system_info line (the CPU features in use) only at trace verbosity.
    flags = LlamaFlags(ctx=slots * options.ctx_per_slot, parallel=slots, threads=options.threads,
                       threads_batch=options.threads, log_verbosity=4)  # fmt: skip
    launch = ServerLaunch(
        binary=target.binary("llama-server"), model=target.model, flags=flags, log_path=run_dir / "server.log",
        port=options.port, load_timeout_s=options.load_timeout_s,
    )  # fmt: skip
    data: dict[str, Any] = {}
    with LlamaServer(launch, reporter, cancel, runner) as server:
        data.update(pid=server.pid, port=server.port, command=server.command, startup_s=server.startup_s,
                    busy_ports=server.busy_ports)  # fmt: skip
        reporter(Event("info", f"llama-server ready on 127.0.0.1:{server.port} in {server.startup_s:.1f} s",
                       stage="server"))  # fmt: skip
        # The non-empty-answer request goes first: it also warms the server up before anything is timed.
        prompt = thresholds.non_empty_answer or "Say hello."
        answer = stream_chat(server.port, ChatRequest(prompt, 64, ignore_eos=False), index=0, concurrency=1,
                             timeout=options.request_timeout_s, t0=time.perf_counter())  # fmt: skip
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
                base_url, golden=options.golden, record_golden=options.record_golden, timeout=options.request_timeout_s,
                source={"build": target.build_key, "model": target.model_label, "size": target.model.stat().st_size},
            )  # fmt: skip
        cancel.raise_if_cancelled()
        levels = []
        for concurrency in options.concurrency:
            reporter(Event("stage", f"server: {options.requests} streaming requests at concurrency {concurrency}",
                           stage="server"))  # fmt: skip
            level = run_level(server.port, ChatRequest(options.prompt, options.max_tokens), concurrency=concurrency,
                              requests=options.requests, timeout=options.request_timeout_s, reporter=reporter,
                              cancel=cancel)  # fmt: skip
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
    logs = [path.read_text(encoding="utf-8", errors="replace") for path in
            (run_dir / "server.log", run_dir / "bench.log") if path.is_file()]  # fmt: skip
    diagnosis = diagnose(logs, read_host_flags(runner), target.manifest)
    if diagnosis["warning"]:
        reporter(Event("warning", f"{diagnosis['warning']}: {diagnosis['cause']}; fix: {diagnosis['fix']}",
                       stage="cpu"))  # fmt: skip
    return diagnosis


def _host() -> dict[str, Any]:
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": cpu_threads_default(),
            "python": platform.python_version()}  # fmt: skip


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
        "schema": 1, "run_id": run_id, "run_dir": str(run_dir), "started_at": started_at,
        "llamaforge_version": __version__, "host": _host(),
        "build": {"key": target.build_key, "path": str(target.build_dir),
                  "recipe": (target.manifest.get("recipe") or {}).get("name"),
                  "backend": target.manifest.get("backend"),
                  "cuda_architectures": target.manifest.get("cuda_architectures", []),
                  "patches": [p["name"] for p in target.manifest.get("patches", [])]},
        "model": {"path": str(target.model), "label": target.model_label, "size": target.model.stat().st_size},
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()},
        "thresholds": {**thresholds.model_dump(), "sources": dict(sources)},
        "bench": None, "server": None, "roofline": None, "cpu_features": None,
    }  # fmt: skip
    reporter(Event("info", f"smoke run {run_id} in {run_dir}", stage="smoke"))
    try:
        bench = None
        if not options.skip_bench:
            reporter(Event("stage", f"llama-bench: pp{options.pp} tg{options.tg} x{options.repetitions}",
                           stage="bench"))  # fmt: skip
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
