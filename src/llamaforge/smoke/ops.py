"""Operations ``smoke`` and ``smoke.compare``: resolve the build and the model, run :mod:`llamaforge.smoke.run`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from llamaforge.build.executors import ExecutorName
from llamaforge.core.errors import InvalidOption, OperationFailed, SmokeFailed
from llamaforge.core.registry import (
    MAX_WAIT_S,
    Int32,
    OperationContext,
    Params,
    Result,
    operation,
    path_field,
)
from llamaforge.serve.launcher import FIELD_FLAGS, SERVER_FLAGS
from llamaforge.serve.server_args import precheck_server_args, server_args_for
from llamaforge.smoke.builds import check_build_argument, default_build_executor, resolve_build
from llamaforge.smoke.ops_cpu_modules import CpuModuleSweep

if TYPE_CHECKING:
    from llamaforge.models.recipes import AnswerCheck


#: The llama-server flags smoke sets itself (one name of each option), refused in --server-args.
SMOKE_FLAGS = dict(
    zip(
        SERVER_FLAGS,
        ("--model", "smoke serves on 127.0.0.1", "--port", "smoke runs llama-server without the web UI"),
        strict=True,
    )
) | {
    FIELD_FLAGS["ctx"]: "--concurrency (1024 tokens a slot)",
    FIELD_FLAGS["parallel"]: "--concurrency (a slot each)",
    FIELD_FLAGS["threads"]: "--threads",
    FIELD_FLAGS["threads_batch"]: "--threads",
    FIELD_FLAGS["log_verbosity"]: "smoke reads the load log at -lv 4",
}


class SmokeParams(Params):
    """Parameters of ``smoke``."""

    build: str | None = path_field(
        None,
        description="Build key (or unique prefix) or build directory (default: the default recipe's CPU "
        "build, built if missing)",
    )
    model: str | None = path_field(
        None,
        description="Model recipe name or .toml file, hf://, ms://, https:// URL, or a GGUF file, or `tiny` (the "
        "default: the random-weight tiny Q4_0 qwen3) or `tiny-q4_k_m` (the same in the Q4_K_M mix, for the K-quant "
        "kernels); a recipe's [[answers]] are checked",
    )
    golden: str | None = path_field(
        None,
        description="Golden JSON to compare greedy tokens and top-n logprobs with (from --record-golden)",
    )
    record_golden: str | None = path_field(
        None,
        description="Record the greedy tokens and top-n logprobs to this JSON (run on a reference build)",
    )
    thresholds: list[str] = path_field(
        default_factory=list,
        description="Threshold KEY=VALUE (min_tg_tps, max_ttft_ms, non_empty_answer; none clears) or a TOML "
        "file; "
        "repeatable; overrides the build and model recipes",
    )
    pp: Int32 = Field(64, ge=1, description="llama-bench prompt tokens (pp test)")
    tg: Int32 = Field(32, ge=1, description="llama-bench generated tokens (tg test)")
    repetitions: int = Field(3, ge=1, le=50, description="llama-bench repetitions per test")
    threads: Int32 | None = Field(None, ge=1, description="CPU threads for llama-bench and llama-server")
    concurrency: list[Annotated[int, Field(ge=1, le=256)]] = Field(
        default_factory=list, description="Concurrency level, 1 to 256 (repeatable; default 1 and 2)"
    )
    requests: int = Field(4, ge=1, le=256, description="Streaming requests per concurrency level")
    max_tokens: Int32 = Field(32, ge=1, description="Tokens each measured request generates")
    port: int | None = Field(
        None, ge=1, le=65535, description="Preferred server port (a busy one is replaced)"
    )
    load_timeout_s: int = Field(
        300, ge=1, le=MAX_WAIT_S, description="Seconds the server may take to load the model"
    )
    skip_bench: bool = Field(False, description="Skip the llama-bench stage (and the CPU module sweep)")
    skip_cpu_modules: bool = Field(
        False, description="Skip the sweep of the build's CPU modules (llama-bench with each one on its own)"
    )
    skip_server: bool = Field(False, description="Skip the llama-server stage")
    server_args: str | None = Field(
        None,
        description='More llama-server flags, as one string split like a shell would (e.g. "--jinja"): '
        "checked against the build's own `llama-server --help`; the flags smoke sets itself are refused",
    )
    bandwidth_gbs: float | None = Field(
        None,
        gt=0,
        description="Memory bandwidth for the roofline, GB/s (default: measured on CPU, GPU table)",
    )
    executor: ExecutorName = Field("docker", description="Where to build the default build if it is missing")


def _model_target(
    params: SmokeParams, ctx: OperationContext
) -> tuple[Path, str, Mapping[str, Any] | None, tuple[AnswerCheck, ...]]:
    """The model file, its label, the thresholds and the checked answers its recipe declares (if any)."""
    from llamaforge.models.argument import resolve_model_argument
    from llamaforge.models.tiny import TINY_MODEL

    model = resolve_model_argument(params.model or TINY_MODEL, reporter=ctx.reporter, cancel=ctx.cancel)
    if model.recipe is None:
        return model.path, model.label, None, ()
    return model.path, model.label, model.recipe.smoke, tuple(model.recipe.answers)


class SmokeCheck(Result):
    """One check of the verdict: it passes, fails, or is skipped when its stage did not run."""

    name: str
    status: Literal["pass", "fail", "skipped"]
    value: Any
    threshold: Any
    source: str = Field(
        description="Where the threshold came from: build recipe, model recipe, cli, built-in"
    )
    detail: str


class SmokeVerdict(Result):
    """Every check; any failure fails the run."""

    passed: bool
    checks: list[SmokeCheck]


class SmokeResult(Result):
    """A smoke run: what ran where, the llama-bench and llama-server measurements, the roofline, the verdict
    and the files written (``smoke`` fails when the verdict fails). Raw per-request samples stay in report.json."""

    schema_: int = Field(alias="schema", description="Version of the report layout")
    run_id: str
    run_dir: str
    started_at: str
    finished_at: str
    llamaforge_version: str
    host: dict[str, Any]
    build: dict[str, Any] = Field(description="Build key, path, recipe, backend, archs, patches")
    model: dict[str, Any] = Field(description="Model path, label, size (and what llama-bench read from it)")
    options: dict[str, Any]
    thresholds: dict[str, Any] = Field(description="The thresholds in force and where each came from")
    bench: dict[str, Any] | None = Field(
        description="llama-bench: tests with their tokens/s (skip_bench: null)"
    )
    server: dict[str, Any] | None = Field(description="llama-server streaming, per concurrency level")
    roofline: dict[str, Any] | None = Field(description="Decode speed against the memory-bandwidth roof")
    cpu_modules: CpuModuleSweep | None = Field(
        None,
        description="Every CPU module of the build run on its own with llama-bench: loads here or not, crashed "
        "(signal), pp/tg t/s, the loader's default pick (null: skipped)",
    )
    cpu_features: dict[str, Any] | None = Field(
        None,
        description="CPU features the build uses (system_info / loaded variant) against the host's "
        "/proc/cpuinfo; warning, cause and fix when it leaves some unused",
    )
    verdict: SmokeVerdict
    wall_s: float
    files: dict[str, str] = Field(description="report.json, summary.md, plots, logs: name -> path")
    exit_code: int


@operation(
    "smoke",
    SmokeParams,
    read_only=False,
    long_running=True,
    cli="llamaforge.smoke.render:smoke_cli",
    html="llamaforge.smoke.render:smoke_html",
)
def smoke_op(params: SmokeParams, ctx: OperationContext) -> SmokeResult:
    """Smoke a build with a model: llama-bench + streaming llama-server, thresholds, report and plots."""
    from llamaforge.smoke.run import SmokeOptions, SmokeTarget, result_view, run_smoke
    from llamaforge.smoke.verdict import parse_threshold_items, resolve_thresholds

    options = SmokeOptions(
        pp=params.pp,
        tg=params.tg,
        repetitions=params.repetitions,
        threads=params.threads,
        concurrency=tuple(params.concurrency) or (1, 2),
        requests=params.requests,
        max_tokens=params.max_tokens,
        port=params.port,
        load_timeout_s=params.load_timeout_s,
        skip_bench=params.skip_bench,
        skip_server=params.skip_server,
        skip_cpu_modules=params.skip_cpu_modules,
        bandwidth_gbs=params.bandwidth_gbs,
        golden=Path(params.golden) if params.golden else None,
        record_golden=Path(params.record_golden) if params.record_golden else None,
    )
    if params.skip_bench and params.skip_server:
        raise InvalidOption(
            "--skip-bench and --skip-server together leave nothing to measure",
            hint="drop one of them: --skip-server measures llama-bench only, --skip-bench llama-server only",
        )
    if params.server_args and params.skip_server:
        raise InvalidOption(
            "--server-args are llama-server's, and --skip-server runs none",
            hint="drop --skip-server or --server-args",
        )
    precheck_server_args(params.server_args, SMOKE_FLAGS)  # before a build may start
    # before the model, which may be written or downloaded first
    if params.build is not None:
        check_build_argument(params.build)
    else:
        default_build_executor(params.executor)
    _check_golden_paths(options.golden, options.record_golden)
    cli = parse_threshold_items(params.thresholds)
    # The model before the build: a missing or unservable file is refused before a cold build can start.
    model, label, model_smoke, answers = _model_target(params, ctx)
    # a recipe's [smoke] values are checked here, not when it loads: before a cold build can start
    resolve_thresholds([(f"model recipe {params.model}", model_smoke), ("cli", cli)])
    key, directory, manifest = resolve_build(params.build, params.executor, ctx)
    server = next(
        (path for path in (directory / "bin" / "llama-server", directory / "llama-server") if path.is_file()),
        directory / "bin" / "llama-server",
    )
    extra = server_args_for(params.server_args, server, key if manifest else None, SMOKE_FLAGS)
    options = dataclasses.replace(options, server_args=extra)
    # A recipe may carry a [smoke] table once its schema has one; the CLI wins over both.
    build_smoke = (manifest.get("recipe") or {}).get("smoke")
    thresholds, sources = resolve_thresholds(
        [("build recipe", build_smoke), ("model recipe", model_smoke), ("cli", cli)]
    )
    target = SmokeTarget(
        build_key=key, build_dir=directory, manifest=manifest, model=model, model_label=label, answers=answers
    )
    report = run_smoke(target, options, thresholds, sources, reporter=ctx.reporter, cancel=ctx.cancel)
    view = result_view(report)
    view["exit_code"] = 0 if report["verdict"]["passed"] else SmokeFailed.exit_code
    result = SmokeResult.model_validate(view)
    if not report["verdict"]["passed"]:
        failed = [check for check in report["verdict"]["checks"] if check["status"] == "fail"]
        raise OperationFailed(
            f"smoke run {report['run_id']} FAILED its verdict: "
            + "; ".join(
                f"{check['name']} {check['value']!r} (threshold {check['threshold']!r}): {check['detail']}"
                for check in failed
            ),
            result=result,
            exit_code=SmokeFailed.exit_code,
            hint=f"the verdict lists every check; summary: {report['files']['summary.md']}",
        )
    return result


def _check_golden_paths(golden: Path | None, record_golden: Path | None) -> None:
    """Refuse a golden that cannot be read, or a place no golden can be recorded to, before the run: the golden
    stage comes last, after llama-bench and the server's measurements."""
    from llamaforge.smoke.answers import load_golden

    if golden is not None:
        load_golden(golden)
    if record_golden is None:
        return
    if record_golden.is_dir():
        raise InvalidOption(
            f"--record-golden {record_golden} is a directory", hint="give the path of the JSON file to write"
        )
    parent = next((path for path in record_golden.parents if path.exists()), None)
    if parent is not None and not parent.is_dir():
        raise InvalidOption(
            f"--record-golden {record_golden}: {parent} is a file, not a directory",
            hint="give a path in a directory (missing directories are made)",
        )


