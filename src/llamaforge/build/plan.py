"""Turn a recipe plus options into a BuildPlan: a pure function, no Docker, no network.

What is common to every platform (backend, CUDA archs, patches, cmake arguments, build identity) is resolved here;
the recipe's platform (``llamaforge.platforms``) renders its environment, script and artifact names."""

from __future__ import annotations

import calendar
import json
import platform as platform_module
from dataclasses import dataclass, field
from typing import Any

from llamaforge.backends import arch_backend, get_backend
from llamaforge.build.cmake_options import (
    BACKEND_HINT,
    CONTROL_HINT,
    REFUSED_HINT,
    VALUE_HINT,
    backend_cmake_keys,
    multiline_cmake_values,
    refused_cmake_keys,
    unnamed_cmake_keys,
    unsafe_cmake_values,
)
from llamaforge.build.cpu_level import (
    BASELINE,
    check_cpu_level,
    controlled_keys,
    cpu_architecture,
    cpu_cmake,
    is_multi_variant,
)
from llamaforge.build.names import BackendName
from llamaforge.build.options import BuildOptions
from llamaforge.build.patches import PatchRef, read_series
from llamaforge.build.recipes import BuildRecipe
from llamaforge.core.errors import InvalidOption
from llamaforge.core.version import __version__
from llamaforge.platforms import BuildEnvironment, BuildScript, Platform, get_platform, sha256_text

__all__ = ["PLAN_FORMAT", "BuildOptions", "BuildPlan", "plan_build"]

# Bump when the layout of build outputs or the meaning of the key changes, so old cache entries are not reused.
PLAN_FORMAT = 1


@dataclass(frozen=True)
class BuildPlan:
    """Everything needed to execute a build, and the digest of it that keys the cache."""

    recipe: BuildRecipe
    backend: BackendName
    cuda_architectures: tuple[str, ...]  # the backend's arch list (CUDA's; empty for the others)
    patches: tuple[PatchRef, ...]
    cpu: str
    cmake_args: tuple[str, ...]
    targets: tuple[str, ...]
    environment: BuildEnvironment
    script: BuildScript
    source_date_epoch: int
    # The artifacts every build of the plan must have (the targets' binaries); the manifest lists every file
    # the build left, libraries and backend modules included.
    artifacts: tuple[str, ...] = field(default=())
    source_unread: tuple[str, ...] = field(default=())  # not copied into a build container
    toolchain: str | None = None  # set where a platform has several (windows: mingw or msvc)

    def key_inputs(self) -> dict[str, Any]:
        """Every input of the build except the environment id (known only once the environment exists)."""
        return {
            "format": PLAN_FORMAT,
            "platform": self.recipe.platform,
            "backend": self.backend,
            "source": self.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "cmake_args": list(self.cmake_args),
            "targets": list(self.targets),
            "build_script_sha256": sha256_text(self.script.text),
            **({"source_unread": list(self.source_unread)} if self.source_unread else {}),
            **({"toolchain": self.toolchain} if self.toolchain else {}),
            **self.environment.key_inputs(),
        }

    @property
    def plan_digest(self) -> str:
        """sha256 over ``key_inputs``."""
        return sha256_text(json.dumps(self.key_inputs(), sort_keys=True))

    def cache_key(self, environment_id: str) -> str:
        """The build key: every input plus the environment id (e.g. the builder image id)."""
        return sha256_text(f"{self.plan_digest}\n{environment_id}")[:32]

    def to_json(self) -> dict[str, Any]:
        """The plan as data (``--dry-run --json``)."""
        image = self.environment.image
        files = {"Dockerfile": image.dockerfile} if image else {}
        return {
            "recipe": self.recipe.name,
            "platform": self.recipe.platform,
            "toolchain": self.toolchain,
            "backend": self.backend,
            "cuda_architectures": list(self.cuda_architectures),
            "cpu": self.cpu,
            "source": self.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "base_image": image.base.model_dump(mode="json") if image else None,
            "builder_tag": image.tag if image else None,
            "ca_bundle": (
                {"path": str(image.ca_bundle), "from": image.ca_bundle_origin}
                if image and image.ca_bundle
                else None
            ),
            "host_tools": [tool.name for tool in self.environment.host_tools],
            "interpreter": list(self.script.interpreter),
            "cmake_args": list(self.cmake_args),
            "targets": list(self.targets),
            "artifacts": list(self.artifacts),
            "source_unread": list(self.source_unread),
            "source_date_epoch": self.source_date_epoch,
            "plan_digest": self.plan_digest,
            "files": {**files, self.script.name: self.script.text},
            "llamaforge_version": __version__,
        }


def _cmake_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    return str(value)


