"""The typed parts of an upgrade's result: what every front (CLI, MCP ``outputSchema``, notebook) reads, and
what report.json holds."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamaforge.core.registry import Result, absent, empty_list

Verdict = Literal["upgrade ok", "regression", "broken", "conflicts", "dry run"]
PatchStatus = Literal["applies", "refreshed", "conflicts"]


class PinnedSourceView(Result):
    """A llama.cpp source as a recipe pins it: where from, its sha256, commit, date and build number."""

    origin: str
    source: dict[str, Any] = Field(description="The recipe's [source] table for it")
    commit: str
    build_number: int | None = Field(description="The bNNNN tag's number; null when the tree cannot say")
    build_number_from: str
    label: str = Field(description="bNNNN, or the short commit when the build number is unknown")


class PatchOutcome(Result):
    """One patch of the series on the new source: applies unchanged, refreshed (rewritten), or conflicts."""

    name: str
    status: PatchStatus
    platforms: list[str] = Field(default_factory=empty_list)
    files: dict[str, list[str]] = Field(
        default_factory=dict, description="Conflicting files with their conflicting hunks"
    )


class Rebase(Result):
    """The candidate series: where it is and how each patch fared; the workspace to resolve conflicts in."""

    series: str
    workspace: str | None
    patches: list[PatchOutcome]
    ok: bool


class Finding(Result):
    """Something that moved under the recipe in the new tree: an option gone or with a new default, a target
    renamed or gone; with what to do."""

    kind: str
    name: str
    old: str | None = None
    new: str | None = None
    suggestion: str


class StageFailure(Result):
    """Where the candidate broke: the stage, the error and its hint, the last lines of the tool's output."""

    stage: str
    message: str
    hint: str | None = None
    log_tail: list[str] = Field(
        default_factory=empty_list, description="The failed tool's last lines of output"
    )
    log: str | None = Field(None, description="The failed tool's whole log, where it keeps one")


class BuiltBuild(Result):
    """One build of the pair, in the store."""

    key: str
    path: str
    cached: bool
    seconds: float


class ModelComparison(Result):
    """One model smoked on both builds: the runs, their verdicts, the answers checked, and the ratios."""

    model: str
    old_run: str | None
    new_run: str | None
    old_passed: bool | None
    new_passed: bool | None
    answers: dict[str, Any] = Field(default_factory=dict, description="old / new: the checked answers")
    rows: list[dict[str, Any]] = Field(
        default_factory=empty_list, description="metric, unit, a (old), b (new), ratio, speedup, better"
    )
    compare_dir: str | None = None
    repeated: bool = Field(
        False,
        description="The first pair of runs showed a regression, so both builds were smoked again and these are the "
        "second pair's runs (a shared machine's noise rarely repeats)",
    )


class FitRow(Result):
    """One memory category of one model: the plan, and what each build reported loading it."""

    model: str
    category: str
    planned_mib: float
    old_mib: float | None
    new_mib: float | None
    moved: bool = Field(description="The new build reports a different size than the old one")


class UpgradeResult(Result):
    """An upgrade run: the two sources, the rebased series, what moved under the recipe, the builds, the smokes
    side by side, the fit re-measured, the verdict with its reasons, and what was written."""

    id: str
    dir: str
    recipe: str
    mode: Literal["dry-run", "run", "apply"]
    old: PinnedSourceView
    new: PinnedSourceView
    rebase: Rebase
    findings: list[Finding]
    builds: dict[str, BuiltBuild] = Field(default_factory=dict, description="old / new")
    smokes: list[ModelComparison] = Field(default_factory=empty_list)
    fit: list[FitRow] = Field(default_factory=empty_list)
    failure: StageFailure | None = None
    verdict: Verdict
    reasons: list[str]
    next_step: str
    stage_seconds: dict[str, float]
    files: dict[str, str] = Field(description="report.md, report.json, report.png: name -> path")
    applied: list[str] | None = absent("The files --apply wrote")
    exit_code: int
