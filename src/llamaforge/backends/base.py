"""The shape of a backend: what one llama.cpp backend (ggml-cpu, ggml-cuda, ggml-vulkan, ggml-metal) adds to a
build, to the images that carry it and to the containers that run it.

Every hook has a default, the CPU backend's: a backend overrides only what differs. The planner
(:func:`llamaforge.build.plan.plan_build`) composes a platform with a backend; the platform asks the backend for
its builder needs, the executors and deploy targets for its devices, the runtime image for its libraries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from llamaforge.build.names import BackendName, PlatformName
from llamaforge.core.errors import InvalidOption

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions
    from llamaforge.build.recipes import BuildRecipe

# Installed into a Debian builder image of every Linux build, and listed with their versions in each build's
# toolchain.json; a backend's own packages join them.
DEBIAN_BUILD_PACKAGES: tuple[str, ...] = (
    "ca-certificates",
    "ccache",
    "cmake",
    "g++",
    "gcc",
    "libc6-dev",
    "make",
    "ninja-build",
)


@dataclass(frozen=True)
class LinuxBuilder:
    """A backend's Linux builder image: ``templates/linux/Dockerfile.<template>.j2`` on the recipe's
    ``[images.<images>]`` (else ``default_base``), with ``packages``; ``flavour`` names the image tag."""

    flavour: str
    packages: tuple[str, ...]
    template: str = ""  # the Dockerfile template; the flavour's own by default
    images: str = ""  # the recipe's [images.X] table it is based on; the flavour's by default
    default_base: str | None = None  # the base image when the recipe names none
    downloads_over_tls: bool = (
        False  # the image downloads over TLS while it is built (a host CA bundle joins)
    )
    variables: dict[str, str] = field(default_factory=dict)  # extra template variables

    @property
    def dockerfile(self) -> str:
        """The Dockerfile template's name under ``templates/linux/``."""
        return f"Dockerfile.{self.template or self.flavour}.j2"


@dataclass(frozen=True)
class Devices:
    """What a container of a build needs from its host to reach the accelerator."""

    gpus: int = 0  # whole NVIDIA GPUs per container: docker --gpus, the GPU resources of compose, k8s, Swarm
    paths: tuple[str, ...] = ()  # host device nodes passed through as they are (docker --device)

    def docker_args(self) -> list[str]:
        """The ``docker run`` arguments that pass these devices."""
        gpus = ["--gpus", "all"] if self.gpus else []
        return gpus + [f"--device={path}" for path in self.paths]


class Backend:
    """One llama.cpp backend. Subclasses set ``name`` and override the hooks that differ from the CPU's."""

    name: ClassVar[BackendName]
    description: ClassVar[str] = ""
    # The platforms that can build it (each platform's templates and toolchains decide).
    platforms: ClassVar[tuple[PlatformName, ...]] = ("linux", "windows", "macos")
    # Packages the runtime image installs for it, beyond those the binaries' libraries name.
    runtime_packages: ClassVar[tuple[str, ...]] = ()
    # Libraries its binaries load that the runtime packages provide (this machine may lack them).
    runtime_libraries: ClassVar[tuple[str, ...]] = ()
    # Libraries the container runtime mounts from the host's driver: never in an image.
    driver_libraries: ClassVar[tuple[str, ...]] = ()
    devices: ClassVar[Devices] = Devices()
    # Programs a host executor needs on PATH for it, with the hint that installs them.
    host_tools: ClassVar[tuple[tuple[str, str], ...]] = ()
    # What ``doctor`` checks on this machine for it: (program, what it is for, how to install it).
    doctor_tools: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    # Tool versions the build script records in toolchain.json: name -> a shell command that prints one line.
    tool_versions: ClassVar[tuple[tuple[str, str], ...]] = ()

    def archs(self, requested: Sequence[str], recipe: BuildRecipe) -> tuple[str, ...]:
        """The arch list of a build (``--arch``, else the recipe's); a backend without one refuses ``--arch``."""
        if requested:
            raise InvalidOption(
                "--arch only applies to CUDA builds", hint=f"drop --backend {self.name}, or drop --arch"
            )
        return ()

    def check(self, recipe: BuildRecipe, options: BuildOptions, archs: tuple[str, ...]) -> None:
        """Refuse, saying what to do instead, a build this backend cannot make (its toolkit, its archs); by
        default one given a CUDA toolkit, which only the cuda backend installs (it was ignored in silence)."""
        if options.cuda_toolkit:
            raise InvalidOption(
                f"--cuda-toolkit {options.cuda_toolkit} only applies to CUDA builds, not --backend {self.name}",
                hint="drop --cuda-toolkit, or build CUDA with --arch (e.g. --arch 86)",
            )

    def cmake(self, archs: tuple[str, ...]) -> dict[str, str]:
        """The CMake settings that switch the backend on; they win over the recipe's and ``--cmake``."""
        return {}

    def linux_builder(self, recipe: BuildRecipe, options: BuildOptions) -> LinuxBuilder:
        """The Linux builder image: by default the CPU one with the backend's packages."""
        return LinuxBuilder(flavour=self.name, template="cpu", packages=DEBIAN_BUILD_PACKAGES)

    def script_steps(self) -> str:
        """Bash run by the Linux build script once the artifacts are in ``${out_dir}`` (a record to write)."""
        return ""

    def records(self) -> tuple[str, ...]:
        """Files the build script writes beside the artifacts for the manifest, not published as artifacts."""
        return ()

    def after_build(self, out: Path, archs: tuple[str, ...], log_path: str) -> dict[str, object]:
        """Check the finished build in ``out`` before it is published; what it returns joins the manifest."""
        return {}


def cmake_switch(value: bool) -> str:
    """A CMake boolean as the cmake arguments spell it."""
    return "ON" if value else "OFF"
