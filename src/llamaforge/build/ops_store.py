"""Operations on what surrounds a build: ``builds.list``, ``builds.show``, ``doctor`` and ``recipes.*``
(registered with the operation registry on import), with their result models. Apart from ``build.ops`` so that a
build, a cache hit above all, makes none of their models."""

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


class BuildListResult(Result):
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
def builds_list_op(params: NoParams, ctx: OperationContext) -> BuildListResult:
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
    return BuildListResult(builds=builds, broken=broken)


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


class BuildShowResult(Result):
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
def builds_show_op(params: KeyParams, ctx: OperationContext) -> BuildShowResult:
    """Show a build's provenance manifest."""
    from llamaforge.build.store import build_dir, find_build

    manifest = find_build(params.key)
    return BuildShowResult(path=str(build_dir(manifest["key"])), manifest=manifest)


class DoctorCheck(Result):
    """One readiness check and what to do when it is not ok."""

    name: str
    status: Status
    detail: str
    hint: str


class DoctorResult(Result):
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
def doctor_op(params: NoParams, ctx: OperationContext) -> DoctorResult:
    """Check that this machine can build: Docker, base image, disk, CA bundle, toolchains."""
    from llamaforge.build.doctor import run_doctor

    checks = run_doctor()
    ok = all(check.status != "fail" for check in checks)
    data = DoctorResult.model_validate(
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


class RecipeEntry(Result):
    """One shipped build recipe."""

    name: str
    description: str
    backend: str
    source: str = Field(description="Kind of source: git, archive or pypi-sdist")


class RecipeListResult(Result):
    """The shipped build recipes."""

    recipes: list[RecipeEntry]


@operation(
    "recipes.list",
    NoParams,
    read_only=True,
    cli="llamaforge.build.render:recipes_list_cli",
    html="llamaforge.build.render:recipes_list_html",
)
def recipes_list_op(params: NoParams, ctx: OperationContext) -> RecipeListResult:
    """List the shipped build recipes."""
    from llamaforge.build.recipes import list_recipes, load_recipe

    return RecipeListResult.model_validate(
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


class RecipeResult(Result):
    """A build recipe after validation, defaults filled in."""

    recipe: dict[str, Any] = Field(description="The recipe, as recipes/builds/schema.json describes it")


@operation("recipes.show", RecipeParams, read_only=True, positional=("name",))
def recipes_show_op(params: RecipeParams, ctx: OperationContext) -> RecipeResult:
    """Show a build recipe after validation (with defaults filled in)."""
    from llamaforge.build.recipes import load_recipe

    return RecipeResult(recipe=load_recipe(params.name).model_dump(mode="json"))
