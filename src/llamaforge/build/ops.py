"""Build operations: ``build``, ``builds.*``, ``doctor``, ``images.bootstrap``, ``recipes.*`` and ``patches.*``
(registered with the operation registry on import)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from llamaforge.build.recipes import Backend
from llamaforge.core.errors import InvalidOption, OperationFailed, PatchError
from llamaforge.core.events import null_reporter
from llamaforge.core.registry import OperationContext, Params, operation

# --- build -------------------------------------------------------------------------------------------------


class BuildParams(Params):
    """Parameters of ``build``."""

    recipe: str = Field("default", description="Build recipe name (recipes/builds/NAME.toml) or path")
    arch: str | None = Field(
        None, description="CUDA archs, e.g. 86 (RTX 30xx), 89 (RTX 40xx), 86,89; implies CUDA"
    )
    backend: Backend | None = Field(
        None, description="cpu or cuda (default: the recipe's, or cuda with --arch)"
    )
    base_image: str | None = Field(None, description="Base image for the builder (overrides the recipe)")
    patches: str | None = Field(None, description="Patch series directory (default: the recipe's)")
    no_patches: bool = Field(False, description="Build stock llama.cpp without the patch series")
    ca_bundle: str | None = Field(
        None, description="Extra CA bundle for builds behind a TLS-intercepting proxy"
    )
    cmake: list[str] = Field(default_factory=list, description="Extra CMake option KEY=VALUE (repeatable)")
    executor: str = Field("docker", description="Where to build: docker, or local (this host, no Docker)")
    jobs: int | None = Field(None, description="Parallel compile jobs (default: all cores)")
    force: bool = Field(False, description="Rebuild even when a cached build with the same key exists")
    dry_run: bool = Field(False, description="Only print the plan: rendered files, cmake args, cache key")
    check_reproducible: bool = Field(
        False, description="Rebuild in a fresh container with ccache off and compare every artifact's sha256"
    )
    from_manifest: str | None = Field(None, description="Repeat the build recorded in this manifest.json")


def _plan_from_params(params: BuildParams) -> tuple[Any, Any]:
    from llamaforge.build.cuda_arch import parse_cuda_archs
    from llamaforge.build.execute import recipe_from_manifest
    from llamaforge.build.plan import BuildOptions, plan_build
    from llamaforge.build.recipes import load_recipe

    if params.from_manifest:
        import json

        path = Path(params.from_manifest)
        if not path.is_file():
            raise InvalidOption(
                f"manifest {path} does not exist", hint="`invoke builds.show KEY` prints the path"
            )
        recipe, options = recipe_from_manifest(json.loads(path.read_text(encoding="utf-8")))
        return plan_build(recipe, options), options
    cmake: list[tuple[str, str]] = []
    for item in params.cmake:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOption(f"--cmake {item!r} is not KEY=VALUE", hint="e.g. --cmake GGML_VULKAN=OFF")
        cmake.append((key, value))
    ca_bundle = Path(params.ca_bundle) if params.ca_bundle else None
    if ca_bundle and not ca_bundle.is_file():
        raise InvalidOption(
            f"CA bundle {ca_bundle} does not exist", hint="e.g. /etc/ssl/certs/ca-certificates.crt"
        )
    options = BuildOptions(
        backend=params.backend,
        cuda_architectures=tuple(parse_cuda_archs(params.arch)) if params.arch else (),
        base_image=params.base_image,
        patches=params.patches,
        no_patches=params.no_patches,
        ca_bundle=ca_bundle.resolve() if ca_bundle else None,
        cmake=tuple(cmake),
    )
    return plan_build(load_recipe(params.recipe), options), options


@operation("build", BuildParams, read_only=False, long_running=True)
def build_op(params: BuildParams, ctx: OperationContext) -> dict[str, Any]:
    """Build llama.cpp from a pinned, patched source in Docker (or reuse the cached build)."""
    from llamaforge.build.execute import run_build
    from llamaforge.build.reproducible import check_reproducible

    plan, options = _plan_from_params(params)
    if params.dry_run:
        data = plan.to_json()
        data["cache_key"] = None
        try:
            environment_id = _existing_environment_id(plan, params.executor)
        except Exception:  # noqa: BLE001 - a dry run must work without Docker
            environment_id = None
        if environment_id:
            data["cache_key"] = plan.cache_key(environment_id)
        data["cache_key_note"] = (
            "key of the build with the existing builder image"
            if environment_id
            else "the key also covers the builder image id, known once the image is built"
        )
        return {"dry_run": True, "plan": data}
    result = run_build(
        plan, options, executor=params.executor, force=params.force, jobs=params.jobs,
        reporter=ctx.reporter, cancel=ctx.cancel,
    )  # fmt: skip
    data = {"dry_run": False, "build": result.to_json()}
    if params.check_reproducible:
        report = check_reproducible(
            result, plan, executor=params.executor, jobs=params.jobs, reporter=ctx.reporter, cancel=ctx.cancel
        )
        data["reproducibility"] = report.to_json()
    return data


def _existing_environment_id(plan: Any, executor: str) -> str | None:
    if executor == "local":
        from llamaforge.runners.local import LocalExecutor

        return LocalExecutor().environment_id(plan, null_reporter)
    import docker.errors

    from llamaforge.runners.engine import docker_client

    try:
        return str(docker_client().images.get(plan.builder_tag).id)
    except docker.errors.ImageNotFound:
        return None


class NoParams(Params):
    """No parameters."""


class KeyParams(Params):
    """A build key (or a unique prefix of one)."""

    key: str = Field(description="Build key or a unique prefix of it")


@operation("builds.list", NoParams, read_only=True)
def builds_list_op(params: NoParams, ctx: OperationContext) -> dict[str, Any]:
    """List published builds, newest first."""
    from llamaforge.build.store import list_builds

    builds = [
        {
            "key": item["key"],
            "recipe": item["recipe"]["name"],
            "backend": item["backend"],
            "cuda_architectures": item.get("cuda_architectures", []),
            "patches": [patch["name"] for patch in item["patches"]],
            "finished_at": item["finished_at"],
            "executor": item["image"]["executor"],
        }
        for item in list_builds()
    ]
    return {"builds": builds}


@operation("builds.show", KeyParams, read_only=True, positional=("key",))
def builds_show_op(params: KeyParams, ctx: OperationContext) -> dict[str, Any]:
    """Show a build's provenance manifest."""
    from llamaforge.build.store import build_dir, find_build

    manifest = find_build(params.key)
    return {"path": str(build_dir(manifest["key"])), "manifest": manifest}


