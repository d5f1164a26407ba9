"""Operation ``smoke.cpu_modules`` (``invoke smoke.cpu-modules``): every CPU module of a build, one at a time, on
this host (:mod:`llamaforge.smoke.cpu_modules`). Its result models are also the ``cpu_modules`` part of a smoke
report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamaforge.build.executors import ExecutorName
from llamaforge.core.errors import ExitCode, OperationFailed, SmokeFailed
from llamaforge.core.registry import (
    MAX_WAIT_S,
    Int32,
    OperationContext,
    Params,
    Result,
    operation,
    path_field,
)
from llamaforge.smoke.builds import check_build_argument, default_build_executor, resolve_build


class CpuModulesParams(Params):
    """Parameters of ``smoke.cpu_modules``."""

    build: str | None = path_field(
        None,
        description="Build key (or unique prefix) or build directory (default: the default recipe's CPU "
        "build, built if missing)",
    )
    model: str | None = path_field(
        None,
        description="GGUF file or model recipe each module runs, or `tiny` (the default: the tiny Q4_0 qwen3, "
        "which reaches the quantized kernels) or `tiny-q4_k_m` (the same in the Q4_K_M mix: the K-quant kernels)",
    )
    pp: Int32 = Field(16, ge=1, description="llama-bench prompt tokens per module")
    tg: Int32 = Field(8, ge=1, description="llama-bench generated tokens per module")
    repetitions: int = Field(1, ge=1, le=10, description="llama-bench repetitions per module")
    threads: Int32 | None = Field(None, ge=1, description="CPU threads (default: llama.cpp's)")
    timeout_s: int = Field(300, ge=1, le=MAX_WAIT_S, description="Seconds each module's llama-bench may take")
    executor: ExecutorName = Field("docker", description="Where to build the default build if it is missing")


class HostCpu(Result):
    """The CPU the sweep ran on."""

    model: str = Field(description="/proc/cpuinfo's model name")
    features: list[str] = Field(
        description="ggml's names of the CPU features it has (AVX2, AVX512, AMX_INT8, …)"
    )


class CpuModuleOutcome(Result):
    """One CPU module run on its own."""

    module: str = Field(description="File name, e.g. libggml-cpu-haswell.so")
    variant: str
    status: Literal["ran", "not_for_this_cpu", "crashed", "failed", "timed_out"] = Field(
        description="not_for_this_cpu: ggml's score for this CPU is 0, so it never loads here (not a failure)"
    )
    outcome: str = Field(
        description="The status in words: ran, not for this CPU (lacks …), crashed: killed by …"
    )
    loaded: bool = Field(description="ggml's loader said it loaded the module (load_backend line)")
    default: bool = Field(False, description="The module ggml's loader picks when every module is present")
    signal: str | None = Field(description="The signal that killed llama-bench, e.g. SIGILL")
    exit: str = Field(description="How llama-bench ended, in words")
    pp_tps: float | None
    tg_tps: float | None
    missing: list[str] = Field(description="Features of this variant (ggml's table) the CPU lacks")
    detail: str
    hint: str | None
    log: str
    wall_s: float


class CpuDefaultPick(Result):
    """What ggml's loader loads with every module present (``llama-bench --list-devices``)."""

    module: str | None
    variant: str | None
    signal: str | None
    exit: str
    detail: str
    hint: str | None
    log: str


class CpuModuleSweep(Result):
    """Every CPU module of a build on this host: loads here or not, crashed (signal), pp/tg t/s, the default
    pick. A build of one CPU level has no modules and says so in ``note``."""

    bin_dir: str
    model: str
    cpu: HostCpu | None
    options: dict[str, Any] = Field(description="pp, tg, repetitions, threads of each run")
    modules: list[CpuModuleOutcome]
    default: CpuDefaultPick | None
    note: str | None
    problems: list[str] = Field(
        description="Modules that crashed, failed or timed out; a crashing default pick"
    )
    passed: bool = Field(description="No module this CPU loads crashed, failed or timed out")
    summary: str
    logs: str = Field(description="Directory of the per-module llama-bench logs")
    wall_s: float


class CpuModulesResult(CpuModuleSweep):
    """``smoke.cpu_modules``: the sweep of one build with one model, and the files it wrote."""

    build_key: str
    model_label: str
    files: dict[str, str] = Field(description="sweep.json, summary.md: name -> path")
    exit_code: int


@operation(
    "smoke.cpu_modules",
    CpuModulesParams,
    read_only=False,
    long_running=True,
    cli="llamaforge.smoke.render:cpu_modules_cli",
    html="llamaforge.smoke.render:cpu_modules_html",
)
def cpu_modules_op(params: CpuModulesParams, ctx: OperationContext) -> CpuModulesResult:
    """Run llama-bench with each CPU module of a build on its own: loads here or not, crashes, pp/tg, default pick."""
    from llamaforge.models.argument import resolve_model_argument
    from llamaforge.models.tiny import TINY_MODEL
    from llamaforge.smoke.cpu_features import build_cpu_level
    from llamaforge.smoke.cpu_modules import SweepOptions, new_sweep_dir, sweep_cpu_modules, write_sweep_files
    from llamaforge.smoke.run import SmokeTarget

    # before the model, which may be written or downloaded first
    if params.build is not None:
        check_build_argument(params.build)
    else:
        default_build_executor(params.executor)
    chosen = resolve_model_argument(params.model or TINY_MODEL, reporter=ctx.reporter, cancel=ctx.cancel)
    model, label = chosen.path, chosen.label
    key, directory, manifest = resolve_build(params.build, params.executor, ctx)
    target = SmokeTarget(
        build_key=key, build_dir=directory, manifest=manifest, model=model, model_label=label
    )
    options = SweepOptions(
        pp=params.pp,
        tg=params.tg,
        repetitions=params.repetitions,
        threads=params.threads,
        timeout_s=params.timeout_s,
    )
    run_dir = new_sweep_dir(key)
    sweep = sweep_cpu_modules(
        target.binary("llama-bench"),
        model,
        run_dir,
        options,
        cpu_level=build_cpu_level(manifest),
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    sweep.update(
        build_key=key, model_label=label, exit_code=ExitCode.OK if sweep["passed"] else SmokeFailed.exit_code
    )
    sweep["files"] = write_sweep_files(sweep, run_dir)
    result = CpuModulesResult.model_validate(sweep)
    if not sweep["passed"]:
        crash = next((row["hint"] for row in sweep["modules"] if row["hint"]), None)
        raise OperationFailed(
            f"CPU module sweep of build {key[:12]} with {label}: " + "; ".join(sweep["problems"]),
            result=result,
            exit_code=SmokeFailed.exit_code,
            hint=f"{crash + '; ' if crash else ''}per-module logs: {run_dir}",
        )
    return result
