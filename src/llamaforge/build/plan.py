"""Turn a recipe plus options into a BuildPlan: a pure function, no Docker, no network."""

from __future__ import annotations

import calendar
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaforge import __version__
from llamaforge.build.cuda_arch import parse_cuda_archs
from llamaforge.build.patches import PatchRef, read_series
from llamaforge.build.recipes import Backend, BuildRecipe, ImageRef
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render

# Bump when the layout of build outputs or the meaning of the key changes, so old cache entries are not reused.
PLAN_FORMAT = 1

_PACKAGES: dict[str, list[str]] = {
    "cpu": ["ca-certificates", "ccache", "cmake", "g++", "gcc", "libc6-dev", "make", "ninja-build"],
    "cuda": ["ca-certificates", "ccache", "cmake", "g++", "ninja-build"],
}


@dataclass(frozen=True)
class BuildOptions:
    """What a user may change on top of a recipe (the CLI flags)."""

    backend: Backend | None = None
    cuda_architectures: tuple[str, ...] = ()
    base_image: str | None = None
    patches: str | None = None
    no_patches: bool = False
    ca_bundle: Path | None = None
    cmake: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BuildPlan:
    """Everything needed to execute a build, and the digest of it that keys the cache."""

    recipe: BuildRecipe
    backend: Backend
    cuda_architectures: tuple[str, ...]
    base_image: ImageRef
    patches: tuple[PatchRef, ...]
    cmake_args: tuple[str, ...]
    targets: tuple[str, ...]
    dockerfile: str
    build_script: str
    source_date_epoch: int
    ca_bundle: Path | None
    artifacts: tuple[str, ...] = field(default=())

    def key_inputs(self) -> dict[str, Any]:
        """Every input of the build except the builder image id (known only once the image exists)."""
        return {
            "format": PLAN_FORMAT,
            "platform": self.recipe.platform,
            "backend": self.backend,
            "source": self.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "cmake_args": list(self.cmake_args),
            "targets": list(self.targets),
            "dockerfile_sha256": _sha256(self.dockerfile),
            "build_script_sha256": _sha256(self.build_script),
            "base_image": self.base_image.model_dump(mode="json"),
            "ca_bundle_sha256": _sha256(self.ca_bundle.read_bytes()) if self.ca_bundle else None,
        }

    @property
    def plan_digest(self) -> str:
        """sha256 over ``key_inputs``."""
        return _sha256(json.dumps(self.key_inputs(), sort_keys=True))

    @property
    def builder_tag(self) -> str:
        """Local tag of the builder image made from this plan's Dockerfile."""
        material = json.dumps([self.dockerfile, self.base_image.model_dump(mode="json")], sort_keys=True)
        return f"llamaforge-builder:{self.backend}-{_sha256(material)[:16]}"

    def cache_key(self, builder_image_id: str) -> str:
        """The build key: every input plus the builder image id."""
        return _sha256(f"{self.plan_digest}\n{builder_image_id}")[:32]

    def to_json(self) -> dict[str, Any]:
        """The plan as data (``--dry-run --json``)."""
        return {
            "recipe": self.recipe.name,
            "platform": self.recipe.platform,
            "backend": self.backend,
            "cuda_architectures": list(self.cuda_architectures),
            "source": self.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "base_image": self.base_image.model_dump(mode="json"),
            "builder_tag": self.builder_tag,
            "cmake_args": list(self.cmake_args),
            "targets": list(self.targets),
            "artifacts": list(self.artifacts),
            "source_date_epoch": self.source_date_epoch,
            "plan_digest": self.plan_digest,
            "files": {"Dockerfile": self.dockerfile, "build.sh": self.build_script},
            "llamaforge_version": __version__,
        }


def _sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _cmake_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    return str(value)


def plan_build(recipe: BuildRecipe, options: BuildOptions | None = None) -> BuildPlan:
    """Resolve ``recipe`` and ``options`` into a BuildPlan (renders the Dockerfile and build script)."""
    options = options or BuildOptions()
    backend: Backend = options.backend or ("cuda" if options.cuda_architectures else recipe.backend)
    if recipe.platform != "linux":
        raise InvalidOption(
            f"platform {recipe.platform!r} cannot be built yet: only linux builds run in Docker",
            hint="use a linux recipe; Windows (mingw cross build) and macOS (Metal on a Mac) are planned",
        )
    if backend not in ("cpu", "cuda"):
        raise InvalidOption(
            f"backend {backend!r} has no Linux builder template yet", hint="use --backend cpu or --arch 86"
        )
    if options.cuda_architectures and backend != "cuda":
        raise InvalidOption("--arch only applies to CUDA builds", hint="drop --backend cpu, or drop --arch")
    archs = (
        tuple(parse_cuda_archs(list(options.cuda_architectures)))
        if options.cuda_architectures
        else tuple(recipe.cuda_architectures)
    )

    if options.base_image:
        base = ImageRef(tag=options.base_image)
    elif backend in recipe.images:
        base = recipe.images[backend]
    else:
        raise InvalidOption(
            f"recipe {recipe.name!r} names no base image for backend {backend!r}",
            hint=f"add [images.{backend}] to the recipe or pass --base-image",
        )

    series = None if options.no_patches else (options.patches or recipe.patches)
    patches = tuple(read_series(series))

    cmake: dict[str, str] = {"CMAKE_BUILD_TYPE": "Release"}
    cmake.update({key: _cmake_value(value) for key, value in recipe.cmake.items()})
    cmake.update(dict(options.cmake))
    if backend == "cuda":
        cmake["GGML_CUDA"] = "ON"
        cmake["CMAKE_CUDA_ARCHITECTURES"] = ";".join(archs)
    source = recipe.source
    # Injected because archives carry no .git: llama-cli --version and llama-bench report these.
    cmake["LLAMA_BUILD_COMMIT"] = source.commit[:7]
    cmake["LLAMA_BUILD_NUMBER"] = str(source.build_number)
    cmake_args = ("-G", "Ninja", *(f"-D{key}={value}" for key, value in sorted(cmake.items())))

    epoch = calendar.timegm(source.date.timetuple()) if source.date else 0
    dockerfile = render(
        f"linux/Dockerfile.{backend}.j2",
        base_image=base.tag if base.digest is None else f"{base.tag.split(':')[0]}@{base.digest}",
        packages=_PACKAGES[backend],
        ca_bundle=options.ca_bundle is not None,
    )
    script = render(
        "linux/build.sh.j2",
        recipe_name=recipe.name,
        backend=backend,
        cmake_args=cmake_args,
        targets=recipe.targets,
        source_date_epoch=epoch,
        packages=_PACKAGES[backend],
    )
    return BuildPlan(
        recipe=recipe,
        backend=backend,
        cuda_architectures=archs if backend == "cuda" else (),
        base_image=base,
        patches=patches,
        cmake_args=cmake_args,
        targets=tuple(recipe.targets),
        dockerfile=dockerfile,
        build_script=script,
        source_date_epoch=epoch,
        ca_bundle=options.ca_bundle,
        artifacts=tuple(f"bin/{target}" for target in recipe.targets),
    )
