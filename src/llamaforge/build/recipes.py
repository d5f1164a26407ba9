"""Build recipes: typed, frozen models loaded from ``recipes/builds/*.toml``.

Errors name the file and the field; unknown keys get a "did you mean" suggestion.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from llamaforge.build.cmake_options import CMAKE_NAME, REFUSED_HINT, refused_cmake_keys
from llamaforge.build.cpu_level import VARIANTS, check_cpu_level, controlled_keys
from llamaforge.build.cuda_arch import parse_cuda_archs
from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import ImageReference, check_recipe_name, read_toml, recipe_error, suggest

Backend = Literal["cpu", "cuda", "vulkan", "metal"]
Platform = Literal["linux", "windows", "macos"]

_SHA256 = r"^[0-9a-f]{64}$"
_COMMIT = r"^[0-9a-f]{40}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GitSource(_Strict):
    """llama.cpp from a git repository at a full commit."""

    kind: Literal["git"]
    url: str = Field(description="Repository URL, e.g. https://github.com/ggml-org/llama.cpp")
    commit: str = Field(pattern=_COMMIT, description="Full 40-hex commit to check out and verify")
    build_number: int = Field(ge=0, description="llama.cpp build number (the bNNNN tag)")
    date: datetime.date | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


class ArchiveSource(_Strict):
    """llama.cpp from a tar archive (https://, file:// or a path), verified by sha256."""

    kind: Literal["archive"]
    url: str = Field(description="https://…, file://… or a local path of a .tar.gz/.tar.xz/.tar archive")
    sha256: str = Field(pattern=_SHA256, description="sha256 of the archive file")
    subdir: str = Field(default="", description="Directory inside the archive that holds llama.cpp")
    commit: str = Field(pattern=_COMMIT, description="Upstream commit the archive was made from")
    build_number: int = Field(ge=0, description="llama.cpp build number (the bNNNN tag)")
    date: datetime.date | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


class PypiSdistSource(_Strict):
    """llama.cpp vendored in a Python sdist on PyPI (e.g. llama-cpp-python), fetched with pip."""

    kind: Literal["pypi-sdist"]
    package: str = Field(description="Distribution name on PyPI")
    version: str = Field(description="Exact version")
    sha256: str = Field(pattern=_SHA256, description="sha256 of the sdist file")
    subdir: str = Field(description="Directory inside the sdist that holds llama.cpp")
    commit: str = Field(pattern=_COMMIT, description="Upstream llama.cpp commit vendored by this sdist")
    build_number: int = Field(ge=0, description="llama.cpp build number (the bNNNN tag)")
    date: datetime.date | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


Source = Annotated[GitSource | ArchiveSource | PypiSdistSource, Field(discriminator="kind")]


SMOKE_KEYS = ("min_tg_tps", "max_ttft_ms", "non_empty_answer")


def check_smoke_table(value: dict[str, float | str | None] | None) -> dict[str, float | str | None] | None:
    """Validate a recipe's ``[smoke]`` thresholds table (keys only; values are checked when a smoke runs)."""
    for key in value or {}:
        if key not in SMOKE_KEYS:
            close = suggest(key, SMOKE_KEYS)
            raise ValueError(
                f"unknown smoke threshold {key!r}"
                + (f" ({close})" if close else f"; known: {', '.join(SMOKE_KEYS)}")
            )
    return value


SmokeTable = Annotated[dict[str, float | str | None] | None, AfterValidator(check_smoke_table)]
"""A recipe's ``[smoke]`` table: threshold name -> value, keys checked on load."""


class ImageRef(_Strict):
    """A base image: a tag, and its registry digest once locked."""

    tag: ImageReference
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")


CudaToolkitKind = Literal["wheels", "image"]
WindowsToolchain = Literal["mingw", "msvc"]


class CudaToolkit(_Strict):
    """Where CUDA builds get their toolkit: NVIDIA's PyPI wheels on the local Debian base (no registry), or the
    recipe's ``[images.cuda]`` image (``nvidia/cuda``, from a registry)."""

    toolkit: CudaToolkitKind = "wheels"
    release: str = Field(
        "13.0.2", pattern=r"^\d+\.\d+\.\d+$",
        description="cuda-toolkit meta-package release on PyPI; it pins nvcc, cudart and cuBLAS",
    )  # fmt: skip
    cuobjdump: str = Field(
        "13.2.51", pattern=r"^\d+\.\d+\.\d+$",
        description="nvidia-cuda-cuobjdump wheel (lists the device code of every CUDA build)",
    )  # fmt: skip

    @property
    def major(self) -> int:
        """The toolkit's CUDA major version."""
        return int(self.release.split(".")[0])


class BuildRecipe(_Strict):
    """Everything that decides a llama.cpp build."""

    name: Annotated[str, AfterValidator(check_recipe_name)] = Field(
        default="", description="Recipe name (the file name without .toml)"
    )
    description: str = ""
    platform: Platform = "linux"
    backend: Backend = "cpu"
    cuda_architectures: list[str] = Field(
        default_factory=lambda: ["86"], description="CMAKE_CUDA_ARCHITECTURES entries (cuda backend only)"
    )
    source: Source
    patches: str | None = Field(
        default="llama.cpp", description="Patch series directory under patches/, or none for a stock build"
    )
    targets: list[str] = Field(
        default_factory=lambda: ["llama-server", "llama-bench", "llama-cli"], min_length=1
    )
    cpu: str = Field(
        default=VARIANTS,
        description="CPU level of ggml-cpu: variants (all, best one loaded at run time), native, baseline, "
        "x86-64-v2, x86-64-v3, x86-64-v4, or an arm64 architecture such as armv8.2-a+dotprod",
    )
    cmake: dict[str, str | int | bool] = Field(default_factory=dict, description="Extra -D options")
    images: dict[Backend, ImageRef] = Field(default_factory=dict, description="Base image per backend")
    cuda: CudaToolkit = Field(default_factory=CudaToolkit, description="The CUDA toolkit of cuda builds")
    smoke: SmokeTable = Field(
        default=None,
        description="Smoke thresholds for builds of this recipe: min_tg_tps, max_ttft_ms, non_empty_answer",
    )

    @field_validator("cuda_architectures")
    @classmethod
    def _valid_archs(cls, value: list[str]) -> list[str]:
        try:
            return parse_cuda_archs(value)
        except InvalidOption as error:
            raise ValueError(f"{error.message} ({error.hint})") from None

    @field_validator("targets")
    @classmethod
    def _valid_targets(cls, value: list[str]) -> list[str]:
        for target in value:
            if not re.fullmatch(r"[A-Za-z0-9_.+-]+", target):
                raise ValueError(f"target {target!r} is not a CMake target name")
        return value

    @field_validator("cpu")
    @classmethod
    def _valid_cpu(cls, value: str) -> str:
        return check_cpu_level(value)

    @field_validator("cmake")
    @classmethod
    def _valid_cmake(cls, value: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        for key in refused_cmake_keys(value):
            if not CMAKE_NAME.fullmatch(key):
                raise ValueError(f"cmake option {key!r} is not a CMake variable name")
            raise ValueError(f"cmake option {key!r} may not be set here: {REFUSED_HINT}")
        if decided := controlled_keys(dict(value)):
            raise ValueError(
                f"{', '.join(decided)} is decided by the recipe's cpu level; remove it from [cmake] and set "
                'cpu = "native", "baseline", "x86-64-v3" … instead'
            )
        return value


def recipe_dir() -> Path:
    """Directory of the shipped build recipes."""
    return data_dir("recipes") / "builds"


def list_recipes() -> list[str]:
    """Names of the shipped build recipes."""
    return sorted(path.stem for path in recipe_dir().glob("*.toml"))


def resolve_named_file(name_or_path: str | Path, directory: Path, kind: str) -> Path:
    """A ``.toml`` path as given, or ``directory/NAME.toml`` for a bare name; an unknown name gets
    "did you mean" and the list of known names. ``kind`` names the thing in errors ("build recipe")."""
    text = str(name_or_path)
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or "/" in text or os.sep in text:
        if not candidate.is_file():
            raise RecipeError(f"{kind} file {candidate} does not exist", hint="check the path")
        return candidate
    path = directory / f"{text}.toml"
    if not path.is_file():
        known = sorted(entry.stem for entry in directory.glob("*.toml"))
        raise RecipeError(
            f"unknown {kind} {text!r}",
            hint=suggest(text, known, end=" ")
            + "known: "
            + (", ".join(known) or "none")
            + f" (in {directory})",
        )
    return path


# Discriminated-union tags pydantic puts in an error's loc, and the source model each selects.
_SOURCE_TAGS: dict[str, type[BaseModel]] = {
    "git": GitSource,
    "archive": ArchiveSource,
    "pypi-sdist": PypiSdistSource,
}


def parse_recipe(data: dict[str, Any], *, name: str, origin: Path) -> BuildRecipe:
    """Validate recipe ``data`` (already parsed TOML); ``origin`` is named in errors."""
    try:
        return BuildRecipe.model_validate({**data, "name": name})
    except ValidationError as error:
        raise recipe_error(
            error, what=f"recipe {origin}", root=BuildRecipe, tags=_SOURCE_TAGS,
            hint="see recipes/schema/build-recipe.schema.json for the fields",
        ) from None  # fmt: skip


def load_recipe(name_or_path: str) -> BuildRecipe:
    """Load a build recipe by name (``recipes/builds/NAME.toml``) or by path."""
    path = resolve_named_file(name_or_path, recipe_dir(), "build recipe")
    return parse_recipe(read_toml(path, "recipe"), name=path.stem, origin=path)


def recipe_json_schema() -> str:
    """The JSON schema of build recipes, as checked in under ``recipes/schema/``."""
    schema = BuildRecipe.model_json_schema()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
