"""The stages of an upgrade that run the other domains' operations: plan and build a recipe, smoke a build
with a model, compare two smoke runs, and measure what each build's llama-server allocates for a model.

Each stage goes through the same operations a person would call (``build``, ``smoke``, ``smoke.compare``), so
the upgrade builds, caches and measures exactly as they do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.build.ops import BuildParams, build_op
from llamaforge.core.errors import Cancelled, LlamaforgeError, OperationFailed, ToolFailed
from llamaforge.core.registry import OperationContext
from llamaforge.gguf.header import read_header
from llamaforge.serve.fit_chart import CATEGORIES
from llamaforge.serve.loadlog import LoadLog
from llamaforge.serve.measure import measure_with_llamacpp
from llamaforge.serve.memory import Settings, estimate_memory
from llamaforge.serve.shape import model_shape
from llamaforge.smoke.ops import SmokeParams, SmokeResult, smoke_op
from llamaforge.smoke.report import compare_runs
from llamaforge.smoke.run import smoke_root
from llamaforge.upgrade.models import UpgradeModel
from llamaforge.upgrade.results import BuiltBuild, FitRow, ModelComparison, StageFailure

MiB = 1024 * 1024
# The settings the fit is measured at on the tiny models: one slot, a context that makes the KV cache a few MiB.
FIT_SETTINGS = Settings(ctx=4096)
# llama.cpp prints MiB with two decimals: sizes closer than this are the same size.
SAME_SIZE_MIB = 0.01


@dataclass(frozen=True)
class BuildChoice:
    """The ``build`` options both builds of an upgrade share: the user's CPU level, CUDA archs, executor."""

    cpu: str | None = None
    arch: str | None = None
    backend: str | None = None
    executor: str = "docker"
    jobs: int | None = None

    def params(self, recipe: str, *, dry_run: bool = False) -> BuildParams:
        """``build``'s parameters for ``recipe`` with these options."""
        return BuildParams.model_validate(
            {
                "recipe": recipe,
                "cpu": self.cpu,
                "arch": self.arch,
                "backend": self.backend,
                "executor": self.executor,
                "jobs": self.jobs,
                "dry_run": dry_run,
            }
        )


def plan_cmake(recipe: str, choice: BuildChoice, ctx: OperationContext) -> tuple[dict[str, str], list[str]]:
    """The -D options and the targets the build of ``recipe`` would use (a dry run: nothing is built)."""
    plan = build_op(choice.params(recipe, dry_run=True), ctx).plan or {}
    cmake = {}
    for argument in plan.get("cmake_args", []):
        if str(argument).startswith("-D"):  # not the generator's `-G Ninja`
            key, _, value = str(argument)[2:].partition("=")
            cmake[key.split(":", 1)[0]] = value
    return cmake, list(plan.get("targets", []))


def build(recipe: str, choice: BuildChoice, ctx: OperationContext) -> BuiltBuild:
    """Build ``recipe`` (or reuse the cached build with the same key)."""
    published = build_op(choice.params(recipe), ctx).build
    assert published is not None  # a build that is not a dry run publishes one, or raises
    return BuiltBuild(
        key=published.key, path=published.path, cached=published.cached, seconds=published.seconds
    )


def failure(stage: str, error: LlamaforgeError) -> StageFailure:
    """What a failed stage says: its error and hint (a failed tool's message ends with its last lines)."""
    tail = error.tail if isinstance(error, ToolFailed) else []
    log = error.log_path if isinstance(error, ToolFailed) else None
    return StageFailure(stage=stage, message=error.message, hint=error.hint, log_tail=tail, log=log)


@dataclass(frozen=True)
class SmokeOutcome:
    """One smoke run: its id and verdict, its checked answers, or why it could not run."""

    run_id: str | None
    passed: bool | None
    answers: list[dict[str, Any]]
    failure: StageFailure | None


def smoke(
    build_key: str,
    model: UpgradeModel,
    options: dict[str, Any],
    ctx: OperationContext,
    *,
    stage: str,
) -> SmokeOutcome:
    """Smoke ``build_key`` with ``model``. A failed verdict is an outcome (its run is still compared); an error
    (the server crashed, the model does not load) is the stage's failure."""
    params = SmokeParams.model_validate({"build": build_key, "model": model.argument, **options})
    try:
        result = smoke_op(params, ctx)
    except OperationFailed as failed:
        if not isinstance(failed.result, SmokeResult):
            return SmokeOutcome(None, None, [], failure(stage, failed))
        result = failed.result
    except Cancelled:
        raise
    except LlamaforgeError as error:
        return SmokeOutcome(None, None, [], failure(stage, error))
    server = result.server or {}
    return SmokeOutcome(result.run_id, result.verdict.passed, list(server.get("answers") or []), None)


def compare(model: UpgradeModel, old: SmokeOutcome, new: SmokeOutcome) -> ModelComparison:
    """The two runs of ``model`` side by side (``smoke.compare``), when both ran."""
    comparison = ModelComparison(
        model=model.label,
        old_run=old.run_id,
        new_run=new.run_id,
        old_passed=old.passed,
        new_passed=new.passed,
        answers={"old": old.answers, "new": new.answers},
    )
    if old.run_id and new.run_id:
        data = compare_runs(old.run_id, new.run_id, smoke_root())
        comparison.rows = data["rows"]
        comparison.compare_dir = str(Path(data["files"]["compare.json"]).parent)
    return comparison


def _server(build_dir: Path) -> Path:
    return next(
        (p for p in (build_dir / "bin" / "llama-server", build_dir / "llama-server") if p.is_file()),
        build_dir / "bin" / "llama-server",
    )


def _reported(build_dir: Path, model: UpgradeModel) -> LoadLog | None:
    """What the build's llama-server reports loading ``model``; None when it cannot load it (the smoke of the
    same pair says why)."""
    try:
        return measure_with_llamacpp(_server(build_dir), model.path, FIT_SETTINGS)
    except LlamaforgeError:
        return None


def measure_fit(old_dir: Path, new_dir: Path, models: list[UpgradeModel]) -> list[FitRow]:
    """For each model: llamaforge's plan of every memory category next to what the old and the new build's
    llama-server report loading it (``FIT_SETTINGS``, all on the CPU). A category whose reported size moved
    between the builds means llama.cpp changed how it sizes it: a plan made for the old build is off by that."""
    rows = []
    for model in models:
        header = read_header(model.path)
        _gpu, planned = estimate_memory(model_shape(header), header.tensors, FIT_SETTINGS, n_gpu_layers=0)
        old, new = _reported(old_dir, model), _reported(new_dir, model)
        for category in CATEGORIES:
            old_mib = None if old is None else round(old.total(category) / MiB, 2)  # type: ignore[arg-type]
            new_mib = None if new is None else round(new.total(category) / MiB, 2)  # type: ignore[arg-type]
            rows.append(
                FitRow(
                    model=model.label,
                    category=category,
                    planned_mib=round(getattr(planned, category) / MiB, 2),
                    old_mib=old_mib,
                    new_mib=new_mib,
                    moved=old_mib is not None
                    and new_mib is not None
                    and abs(new_mib - old_mib) > SAME_SIZE_MIB,
                )
            )
    return rows
