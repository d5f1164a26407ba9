"""Patch series operations: ``patches.check``, ``patches.refresh``, ``patches.edit`` and ``patches.new``
(registered with the operation registry on import), with their result models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from llamaforge.core.errors import InvalidOption, OperationFailed, PatchError
from llamaforge.core.registry import OperationContext, Params, Result, absent, operation, path_field

if TYPE_CHECKING:
    from llamaforge.build.patchflow import WorkspaceSource


def _workspace_source(recipe: str) -> WorkspaceSource:
    """The pinned source of build recipe ``recipe``, as a workspace's marker keeps it."""
    from llamaforge.build.patchflow import WorkspaceSource
    from llamaforge.build.recipes import load_recipe, pinned_llama_cpp
    from llamaforge.build.source import source_id

    return WorkspaceSource(source_id(load_recipe(recipe).source), pinned_llama_cpp(recipe))


class PatchSeriesParams(Params):
    """Which series, against which pinned source."""

    recipe: str = path_field(
        "default", description="Build recipe whose pinned source the series is checked against"
    )
    series: str | None = path_field(None, description="Patch series directory (default: the recipe's)")


def _series_and_tree(
    params: PatchSeriesParams, ctx: OperationContext, *, new: bool = False
) -> tuple[str, Path]:
    """The series (its listing read, so a directory that is no series is refused before the source is fetched)
    and the recipe's pinned source tree; ``new`` lets a directory without a listing start a series."""
    from llamaforge.build.patches import read_series
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    recipe = load_recipe(params.recipe)
    series = params.series or recipe.patches
    if series is None:
        raise InvalidOption(f"recipe {recipe.name!r} has no patch series", hint="pass --series DIR")
    read_series(series, new=new)
    return series, fetch_source(recipe.source, reporter=ctx.reporter, cancel=ctx.cancel)


class PatchState(Result):
    """One patch of the series, as it applies to the pinned source."""

    name: str
    sha256: str
    files: list[str]
    hunks: int
    platforms: list[str] = Field(
        default_factory=list, description="The platforms the patch is for (empty: every platform)"
    )


class PatchCheckResult(Result):
    """The series applies cleanly, in order (a patch that does not raises instead)."""

    ok: bool
    series: str
    patches: list[PatchState]


@operation("patches.check", PatchSeriesParams, read_only=True)
def patches_check_op(params: PatchSeriesParams, ctx: OperationContext) -> PatchCheckResult:
    """Check that the patch series applies cleanly, in order, to the recipe's pinned source."""
    from llamaforge.build.patchflow import check_series

    series, tree = _series_and_tree(params, ctx)
    statuses = check_series(series, tree, ctx.reporter)
    return PatchCheckResult.model_validate(
        {"ok": True, "series": str(series), "patches": [status.__dict__ for status in statuses]}
    )


class PatchRefreshParams(PatchSeriesParams):
    """Parameters of ``patches.refresh``."""

    to: str | None = path_field(
        None, description="New llama.cpp source: an extracted tree or a .tar(.gz|.xz) archive"
    )
    resume: str | None = path_field(
        None, description="Workspace of a refresh whose conflicts you resolved: continue it"
    )


class PatchConflict(Result):
    """A patch that no longer applies: each conflicting file with its conflicting hunks."""

    patch: str
    files: dict[str, list[str]]


class PatchRefreshResult(Result):
    """The rewritten series, or the conflicts to resolve in the workspace (then ``patches.refresh`` fails)."""

    workspace: str
    refreshed: list[str]
    changed: list[str]
    conflicts: list[PatchConflict]
    ok: bool
    next_step: str
    exit_code: int | None = absent()


@operation("patches.refresh", PatchRefreshParams, read_only=False)
def patches_refresh_op(params: PatchRefreshParams, ctx: OperationContext) -> PatchRefreshResult:
    """Re-apply the series onto a new llama.cpp with 3-way merges and rewrite the patches deterministically."""
    import tempfile

    from llamaforge.build.patchflow import continue_refresh, refresh_series, resolve_tree

    if params.resume and params.to:
        raise InvalidOption(
            "--to and --resume both given", hint="--to starts a refresh; --resume WORKSPACE continues one"
        )
    series, tree = _series_and_tree(params, ctx)
    if params.resume:
        result = continue_refresh(series, Path(params.resume), reporter=ctx.reporter)
    elif params.to:
        with tempfile.TemporaryDirectory(prefix="llamaforge-upstream-") as scratch:
            result = refresh_series(
                series, tree, resolve_tree(params.to, Path(scratch)), reporter=ctx.reporter
            )
    else:
        raise InvalidOption("patches.refresh needs --to TREE|ARCHIVE or --resume WORKSPACE")
    data = result.to_json()
    if result.conflicts:
        data["exit_code"] = PatchError.exit_code
        data["next_step"] = (
            f"resolve the conflicts in {result.workspace} (git status shows them), then "
            f"`invoke patches.refresh --resume {result.workspace}`"
        )
        raise OperationFailed(
            f"{len(result.conflicts)} patch(es) conflict with the new source: "
            + ", ".join(conflict.patch for conflict in result.conflicts),
            result=PatchRefreshResult.model_validate(data),
            exit_code=PatchError.exit_code,
            hint=data["next_step"],
        )
    data["next_step"] = "update the recipe's source pin to the new llama.cpp, then `invoke patches.check`"
    return PatchRefreshResult.model_validate(data)


class PatchEditResult(Result):
    """A git workspace of the pinned source with the series applied."""

    workspace: str
    next_step: str


@operation("patches.edit", PatchSeriesParams, read_only=False)
def patches_edit_op(params: PatchSeriesParams, ctx: OperationContext) -> PatchEditResult:
    """Make a git workspace of the pinned source with the series applied, to edit into a new patch."""
    from llamaforge.build.patches import read_series
    from llamaforge.build.patchflow import create_workspace

    series, tree = _series_and_tree(params, ctx, new=True)
    source = _workspace_source(params.recipe)
    workspace = create_workspace(tree, read_series(series, new=True), "edit", source=source)
    return PatchEditResult(
        workspace=str(workspace),
        next_step=f"edit files there, then `invoke patches.new NAME --workspace {workspace}`",
    )


class PatchNewParams(PatchSeriesParams):
    """Parameters of ``patches.new``."""

    name: str = Field(description="Name of the new patch (becomes NNNN-NAME.patch)")
    workspace: str = path_field(description="Workspace made by `patches.edit`, with your edits")


class PatchNewResult(Result):
    """The new patch file and the series file that now lists it."""

    patch: str
    series: str


@operation("patches.new", PatchNewParams, read_only=False, positional=("name",))
def patches_new_op(params: PatchNewParams, ctx: OperationContext) -> PatchNewResult:
    """Turn the edits in a workspace into a new patch at the end of the series."""
    from llamaforge.build.patchflow import new_patch
    from llamaforge.build.recipes import load_recipe

    series = params.series or load_recipe(params.recipe).patches
    if series is None:
        raise InvalidOption("no patch series", hint="pass --series DIR")
    path = new_patch(series, Path(params.workspace), params.name, source=_workspace_source(params.recipe))
    return PatchNewResult(patch=str(path), series=str(path.parent / "series"))
