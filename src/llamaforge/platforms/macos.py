"""macOS: Metal (or CPU-only) builds on a Mac, from a bash script rendered from ``templates/macos/build.sh.j2``;
arm64, the Metal library embedded (no ``default.metallib`` to ship), RPATH ``@loader_path`` so the binaries find
their libraries beside them. The Mac is reached with the ssh executor, or the local executor on the Mac itself;
nothing runs Metal in Docker and there is no practical cross build from Linux."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.recipes import BuildRecipe
from llamaforge.core.templates import render_cached
from llamaforge.platforms.base import BuildEnvironment, BuildScript, HostTool, Platform, PlatformBuild

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions

TEMPLATES = "macos"  # templates/macos/
DEPLOYMENT_TARGET = (
    "13.3"  # the oldest macOS the binaries run on; --cmake CMAKE_OSX_DEPLOYMENT_TARGET=… changes it
)
# Their versions join the build key where present; the script itself names a missing one (and how to install it).
HOST_TOOLS: tuple[HostTool, ...] = tuple(
    HostTool(name, optional=True) for name in ("cmake", "ninja", "xcrun", "ccache")
)


class MacosPlatform(Platform):
    """macOS builds on a Mac: Metal by default (``backend = "metal"``), or CPU only."""

    name: ClassVar[PlatformName] = "macos"
    title: ClassVar[str] = "macOS"
    template_dir: ClassVar[str | None] = TEMPLATES
    preferred_backend: ClassVar[BackendName | None] = "metal"  # with --platform macos and no --backend
    machine: ClassVar[str | None] = "aarch64"  # CMAKE_OSX_ARCHITECTURES=arm64
    cpu_variants: ClassVar[bool] = False  # ggml-cpu has no variants on Darwin: one backend, linked in

    def backend_hint(self, backend: BackendName) -> str:
        """macOS builds the metal and cpu backends."""
        return (
            "for macOS use --backend metal (the default there) or --backend cpu; CUDA and Vulkan builds need "
            "--platform linux (CUDA: or windows)"
        )

    def cmake(self, recipe: BuildRecipe, backend: BackendName, options: BuildOptions) -> dict[str, str]:
        """arm64, RPATH @loader_path; one CPU backend (ggml has no CPU variants on Darwin), linked in; Metal off
        unless the metal backend turns it on (ggml turns it on by default on Apple)."""
        return {
            "CMAKE_OSX_ARCHITECTURES": "arm64",
            "CMAKE_OSX_DEPLOYMENT_TARGET": DEPLOYMENT_TARGET,
            "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
            "CMAKE_INSTALL_RPATH": "@loader_path",
            "GGML_METAL": "OFF",
            "GGML_METAL_EMBED_LIBRARY": "OFF",
            "GGML_BACKEND_DL": "OFF",
            "GGML_CPU_ALL_VARIANTS": "OFF",
        }

    def build(
        self,
        recipe: BuildRecipe,
        backend: BackendName,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Render the bash build script; the environment is the Mac (no builder image)."""
        script = render_cached(
            f"{TEMPLATES}/build.sh.j2",
            recipe_name=recipe.name,
            backend=backend,
            cmake_args=cmake_args,
            targets=recipe.targets,
            source_date_epoch=source_date_epoch,
        )
        return PlatformBuild(
            environment=BuildEnvironment(image=None, host_tools=HOST_TOOLS),
            script=BuildScript(name="build.sh", text=script, interpreter=("bash",)),
            artifacts=tuple(f"bin/{target}" for target in recipe.targets),
        )
