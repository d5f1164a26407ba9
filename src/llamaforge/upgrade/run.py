"""The upgrade pipeline: resolve and pin the new source, rebase the series into a candidate, check what moved
under the recipe, build both, smoke both on the same models, measure the fit on both, decide, report, and write
the recipe only with ``apply``.

A run keeps its state in its directory (:mod:`llamaforge.upgrade.workdir`): a dry run or a run stopped at a
conflict goes on with ``resume``, without resolving the source again."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llamaforge.build.patches import read_series
from llamaforge.build.patchflow import continue_refresh, refresh_series
from llamaforge.build.recipes import BuildRecipe, load_recipe, recipe_dir, resolve_named_file
from llamaforge.build.source import fetch_source
from llamaforge.build.upstream.source_pin import PinnedSource, resolve_source
from llamaforge.build.upstream.tree_check import check_tree
from llamaforge.core.errors import Cancelled, InvalidOption, LlamaforgeError
from llamaforge.core.events import Event
from llamaforge.core.paths import write_text_atomic
from llamaforge.core.registry import OperationContext
from llamaforge.upgrade.apply import _replace_source, apply_upgrade
from llamaforge.upgrade.models import TINY_MOE_LABEL, upgrade_models
from llamaforge.upgrade.report import decide, next_step, regressions, verdict_exit_code, write_report
from llamaforge.upgrade.results import (
    BuiltBuild,
    Finding,
    FitRow,
    ModelComparison,
    PatchOutcome,
    PinnedSourceView,
    Rebase,
    StageFailure,
    UpgradeResult,
)
from llamaforge.upgrade.stages import BuildChoice, build, compare, failure, measure_fit, plan_cmake, smoke
from llamaforge.upgrade.workdir import UpgradeDir, find_upgrade_dir, new_upgrade_dir

Mode = Literal["dry-run", "run", "apply"]


@dataclass(frozen=True)
class UpgradeRequest:
    """What the person asked for (``upgrade``'s parameters, as the pipeline reads them)."""

    recipe: str = "default"
    to: str | None = None
    sha256: str | None = None
    build_number: int | None = None
    resume: str | None = None
    mode: Mode = "run"
    models: tuple[str, ...] = ()
    choice: BuildChoice = field(default_factory=BuildChoice)
    smoke: dict[str, Any] = field(default_factory=dict)
    tolerance: float = 0.10


def view(source: dict[str, Any], *, origin: str, build_number_from: str) -> PinnedSourceView:
    """A recipe's ``[source]`` as the result shows it."""
    number = source.get("build_number")
    return PinnedSourceView(
        origin=origin,
        source=source,
        commit=source["commit"],
        build_number=number,
        build_number_from=build_number_from,
        label=source["commit"][:9] if number is None else f"b{number}",
    )


def _source_dict(source: Any) -> dict[str, Any]:
    data: dict[str, Any] = source.model_dump(mode="json")
    return data


class _Clock:
    """Seconds per stage, and a stage event when each starts."""

    def __init__(self, ctx: OperationContext) -> None:
        self.ctx = ctx
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, message: str) -> Iterator[None]:
        self.ctx.reporter(Event("stage", message, stage=f"upgrade:{name}"))
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - started, 1)


def _outcomes(series: Path, result: Any, platforms: dict[str, list[str]]) -> list[PatchOutcome]:
    conflicts = {conflict.patch: conflict.files for conflict in result.conflicts}
    outcomes = []
    for patch in read_series(series):
        status = (
            "conflicts"
            if patch.name in conflicts
            else "refreshed"
            if patch.name in result.changed
            else "applies"
        )
        outcomes.append(
            PatchOutcome(
                name=patch.name,
                status=status,
                platforms=platforms.get(patch.name, []),
                files=conflicts.get(patch.name, {}),
            )
        )
    return outcomes


def _candidate_recipe(
    recipe_ref: str, directory: UpgradeDir, source: dict[str, Any], has_series: bool
) -> str:
    """Write the candidate recipe: the current recipe file with the new ``[source]`` and the candidate series.
    Its name is the current recipe's, so builds and reports say which recipe it is a candidate of."""
    path = resolve_named_file(recipe_ref, recipe_dir(), "build recipe")
    text = _replace_source(path.read_text(encoding="utf-8"), source, path)
    if has_series:
        line = f"patches = {str(directory.series)!r}".replace("'", '"')
        text, count = re.subn(r"(?m)^patches\s*=.*$", line, text)
        if not count:
            text = f"{line}\n{text}"
    target = directory.path / "recipe" / path.name
    target.parent.mkdir(exist_ok=True)
    write_text_atomic(target, text)
    return str(target)