@operation("doctor", NoParams, read_only=True)
def doctor_op(params: NoParams, ctx: OperationContext) -> dict[str, Any]:
    """Check that this machine can build: Docker, base image, disk, CA bundle, toolchains."""
    from llamaforge.build.doctor import run_doctor

    checks = run_doctor()
    ok = all(check.status != "fail" for check in checks)
    data = {"ok": ok, "checks": [check.__dict__ for check in checks], "exit_code": 0 if ok else 1}
    if not ok:
        failed = [check.name for check in checks if check.status == "fail"]
        raise OperationFailed(
            f"this machine cannot build yet: {', '.join(failed)} failed",
            result=data, exit_code=1, hint="each failing check names its next step",
        )  # fmt: skip
    return data


class BootstrapParams(Params):
    """Parameters of ``images.bootstrap``."""

    tag: str = Field("llamaforge/debian:bookworm", description="Tag of the image to create")
    suite: str = Field("bookworm", description="Debian suite")
    mirror: str | None = Field(None, description="Debian mirror (default: the one this machine's apt uses)")
    force: bool = Field(False, description="Recreate the image even if it exists")


@operation("images.bootstrap", BootstrapParams, read_only=False, long_running=True)
def images_bootstrap_op(params: BootstrapParams, ctx: OperationContext) -> dict[str, Any]:
    """Make a local Debian base image with debootstrap + docker import (no registry needed)."""
    from llamaforge.build.images import bootstrap_image

    result = bootstrap_image(
        params.tag, suite=params.suite, mirror=params.mirror, force=params.force,
        reporter=ctx.reporter, cancel=ctx.cancel,
    )  # fmt: skip
    return dict(result.__dict__)


@operation("recipes.list", NoParams, read_only=True)
def recipes_list_op(params: NoParams, ctx: OperationContext) -> dict[str, Any]:
    """List the shipped build recipes."""
    from llamaforge.build.recipes import list_recipes, load_recipe

    return {
        "recipes": [
            {"name": name, "description": (recipe := load_recipe(name)).description, "backend": recipe.backend,
             "source": recipe.source.kind}
            for name in list_recipes()
        ]
    }  # fmt: skip


