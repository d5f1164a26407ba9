"""Build recipes: typed, frozen models loaded from ``recipes/builds/*.toml``.

Errors name the file and the field; unknown keys get a "did you mean" suggestion. The paths a recipe names (its
patch series, a local archive or repository) go through the running front's path policy when it is read
(:func:`check_recipe_paths`), like paths given as arguments.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from llamaforge.backends.cuda.arch import parse_cuda_archs
from llamaforge.build.cmake_options import (
    BACKEND_HINT,
    CMAKE_NAME,
    CONTROL_HINT,
    REFUSED_HINT,
    VALUE_HINT,
    backend_cmake_keys,
    multiline_cmake_values,
    refused_cmake_keys,
    unsafe_cmake_values,
)
from llamaforge.build.cpu_level import VARIANTS, check_cpu_level, controlled_keys
from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.patches import series_dir
from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import (
    ImageReference,
    check_recipe_name,
    check_target_name,
    read_toml,
    recipe_error,
    suggest,
)

# The names the recipe fields take (registered in llamaforge.backends and llamaforge.platforms).
Backend = BackendName
Platform = PlatformName

_SHA256 = r"^[0-9a-f]{64}$"
_COMMIT = r"^[0-9a-f]{40}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # whitespace and control characters: in no URL or path of a source
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
ARCHIVE_SCHEMES = ("https", "http", "file")


def is_scp_like(url: str) -> bool:
    """True for git's ``[user@]host:path`` form (a colon before any slash): a remote reached over SSH."""
    head, colon, _ = url.partition(":")
    return bool(colon) and "/" not in head and _SCHEME.match(url) is None


def check_git_url(value: str) -> str:
    """``value`` when git may clone it: an https, http, ssh, git or file URL, ``[user@]host:path`` or a path;
    never an option (``-…``), a ``transport::address`` (``ext::`` runs a command) or text with spaces."""
    if value.startswith("-") or _CONTROL.search(value) or not value:
        raise ValueError(
            f"git URL {value!r} may not be empty, start with '-' or hold spaces or control characters"
        )
    scheme = _SCHEME.match(value)
    if scheme is None and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*::", value):
        raise ValueError(f"git URL {value!r} names a git transport ('::'); use an https:// or ssh:// URL")
    if scheme is not None and scheme.group(1).lower() not in GIT_SCHEMES:
        raise ValueError(f"git URL {value!r}: the scheme must be one of {', '.join(GIT_SCHEMES)}")
    if is_scp_like(value) and value.partition(":")[0].rpartition("@")[2].startswith("-"):
        raise ValueError(f"git URL {value!r}: a host may not start with '-'")
    return value


def check_archive_url(value: str) -> str:
    """``value`` when it is an https, http or file URL, or a path, with no spaces or control characters."""
    scheme = _SCHEME.match(value)
    if _CONTROL.search(value) or not value:
        raise ValueError(f"archive URL {value!r} may not be empty or hold spaces or control characters")
    if scheme is not None and scheme.group(1).lower() not in ARCHIVE_SCHEMES:
        raise ValueError(f"archive URL {value!r}: use https://, http://, file:// or a local path")
    return value


def source_path(url: str, *, git: bool) -> Path | None:
    """The local file or directory a source URL names (a path, or a ``file://`` URL), absolute; None for a
    remote one."""
    scheme = _SCHEME.match(url)
    if scheme is not None:
        return Path(unquote(urlsplit(url).path)).absolute() if scheme.group(1).lower() == "file" else None
    if git and is_scp_like(url):
        return None
    return Path(url).expanduser().absolute()


class GitSource(_Strict):
    """llama.cpp from a git repository at a full commit."""

    kind: Literal["git"]
    url: Annotated[str, AfterValidator(check_git_url)] = Field(
        description="Repository URL, e.g. https://github.com/ggml-org/llama.cpp"
    )
    commit: str = Field(pattern=_COMMIT, description="Full 40-hex commit to check out and verify")
    build_number: BuildNumber | None = Field(
        default=None,
        description="llama.cpp build number (the bNNNN tag); leave it out when unknown (a shallow clone cannot "
        "count it): the build then reports build 0, as llama.cpp does without git",
    )
    date: SourceDate | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


