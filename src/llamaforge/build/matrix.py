"""Build matrices: ``recipes/matrices/NAME.toml`` lists builds (platform, backend and archs, each with its own
executor), ``invoke build --matrix NAME`` runs them one after another (``--builders FLEET`` fans them out over a
builder fleet instead: :mod:`llamaforge.build.farm`). A failed entry is recorded with its error
and the next one still runs; each finished build is published with its own manifest as any build is. The paths
a matrix names (recipe files, patch series, SSH keys, known_hosts files) pass the front's path policy when it is
read, like the same options given as arguments."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llamaforge.build.executors import ExecutorName
from llamaforge.build.patches import series_dir
from llamaforge.build.recipes import Backend, Platform, WindowsToolchain, resolve_named_file
from llamaforge.core.errors import Cancelled, ExitCode, LlamaforgeError
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import data_dir
from llamaforge.core.registry import Result, absent, empty_list
from llamaforge.core.validation import read_toml, recipe_error

# Built when a matrix is first loaded: ``build`` imports this module for its result model, and a single build
# (a cache hit) never reads a matrix.
_MATRIX_CONFIG = ConfigDict(extra="forbid", defer_build=True)


class MatrixEntry(BaseModel):
    """One build of a matrix: the build options of ``invoke build`` that it sets."""

    model_config = _MATRIX_CONFIG

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="Name of the build in the summary (letters, digits, '.', '_', '-')",
    )
    recipe: str | None = Field(None, min_length=1, description="Build recipe (default: the matrix's recipe)")
    platform: Platform | None = None
    toolchain: WindowsToolchain | None = Field(
        None, description="Windows: mingw or msvc (default: the executor's)"
    )
    backend: Backend | None = None
    arch: list[str] = Field(default_factory=list, description='CUDA archs, e.g. ["86", "89"]; implies CUDA')
    cpu: str | None = Field(None, description="CPU level (default: the recipe's), as `invoke build --cpu`")
    patches: str | None = Field(None, min_length=1)
    no_patches: bool = False
    cmake: dict[str, str | int | bool] = Field(default_factory=dict, description="Extra CMake options")
    executor: ExecutorName = Field("docker", description="Where to build: docker, local or ssh")
    labels: list[str] = Field(
        default_factory=list, description="Labels a builder must carry to run it (with --builders)"
    )
    build_host: str | None = Field(None, min_length=1)
    ssh_key: str | None = Field(None, min_length=1)
    known_hosts: str | None = Field(None, min_length=1)

    @field_validator("arch", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [str(value)] if isinstance(value, str | int) else value


class Matrix(BaseModel):
    """A build matrix file."""

    model_config = _MATRIX_CONFIG

    name: str
    description: str = ""
    recipe: str = Field("default", min_length=1, description="Recipe of every entry that names none")
    builds: list[MatrixEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Matrix:
        names = [entry.name for entry in self.builds]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"build names given twice: {', '.join(twice)}")
        return self


class MatrixRow(Result):
    """One entry's outcome."""

    name: str
    result: str = Field(description="built, cache hit, planned, failed or not run (cancelled before it)")
    key: str | None = None
    platform: str | None = None
    backend: str | None = None
    archs: list[str] = Field(default_factory=empty_list)
    seconds: float = 0.0
    error: str | None = None
    hint: str | None = None
    exit_code: int = ExitCode.OK
    builder: str | None = absent("The builder that ran it (with --builders): NAME (engine URL or host)")
    lost_builders: list[str] | None = absent("Builders lost while it ran there; it was retried elsewhere")


def matrix_dir() -> Path:
    """Directory of the shipped build matrices."""
    return data_dir("recipes") / "matrices"


def load_matrix(name_or_path: str) -> Matrix:
    """A matrix by name (``recipes/matrices/NAME.toml``) or path; unknown keys are named with "did you mean"."""
    path = resolve_named_file(name_or_path, matrix_dir(), "build matrix")
    data = read_toml(path, "build matrix")
    try:
        matrix = Matrix.model_validate({**data, "name": path.stem})
    except ValidationError as error:
        raise recipe_error(
            error,
            what=f"build matrix {path}",
            root=Matrix,
            hint="each [[builds]] takes the options of `invoke build` that differ per build (recipe, platform, "
            "toolchain, backend, arch, cpu, patches, no_patches, cmake, executor, labels, build_host, ssh_key, "
            "known_hosts); --jobs, --force and --dry-run apply to the whole matrix",
        ) from None
    _check_paths(matrix, f"build matrix {path}")
    return matrix