class RecipeParams(Params):
    """A recipe name or path."""

    name: str = Field(description="Recipe name or path to a .toml file")


@operation("recipes.show", RecipeParams, read_only=True, positional=("name",))
def recipes_show_op(params: RecipeParams, ctx: OperationContext) -> dict[str, Any]:
    """Show a build recipe after validation (with defaults filled in)."""
    from llamaforge.build.recipes import load_recipe

    return {"recipe": load_recipe(params.name).model_dump(mode="json")}


# --- patches -----------------------------------------------------------------------------------------------


class PatchSeriesParams(Params):
    """Which series, against which pinned source."""

    recipe: str = Field(
        "default", description="Build recipe whose pinned source the series is checked against"
    )
    series: str | None = Field(None, description="Patch series directory (default: the recipe's)")


def _series_and_tree(params: PatchSeriesParams, ctx: OperationContext) -> tuple[str, Path]:
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    recipe = load_recipe(params.recipe)
    series = params.series or recipe.patches
    if series is None:
        raise InvalidOption(f"recipe {recipe.name!r} has no patch series", hint="pass --series DIR")
    return series, fetch_source(recipe.source, reporter=ctx.reporter, cancel=ctx.cancel)


@operation("patches.check", PatchSeriesParams, read_only=True)
def patches_check_op(params: PatchSeriesParams, ctx: OperationContext) -> dict[str, Any]:
    """Check that the patch series applies cleanly, in order, to the recipe's pinned source."""
    from llamaforge.build.patchflow import check_series

    series, tree = _series_and_tree(params, ctx)
    statuses = check_series(series, tree, ctx.reporter)
    return {"ok": True, "series": str(series), "patches": [status.__dict__ for status in statuses]}


class PatchRefreshParams(PatchSeriesParams):
    """Parameters of ``patches.refresh``."""

    to: str | None = Field(
        None, description="New llama.cpp source: an extracted tree or a .tar(.gz|.xz) archive"
    )
    resume: str | None = Field(
        None, description="Workspace of a refresh whose conflicts you resolved: continue it"
    )


@operation("patches.refresh", PatchRefreshParams, read_only=False)
def patches_refresh_op(params: PatchRefreshParams, ctx: OperationContext) -> dict[str, Any]:
    """Re-apply the series onto a new llama.cpp with 3-way merges and rewrite the patches deterministically."""
    import tempfile

    from llamaforge.build.patchflow import continue_refresh, refresh_series, resolve_tree

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
            result=data, exit_code=PatchError.exit_code, hint=data["next_step"],
        )  # fmt: skip
    data["next_step"] = "update the recipe's source pin to the new llama.cpp, then `invoke patches.check`"
    return data


@operation("patches.edit", PatchSeriesParams, read_only=False)
def patches_edit_op(params: PatchSeriesParams, ctx: OperationContext) -> dict[str, Any]:
    """Make a git workspace of the pinned source with the series applied, to edit into a new patch."""
    from llamaforge.build.patches import read_series
    from llamaforge.build.patchflow import create_workspace

    series, tree = _series_and_tree(params, ctx)
    workspace = create_workspace(tree, read_series(series), "edit")
    return {"workspace": str(workspace), "next_step": f"edit files there, then `invoke patches.new NAME "
            f"--workspace {workspace}`"}  # fmt: skip


class PatchNewParams(PatchSeriesParams):
    """Parameters of ``patches.new``."""

    name: str = Field(description="Name of the new patch (becomes NNNN-NAME.patch)")
    workspace: str = Field(description="Workspace made by `patches.edit`, with your edits")


@operation("patches.new", PatchNewParams, read_only=False, positional=("name",))
def patches_new_op(params: PatchNewParams, ctx: OperationContext) -> dict[str, Any]:
    """Turn the edits in a workspace into a new patch at the end of the series."""
    from llamaforge.build.patchflow import new_patch
    from llamaforge.build.recipes import load_recipe

    series = params.series or load_recipe(params.recipe).patches
    if series is None:
        raise InvalidOption("no patch series", hint="pass --series DIR")
    path = new_patch(series, Path(params.workspace), params.name)
    return {"patch": str(path), "series": str(path.parent / "series")}