def _check_subdir(value: str) -> str:
    # a directory inside the archive: relative, inside it, nothing a shell or tar reads otherwise
    parts = value.split("/")
    if value and (
        not re.fullmatch(r"[A-Za-z0-9._+-][A-Za-z0-9._+/-]*", value) or ".." in parts or "" in parts[:-1]
    ):
        raise ValueError(
            f"{value!r} is not a directory inside the archive (a relative path of letters, digits, '.', '_', "
            "'+' and '-', no '..'), e.g. vendor/llama.cpp"
        )
    return value.rstrip("/")


def _check_date(value: datetime.date) -> datetime.date:
    # SOURCE_DATE_EPOCH is seconds since 1970: compilers refuse a negative one
    if value < datetime.date(1970, 1, 1):
        raise ValueError(f"{value} is before 1970-01-01, which SOURCE_DATE_EPOCH cannot express")
    return value


def _check_build_number(value: int) -> int:
    # llama.cpp compiles it into an int (common/build-info.cpp): a larger one is reported wrong, or not compiled
    if value > 2**31 - 1:
        raise ValueError(f"{value} is larger than a build number can be (at most {2**31 - 1})")
    return value


def _check_series(value: str) -> str:
    # '' became the current directory, refused as "'.' is no patch series"
    if not value.strip():
        raise ValueError(
            "an empty series names nothing: name one under patches/ (e.g. llama.cpp) or its directory; "
            "`invoke build --no-patches` builds stock llama.cpp"
        )
    return value


Subdir = Annotated[str, AfterValidator(_check_subdir)]
SeriesName = Annotated[str, AfterValidator(_check_series)]
SourceDate = Annotated[datetime.date, AfterValidator(_check_date)]
BuildNumber = Annotated[int, Field(ge=0), AfterValidator(_check_build_number)]


class ArchiveSource(_Strict):
    """llama.cpp from a tar archive (https://, file:// or a path), verified by sha256."""

    kind: Literal["archive"]
    url: Annotated[str, AfterValidator(check_archive_url)] = Field(
        description="https://…, file://… or a local path of a .tar.gz/.tar.xz/.tar archive"
    )
    sha256: str = Field(pattern=_SHA256, description="sha256 of the archive file")
    subdir: Subdir = Field(default="", description="Directory inside the archive that holds llama.cpp")
    commit: str = Field(pattern=_COMMIT, description="Upstream commit the archive was made from")
    build_number: BuildNumber | None = Field(
        default=None,
        description="llama.cpp build number (the bNNNN tag); leave it out when unknown (a shallow clone cannot "
        "count it): the build then reports build 0, as llama.cpp does without git",
    )
    date: SourceDate | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


class PypiSdistSource(_Strict):
    """llama.cpp vendored in a Python sdist on PyPI (e.g. llama-cpp-python), downloaded from the package index
    (never through pip, which would run the sdist's build backend) and checked by its sha256."""

    kind: Literal["pypi-sdist"]
    package: Annotated[str, AfterValidator(lambda v: _pip_word(v, "package"))] = Field(
        description="Distribution name on PyPI"
    )
    version: Annotated[str, AfterValidator(lambda v: _pip_word(v, "version"))] = Field(
        description="Exact version"
    )
    sha256: str = Field(pattern=_SHA256, description="sha256 of the sdist file")
    subdir: Subdir = Field(description="Directory inside the sdist that holds llama.cpp")
    commit: str = Field(pattern=_COMMIT, description="Upstream llama.cpp commit vendored by this sdist")
    build_number: BuildNumber | None = Field(
        default=None,
        description="llama.cpp build number (the bNNNN tag); leave it out when unknown (a shallow clone cannot "
        "count it): the build then reports build 0, as llama.cpp does without git",
    )
    date: SourceDate | None = Field(default=None, description="Commit date; sets SOURCE_DATE_EPOCH")