def _check_paths(matrix: Matrix, what: str) -> None:
    """Put the paths ``matrix`` names through the front's path policy (a recipe given by name is no path)."""
    for where, recipe in [("recipe", matrix.recipe)] + [
        (f"builds[{e.name}].recipe", e.recipe) for e in matrix.builds
    ]:
        if recipe and (recipe.endswith(".toml") or "/" in recipe):
            check_file_path(f"{what}: {where}", Path(recipe).expanduser().absolute())
    for entry in matrix.builds:
        if entry.patches:
            check_file_path(f"{what}: builds[{entry.name}].patches", series_dir(entry.patches).absolute())
        for field, value in (("ssh_key", entry.ssh_key), ("known_hosts", entry.known_hosts)):
            if value:
                check_file_path(f"{what}: builds[{entry.name}].{field}", Path(value).expanduser().absolute())


def entry_arguments(matrix: Matrix, entry: MatrixEntry) -> dict[str, Any]:
    """The entry as ``build`` parameters (the matrix's recipe filled in)."""
    return {
        "recipe": entry.recipe or matrix.recipe,
        "platform": entry.platform,
        "toolchain": entry.toolchain,
        "backend": entry.backend,
        "arch": ",".join(entry.arch) or None,
        "cpu": entry.cpu,
        "patches": entry.patches,
        "no_patches": entry.no_patches,
        "cmake": [f"{key}={_cmake(value)}" for key, value in entry.cmake.items()],
        "executor": entry.executor,
        "build_host": entry.build_host,
        "ssh_key": entry.ssh_key,
        "known_hosts": entry.known_hosts,
    }


def row_fields(plan: dict[str, Any] | None, key: str | None = None, cached: bool = False) -> dict[str, Any]:
    """A row's fields from one entry's outcome: the plan of a dry run, or the published build ``key``."""
    if plan is not None:
        return {
            "result": "planned",
            "key": plan["cache_key"],
            "platform": plan["platform"],
            "backend": plan["backend"],
            "archs": plan["cuda_architectures"],
        }
    from llamaforge.build.store import load_manifest

    manifest = load_manifest(str(key)) or {}
    return {
        "result": "cache hit" if cached else "built",
        "key": key,
        "platform": manifest.get("recipe", {}).get("platform"),
        "backend": manifest.get("backend"),
        "archs": manifest.get("cuda_architectures") or [],
    }


def _cmake(value: str | int | bool) -> str:
    return ("ON" if value else "OFF") if isinstance(value, bool) else str(value)


def run_matrix(
    matrix: Matrix, build_one: Callable[[MatrixEntry], dict[str, Any]], *, progress: Callable[[str], None]
) -> list[MatrixRow]:
    """Run ``build_one`` for every entry in order; a LlamaforgeError becomes a failed row and the next entry runs.
    Cancellation (Ctrl-C) stops the matrix: the entries not reached are ``not run``."""
    rows: list[MatrixRow] = []
    for index, entry in enumerate(matrix.builds):
        progress(f"[{index + 1}/{len(matrix.builds)}] {entry.name}")
        started = time.monotonic()
        try:
            row = MatrixRow.model_validate({"name": entry.name, **build_one(entry)})
        except Cancelled:
            rows.append(
                MatrixRow(name=entry.name, result="not run", error="cancelled", exit_code=Cancelled.exit_code)
            )
            rows.extend(MatrixRow(name=rest.name, result="not run") for rest in matrix.builds[index + 1 :])
            raise MatrixStopped(rows) from None
        except LlamaforgeError as error:
            row = MatrixRow(
                name=entry.name,
                result="failed",
                error=error.message,
                hint=error.hint,
                exit_code=error.exit_code,
                platform=entry.platform,
                backend=entry.backend,
                archs=entry.arch,
            )
        row.seconds = round(time.monotonic() - started, 1)
        rows.append(row)
    return rows


class MatrixStopped(Exception):
    """The matrix was cancelled; ``rows`` says what ran."""

    def __init__(self, rows: list[MatrixRow]) -> None:
        super().__init__("cancelled")
        self.rows = rows