def _cpu_level(level: str, options: BuildOptions, platform: Platform) -> str:
    try:
        check_cpu_level(level)
    except ValueError as error:
        raise InvalidOption(f"--cpu: {error}", hint="e.g. --cpu native or --cpu x86-64-v3") from None
    if unnamed := unnamed_cmake_keys(key for key, _value in options.cmake):
        raise InvalidOption(
            f"--cmake {', '.join(repr(key) for key in unnamed)}: not a CMake variable name",
            hint="give KEY=VALUE with a KEY of letters, digits and '_' (no type suffix), e.g. GGML_RPC=ON",
        )
    if refused := refused_cmake_keys(key for key, _value in options.cmake):
        raise InvalidOption(
            f"--cmake {', '.join(refused)}: not a CMake option this build accepts", hint=REFUSED_HINT
        )
    values: dict[str, set[str]] = {}
    for key, value in options.cmake:
        values.setdefault(key, set()).add(value)
    if twice := sorted(key for key, given in values.items() if len(given) > 1):
        # only the last one reached cmake, silently
        raise InvalidOption(
            f"--cmake {', '.join(twice)} given twice with different values",
            hint="give each option once, with the value it should have",
        )
    if chosen := backend_cmake_keys(key for key, _value in options.cmake):
        raise InvalidOption(f"--cmake {', '.join(chosen)}: not set by -D", hint=BACKEND_HINT)
    if multiline := multiline_cmake_values(options.cmake):
        raise InvalidOption(
            f"--cmake {', '.join(multiline)}: the value holds a control character", hint=CONTROL_HINT
        )
    if unsafe := unsafe_cmake_values(options.cmake):
        raise InvalidOption(f"--cmake {', '.join(unsafe)}: the value is more than one word", hint=VALUE_HINT)
    if decided := controlled_keys(options.cmake):
        raise InvalidOption(
            f"--cmake {', '.join(decided)}: the CPU level decides this option",
            hint="use --cpu native, --cpu baseline, --cpu x86-64-v3 … instead",
        )
    wanted = cpu_architecture(level)
    if wanted and platform.machine and wanted != platform.machine:
        # A Mac builds arm64 and Windows builds x64, wherever the build runs: another level would be recorded
        # and silently not built (ggml ignores the other architecture's options).
        raise InvalidOption(
            f"CPU level {level!r} is for {wanted}, but {platform.title or platform.name} builds are for "
            f"{platform.machine}",
            hint="set the cpu level (--cpu, or the recipe's cpu) to native, baseline or "
            + (
                "an arm64 architecture such as armv8.2-a+dotprod"
                if platform.machine == "aarch64"
                else "x86-64-v2, x86-64-v3 or x86-64-v4"
            ),
        )
    machine = platform_module.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    # Builds for another system (a Mac or a Windows host over SSH) are not compared with this machine.
    if platform.name == "linux" and wanted and machine in ("x86_64", "aarch64") and wanted != machine:
        raise InvalidOption(
            f"CPU level {level!r} is for {wanted}, but this machine builds for {machine}",
            hint="use cpu = variants (every level of this architecture) or one of its levels",
        )
    return level


def _one_backend(platform: Platform, *, given: bool) -> str:
    """The level of a platform's one CPU backend for a recipe's ``variants`` (the plan recorded variants that
    were never built); ``--cpu variants`` itself is refused there."""
    if given:
        raise InvalidOption(
            f"--cpu variants: {platform.title or platform.name} builds have one CPU backend, linked in (ggml "
            "builds no CPU variants there)",
            hint="leave --cpu out (the one backend is then built at the baseline level), or give native or "
            + (
                "an arm64 architecture such as armv8.2-a+dotprod"
                if platform.machine == "aarch64"
                else "a level"
            ),
        )
    return BASELINE


def plan_build(recipe: BuildRecipe, options: BuildOptions | None = None) -> BuildPlan:
    """Resolve ``recipe`` and ``options`` into a BuildPlan; the recipe's platform renders its environment and
    script."""
    options = options or BuildOptions()
    if options.platform and options.platform != recipe.platform:
        recipe = recipe.model_copy(update={"platform": options.platform})
    platform = get_platform(recipe.platform)
    preferred = platform.preferred_backend if options.platform else None
    name: BackendName = options.backend or (
        arch_backend().name if options.cuda_architectures else preferred or recipe.backend
    )
    platform.check(recipe, name)
    backend = get_backend(name)
    archs = backend.archs(options.cuda_architectures, recipe)
    backend.check(recipe, options, archs)

    series = None if options.no_patches else (options.patches or recipe.patches)
    patches = tuple(read_series(series, platform=recipe.platform))

    cpu = _cpu_level(recipe.cpu if options.cpu is None else options.cpu, options, platform)
    if is_multi_variant(cpu) and not platform.cpu_variants:
        cpu = _one_backend(platform, given=options.cpu is not None)
    cmake: dict[str, str] = {"CMAKE_BUILD_TYPE": "Release"}
    cmake.update({key: _cmake_value(value) for key, value in recipe.cmake.items()})
    cmake.update(cpu_cmake(cpu, machine=platform.machine))
    cmake.update(platform.cmake(recipe, name, options))
    cmake.update(dict(options.cmake))
    cmake.update(backend.cmake(archs))
    source = recipe.source
    # Injected because archives carry no .git: llama-cli --version and llama-bench report these.
    cmake["LLAMA_BUILD_COMMIT"] = source.commit[:7]
    # An unknown build number is llama.cpp's own "0", what its build-info step reports without git.
    cmake["LLAMA_BUILD_NUMBER"] = str(source.build_number or 0)
    cmake_args = ("-G", "Ninja", *(f"-D{key}={value}" for key, value in sorted(cmake.items())))

    epoch = calendar.timegm(source.date.timetuple()) if source.date else 0
    built = platform.build(recipe, name, options, cmake_args, epoch)
    if options.base_image and built.environment.image is None:
        # a host build (a Mac, MSVC on Windows) has no builder image: the option changed nothing
        raise InvalidOption(
            f"--base-image {options.base_image}: {platform.title or platform.name} builds "
            + (f"with {built.toolchain} " if built.toolchain else "")
            + "run on a build host, with no builder image",
            hint="drop --base-image; the build host's own toolchain builds",
        )
    return BuildPlan(
        recipe=recipe,
        backend=name,
        cuda_architectures=archs,
        patches=patches,
        cpu=cpu,
        cmake_args=cmake_args,
        targets=tuple(recipe.targets),
        environment=built.environment,
        script=built.script,
        source_date_epoch=epoch,
        artifacts=built.artifacts,
        source_unread=built.source_unread,
        toolchain=built.toolchain,
    )