def _pip_word(value: str, what: str) -> str:
    # Both become one index page and one file name: nothing that reads as a path, an option or a second spec.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,127}", value):
        raise ValueError(f"{what} {value!r} is not a PyPI {what} (letters, digits, '.', '_', '-', '+', '!')")
    return value


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
        "13.0.2",
        pattern=r"^\d+\.\d+\.\d+$",
        description="cuda-toolkit meta-package release on PyPI; it pins nvcc, cudart and cuBLAS",
    )
    cuobjdump: str = Field(
        "13.2.51",
        pattern=r"^\d+\.\d+\.\d+$",
        description="nvidia-cuda-cuobjdump wheel (lists the device code of every CUDA build)",
    )

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
    patches: SeriesName | None = Field(
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
            check_target_name(target)
        # Each target is one artifact: a second listing was a second artifact of the same file.
        if twice := sorted({target for target in value if value.count(target) > 1}):
            raise ValueError(f"{', '.join(twice)} listed twice; list each target once")
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
        if chosen := backend_cmake_keys(value):
            raise ValueError(f"{', '.join(chosen)} may not be set in [cmake]: {BACKEND_HINT}")
        if multiline := multiline_cmake_values(value.items()):
            raise ValueError(f"{', '.join(multiline)} holds a control character (a newline?): {CONTROL_HINT}")
        if unsafe := unsafe_cmake_values(value.items()):
            raise ValueError(f"{', '.join(unsafe)}: the value is more than one word: {VALUE_HINT}")
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
        if candidate.is_dir():
            raise RecipeError(
                f"{candidate} is a directory, not a {kind} file", hint=f"give the {kind}'s .toml file"
            )
        if not candidate.is_file():
            shipped = "/" not in text and os.sep not in text and (directory / text).is_file()
            raise RecipeError(
                f"{kind} file {candidate} does not exist",
                # a shipped one named with its .toml is looked for here, in the current directory
                hint=f"the shipped {kind} is named without .toml: {candidate.stem}"
                if shipped
                else "check the path",
            )
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
    """Validate recipe ``data`` (already parsed TOML) and the paths it names; ``origin`` is named in errors."""
    try:
        recipe = BuildRecipe.model_validate({**data, "name": name})
    except ValidationError as error:
        raise recipe_error(
            error,
            what=f"recipe {origin}",
            root=BuildRecipe,
            tags=_SOURCE_TAGS,
            hint="see recipes/schema/build-recipe.schema.json for the fields",
        ) from None
    check_recipe_paths(recipe, f"recipe {origin}")
    return recipe


def check_recipe_paths(recipe: BuildRecipe, what: str) -> None:
    """Put the paths ``recipe`` names through the front's path policy (:func:`~llamaforge.core.guard.
    check_file_path`): its patch series directory, and a source archive or repository on this machine (a path or
    a ``file://`` URL). ``what`` names the file ("recipe recipes/builds/x.toml"); remote URLs are checked when
    they are fetched."""
    if recipe.patches is not None:
        check_file_path(f"{what}: patches", series_dir(recipe.patches).absolute())
    source = recipe.source
    if not isinstance(source, PypiSdistSource):
        local = source_path(source.url, git=isinstance(source, GitSource))
        if local is not None:
            check_file_path(f"{what}: source.url", local)


def load_recipe(name_or_path: str) -> BuildRecipe:
    """Load a build recipe by name (``recipes/builds/NAME.toml``) or by path."""
    path = resolve_named_file(name_or_path, recipe_dir(), "build recipe")
    return parse_recipe(read_toml(path, "recipe"), name=path.stem, origin=path)


def pinned_llama_cpp(name_or_path: str = "default") -> str:
    """The llama.cpp release a build recipe pins, as upstream tags it (``b`` + its build number): the version
    messages name, read from the recipe so that moving the pin moves them too (its short commit when the build
    number is unknown). ``the pinned llama.cpp`` when the recipe cannot be read, so that an error message that
    names the version never fails on it."""
    try:
        source = load_recipe(name_or_path).source
    except RecipeError:
        return "the pinned llama.cpp"
    if source.build_number is not None:
        return f"b{source.build_number}"
    return f"llama.cpp {source.commit[:9]}"


def recipe_json_schema() -> str:
    """The JSON schema of build recipes, as checked in under ``recipes/schema/``."""
    schema = BuildRecipe.model_json_schema()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