def _start(request: UpgradeRequest, recipe: BuildRecipe, ctx: OperationContext, clock: _Clock) -> UpgradeDir:
    """Resolve the new source, make the run's directory, rebase the series into it; the state recorded."""
    if not request.to:
        raise InvalidOption(
            "upgrade needs --to SOURCE (or --resume DIR)", hint="e.g. --to llama-cpp-python==0.3.35"
        )
    with clock.stage("resolve", f"resolving {request.to}"):
        pinned: PinnedSource = resolve_source(
            request.to,
            sha256=request.sha256,
            build_number=request.build_number,
            reporter=ctx.reporter,
            cancel=ctx.cancel,
        )
    if pinned.commit == recipe.source.commit:
        raise InvalidOption(
            f"recipe {recipe.name} already pins llama.cpp {pinned.commit[:9]} ({request.to})",
            hint="name another release with --to",
        )
    new = _source_dict(pinned.source)
    new_view = view(new, origin=pinned.origin, build_number_from=pinned.build_number_from)
    old_view = view(_source_dict(recipe.source), origin="the recipe's pin", build_number_from="recipe")
    with clock.stage("rebase", f"rebasing the patch series onto {new_view.label}"):
        old_tree = fetch_source(recipe.source, reporter=ctx.reporter, cancel=ctx.cancel)
        directory = new_upgrade_dir(recipe.name, old_view.label, new_view.label, recipe.patches)
        refresh = refresh_series(directory.series, old_tree, pinned.tree, reporter=ctx.reporter)
    platforms = {patch.name: list(patch.platforms) for patch in read_series(directory.series)}
    rebase = Rebase(
        series=str(directory.series),
        workspace=str(refresh.workspace),
        patches=_outcomes(directory.series, refresh, platforms),
        ok=not refresh.conflicts,
    )
    directory.write_state(
        {
            "recipe": request.recipe,
            "to": request.to,
            "old": old_view.model_dump(mode="json"),
            "new": new_view.model_dump(mode="json"),
            "old_tree": str(old_tree),
            "new_tree": str(pinned.tree),
            "rebase": rebase.model_dump(mode="json"),
            "seconds": clock.seconds,
            "options": {
                "choice": dataclasses.asdict(request.choice),
                "smoke": request.smoke,
                "tolerance": request.tolerance,
                "models": list(request.models),
            },
        }
    )
    return directory


def _resume_rebase(
    directory: UpgradeDir, state: dict[str, Any], ctx: OperationContext, clock: _Clock
) -> None:
    """Finish a rebase stopped at a conflict the person resolved in its workspace."""
    rebase = Rebase.model_validate(state["rebase"])
    if rebase.ok or rebase.workspace is None:
        return
    with clock.stage("rebase", f"continuing the rebase in {rebase.workspace}"):
        refresh = continue_refresh(directory.series, Path(rebase.workspace), reporter=ctx.reporter)
    previous = {patch.name: patch for patch in rebase.patches}
    outcomes = _outcomes(directory.series, refresh, {name: p.platforms for name, p in previous.items()})
    for outcome in outcomes:  # resolved by hand: refreshed, whatever the rewrite found
        if previous[outcome.name].status == "conflicts" and outcome.status != "conflicts":
            outcome.status = "refreshed"
    state["rebase"] = Rebase(
        series=rebase.series, workspace=rebase.workspace, patches=outcomes, ok=not refresh.conflicts
    ).model_dump(mode="json")
    directory.write_state(state)