class SmokeCompareParams(Params):
    """Parameters of ``smoke.compare``."""

    run_a: str = path_field(description="First run (A, the baseline): run id, unique prefix or run directory")
    run_b: str = path_field(description="Second run (B): run id, unique prefix or run directory")


class SmokeCompareResult(Result):
    """Two runs side by side: what differs between them, and each metric with B/A and the speedup."""

    a: dict[str, Any] = Field(description="Run A (the baseline): run id, directory, build, model, host")
    b: dict[str, Any] = Field(description="Run B, the same fields")
    differs: list[str] = Field(description="The fields of a and b that differ")
    rows: list[dict[str, Any]] = Field(description="metric, unit, a, b, ratio, speedup, better")
    files: dict[str, str]


@operation(
    "smoke.compare",
    SmokeCompareParams,
    read_only=False,
    positional=("run_a", "run_b"),
    cli="llamaforge.smoke.render:smoke_compare_cli",
    html="llamaforge.smoke.render:smoke_compare_html",
)
def smoke_compare_op(params: SmokeCompareParams, ctx: OperationContext) -> SmokeCompareResult:
    """Compare two smoke runs side by side with ratios (like compare-llama-bench); writes json/md/png."""
    from llamaforge.smoke.report import compare_runs
    from llamaforge.smoke.run import smoke_root

    return SmokeCompareResult.model_validate(compare_runs(params.run_a, params.run_b, smoke_root()))
