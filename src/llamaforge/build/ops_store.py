"""Operations on what surrounds a build: ``builds.list``, ``builds.show``, ``doctor``, ``images.bootstrap`` and
``recipes.*`` (registered with the operation registry on import), with their result models. Apart from
``build.ops`` so that a build, a cache hit above all, makes none of their models."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from llamaforge.build.doctor import Status
from llamaforge.core.errors import ExitCode, OperationFailed
from llamaforge.core.registry import OperationContext, Params, Result, operation, path_field
from llamaforge.core.validation import describe_errors


class NoParams(Params):
    """No parameters."""


class KeyParams(Params):
    """A build key (or a unique prefix of one)."""

    key: str = Field(description="Build key or a unique prefix of it")


class BuildEntry(Result):
    """One published build, as ``builds.list`` shows it."""

    key: str
    recipe: str
    backend: str
    cuda_architectures: list[str]
    patches: list[str]
    finished_at: str
    executor: str


class BrokenBuild(Result):
    """A store entry that cannot be listed: its directory and why."""

    path: str
    error: str


class BuildList(Result):
    """Published builds, newest first, and the store entries that cannot be read (each named)."""

    builds: list[BuildEntry]
    broken: list[BrokenBuild] = Field(
        default_factory=list,
        description="Store entries whose manifest is unreadable or incomplete: path, error",
    )


@operation(
    "builds.list",
    NoParams,
    read_only=True,
    cli="llamaforge.build.render:builds_list_cli",
    html="llamaforge.build.render:builds_list_html",
)
def builds_list_op(params: NoParams, ctx: OperationContext) -> BuildList:
    """List published builds, newest first."""
    from llamaforge.build.store import build_dir, scan_builds

    manifests, damaged = scan_builds()
    builds: list[BuildEntry] = []
    broken = [BrokenBuild(path=str(entry.path), error=entry.error) for entry in damaged]
    for item in manifests:
        try:
            builds.append(_entry(item))
        except KeyError as error:
            broken.append(
                BrokenBuild(path=str(build_dir(item["key"])), error=f"manifest.json has no {error} field")
            )
        except ValidationError as error:
            broken.append(
                BrokenBuild(
                    path=str(build_dir(item["key"])), error=f"manifest.json: {describe_errors(error)}"
                )
            )
        except (TypeError, AttributeError) as error:
            broken.append(
                BrokenBuild(path=str(build_dir(item["key"])), error=f"manifest.json is malformed: {error}")
            )
    return BuildList(builds=builds, broken=broken)


def _entry(item: dict[str, Any]) -> BuildEntry:
    """The row of one manifest (KeyError / TypeError / ValidationError when a field is missing or wrong)."""
    return BuildEntry.model_validate(
        {
            "key": item["key"],
            "recipe": item["recipe"]["name"],
            "backend": item["backend"],
            "cuda_architectures": item.get("cuda_architectures", []),
            "patches": [patch["name"] for patch in item["patches"]],
            "finished_at": item["finished_at"],
            "executor": item["image"]["executor"],
        }
    )


class BuildShown(Result):
    """A build's directory and its provenance manifest."""

    path: str
    manifest: dict[str, Any] = Field(
        description="manifest.json: recipe, source, patches, image, artifacts, …"
    )


@operation(
    "builds.show",
    KeyParams,
    read_only=True,
    positional=("key",),
    html="llamaforge.build.render:builds_show_html",
)
def builds_show_op(params: KeyParams, ctx: OperationContext) -> BuildShown:
    """Show a build's provenance manifest."""
    from llamaforge.build.store import build_dir, find_build

    manifest = find_build(params.key)
    return BuildShown(path=str(build_dir(manifest["key"])), manifest=manifest)


class DoctorCheck(Result):
    """One readiness check and what to do when it is not ok."""

    name: str
    status: Status
    detail: str
    hint: str


class DoctorReport(Result):
    """Every readiness check; ``ok`` is false (and ``doctor`` fails) when one of them failed."""

    ok: bool
    checks: list[DoctorCheck]
    exit_code: int


@operation(
    "doctor",
    NoParams,
    read_only=True,
    cli="llamaforge.build.render:doctor_cli",
    html="llamaforge.build.render:doctor_html",
)
def doctor_op(params: NoParams, ctx: OperationContext) -> DoctorReport:
    """Check that this machine can build: Docker, base image, disk, CA bundle, toolchains."""
    from llamaforge.build.doctor import run_doctor

    checks = run_doctor()
    ok = all(check.status != "fail" for check in checks)
    data = DoctorReport.model_validate(
        {"ok": ok, "checks": [check.__dict__ for check in checks], "exit_code": 0 if ok else 1}
    )
    if not ok:
        failed = [check.name for check in checks if check.status == "fail"]
        raise OperationFailed(
            f"this machine cannot build yet: {', '.join(failed)} failed",
            result=data,
            exit_code=ExitCode.FAILED,
            hint="each failing check names its next step",
        )
    return data


class BootstrapParams(Params):
    """Parameters of ``images.bootstrap``."""

    tag: str = Field("llamaforge/debian:bookworm", description="Tag of the image to create")
    suite: str = Field("bookworm", description="Debian suite")
    mirror: str | None = Field(None, description="Debian mirror (default: the one this machine's apt uses)")
    force: bool = Field(False, description="Recreate the image even if it exists")


class BootstrappedImage(Result):
    """The imported base image (or the existing one, reused)."""

    tag: str
    image_id: str
    mirror: str
    suite: str
    reused: bool


@operation("images.bootstrap", BootstrapParams, read_only=False, long_running=True)
def images_bootstrap_op(params: BootstrapParams, ctx: OperationContext) -> BootstrappedImage:
    """Make a local Debian base image with debootstrap + docker import (no registry needed)."""
    from llamaforge.build.images import bootstrap_image

    result = bootstrap_image(
        params.tag,
        suite=params.suite,
        mirror=params.mirror,
        force=params.force,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    return BootstrappedImage.model_validate(result.__dict__)


class RecipeEntry(Result):
    """One shipped build recipe."""

    name: str
    description: str
    backend: str
    source: str = Field(description="Kind of source: git, archive or pypi-sdist")


class RecipeList(Result):
    """The shipped build recipes."""

    recipes: list[RecipeEntry]


@operation(
    "recipes.list",
    NoParams,
    read_only=True,
    cli="llamaforge.build.render:recipes_list_cli",
    html="llamaforge.build.render:recipes_list_html",
)
def recipes_list_op(params: NoParams, ctx: OperationContext) -> RecipeList:
    """List the shipped build recipes."""
    from llamaforge.build.recipes import list_recipes, load_recipe

    return RecipeList.model_validate(
        {
            "recipes": [
                {
                    "name": name,
                    "description": (recipe := load_recipe(name)).description,
                    "backend": recipe.backend,
                    "source": recipe.source.kind,
                }
                for name in list_recipes()
            ]
        }
    )


class RecipeParams(Params):
    """A recipe name or path."""

    name: str = path_field(description="Recipe name or path to a .toml file")


class RecipeShown(Result):
    """A build recipe after validation, defaults filled in."""

    recipe: dict[str, Any] = Field(description="The recipe, as recipes/builds/schema.json describes it")


@operation("recipes.show", RecipeParams, read_only=True, positional=("name",))
def recipes_show_op(params: RecipeParams, ctx: OperationContext) -> RecipeShown:
    """Show a build recipe after validation (with defaults filled in)."""
    from llamaforge.build.recipes import load_recipe

    return RecipeShown(recipe=load_recipe(params.name).model_dump(mode="json"))