def run_upgrade(request: UpgradeRequest, ctx: OperationContext) -> UpgradeResult:
    """Run the upgrade ``request`` asks for; the result carries the verdict (a failing verdict is the caller's
    to raise) and the report's files."""
    clock = _Clock(ctx)
    if request.resume:
        directory = find_upgrade_dir(request.resume)
        state = directory.read_state()
        recipe_ref = state["recipe"]
        recipe = load_recipe(recipe_ref)
        clock.seconds.update(state.get("seconds", {}))
        # The run goes on with the options it started with: the builds and smokes it compares stay comparable.
        options = state["options"]
        request = dataclasses.replace(
            request,
            choice=BuildChoice(**options["choice"]),
            smoke=options["smoke"],
            tolerance=options["tolerance"],
            models=tuple(options["models"]),
        )
        _resume_rebase(directory, state, ctx, clock)
    else:
        recipe_ref = request.recipe
        recipe = load_recipe(recipe_ref)
        directory = _start(request, recipe, ctx, clock)
        state = directory.read_state()
    old_view = PinnedSourceView.model_validate(state["old"])
    new_view = PinnedSourceView.model_validate(state["new"])
    if request.build_number is not None and request.resume:
        source = {**new_view.source, "build_number": request.build_number}
        new_view = view(source, origin=new_view.origin, build_number_from="--build-number")
        state["new"] = new_view.model_dump(mode="json")
    if old_view.commit != recipe.source.commit:
        raise InvalidOption(
            f"recipe {recipe.name} no longer pins {old_view.label}, the release this upgrade started from",
            hint="start a new upgrade with --to",
        )
    rebase = Rebase.model_validate(state["rebase"])
    findings: list[Finding] = []
    builds: dict[str, BuiltBuild] = {}
    smokes: list[ModelComparison] = []
    fit: list[FitRow] = []
    stopped: StageFailure | None = None
    if rebase.ok:
        candidate = _candidate_recipe(recipe_ref, directory, new_view.source, recipe.patches is not None)
        with clock.stage("check", "checking the recipe's options and targets against the new tree"):
            cmake, targets = plan_cmake(candidate, request.choice, ctx)
            findings = [
                Finding.model_validate(finding.to_json())
                for finding in check_tree(
                    Path(state["old_tree"]), Path(state["new_tree"]), cmake=cmake, targets=targets
                )
            ]
        if request.mode != "dry-run":
            stopped = _build_and_measure(request, recipe_ref, candidate, ctx, clock, builds, smokes, fit)
    verdict, reasons = decide(
        dry_run=request.mode == "dry-run",
        rebase=rebase,
        findings=findings,
        failure=stopped,
        smokes=smokes,
        fit=fit,
        tolerance=request.tolerance,
    )
    result = UpgradeResult(
        id=directory.path.name,
        dir=str(directory.path),
        recipe=recipe.name,
        mode=request.mode,
        old=old_view,
        new=new_view,
        rebase=rebase,
        findings=findings,
        builds=builds,
        smokes=smokes,
        fit=fit,
        failure=stopped,
        verdict=verdict,
        reasons=reasons,
        next_step="",
        stage_seconds=clock.seconds,
        files={},
        exit_code=verdict_exit_code(verdict),
    )
    applied = request.mode == "apply" and verdict == "upgrade ok"
    if applied:
        if new_view.build_number is None:
            raise InvalidOption(
                f"the build number of llama.cpp {new_view.commit[:9]} is unknown ({new_view.origin} cannot say)",
                hint="pass --build-number N (the number of its bNNNN tag) with --resume "
                f"{directory.path} --apply; nothing was written",
            )
        with clock.stage("apply", f"re-pinning recipe {recipe.name} to {new_view.label}"):
            result.applied = apply_upgrade(recipe, recipe_ref, new_view.source, directory.series)
    result.next_step = next_step(result, applied=applied)
    write_report(result, directory.path)
    state["seconds"] = clock.seconds
    directory.write_state(state)
    return result


def _build_and_measure(
    request: UpgradeRequest,
    recipe_ref: str,
    candidate: str,
    ctx: OperationContext,
    clock: _Clock,
    builds: dict[str, BuiltBuild],
    smokes: list[ModelComparison],
    fit: list[FitRow],
) -> StageFailure | None:
    """Build both, smoke both on every model, measure the fit on the tiny ones; the candidate's first failure."""
    with clock.stage("build-old", f"building the current recipe {recipe_ref}"):
        builds["old"] = build(recipe_ref, request.choice, ctx)
    with clock.stage("build-new", "building the candidate"):
        try:
            builds["new"] = build(candidate, request.choice, ctx)
        except Cancelled:
            raise
        except LlamaforgeError as error:
            return failure("build-new", error)
    models = upgrade_models(request.models, ctx.reporter, ctx.cancel)
    for model in models:
        with clock.stage("smoke", f"smoking {model.label} on both builds"):
            old = smoke(builds["old"].key, model, request.smoke, ctx, stage="smoke-old")
            new = smoke(builds["new"].key, model, request.smoke, ctx, stage="smoke-new")
            comparison = compare(model, old, new)
            if new.failure is None and regressions([comparison], request.tolerance):
                # A regression must show twice: the second pair, new build first, is the one reported.
                ctx.reporter(
                    Event("stage", f"{model.label}: a regression; smoking both again", stage="upgrade:smoke")
                )
                new = smoke(builds["new"].key, model, request.smoke, ctx, stage="smoke-new")
                old = smoke(builds["old"].key, model, request.smoke, ctx, stage="smoke-old")
                comparison = compare(model, old, new)
                comparison.repeated = True
            smokes.append(comparison)
        if new.failure is not None and old.failure is None:
            return new.failure
    tiny = [model for model in models if model.label.startswith("tiny-") or model.label == TINY_MOE_LABEL]
    with clock.stage("fit", "measuring the fit on both builds"):
        fit.extend(measure_fit(Path(builds["old"].path), Path(builds["new"].path), tiny))
    return None
