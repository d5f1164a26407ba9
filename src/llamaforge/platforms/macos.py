"""macOS: Metal (or CPU-only) builds on a Mac, from a bash script rendered from ``templates/macos/build.sh.j2``;
arm64, the Metal library embedded (no ``default.metallib`` to ship), RPATH ``@loader_path`` so the binaries find
their libraries beside them. The Mac is reached with the ssh executor, or the local executor on the Mac itself;
nothing runs Metal in Docker and there is no practical cross build from Linux."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.build.recipes import Backend, BuildRecipe
from llamaforge.build.recipes import Platform as PlatformName
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render_cached
from llamaforge.platforms import BuildEnvironment, BuildScript, HostTool, PlatformBuild

if TYPE_CHECKING:
    from llamaforge.build.plan import BuildOptions

TEMPLATES = "macos"  # templates/macos/
BACKENDS: tuple[Backend, ...] = ("metal", "cpu")
DEPLOYMENT_TARGET = (
    "13.3"  # the oldest macOS the binaries run on; --cmake CMAKE_OSX_DEPLOYMENT_TARGET=… changes it
)
# Their versions join the build key where present; the script itself names a missing one (and how to install it).
HOST_TOOLS: tuple[HostTool, ...] = tuple(
    HostTool(name, optional=True) for name in ("cmake", "ninja", "xcrun", "ccache")
)


class MacosPlatform:
    """macOS builds on a Mac: Metal by default (``backend = "metal"``), or CPU only."""

    name: PlatformName = "macos"
    template_dir: str | None = TEMPLATES
    preferred_backend: Backend | None = "metal"  # with --platform macos and no --backend

    def check(self, recipe: BuildRecipe, backend: Backend) -> None:
        """macOS builds the metal and cpu backends; CUDA does not exist there."""
        if backend not in BACKENDS:
            raise InvalidOption(
                f"backend {backend!r} cannot be built for macOS",
                hint="for macOS use --backend metal (the default there) or --backend cpu; CUDA builds need "
                "--platform linux or windows",
            )

    def cmake(self, recipe: BuildRecipe, backend: Backend, options: BuildOptions) -> dict[str, str]:
        """arm64, Metal on or off, the embedded Metal library, RPATH @loader_path; one CPU backend (ggml has no
        CPU variants on Darwin), linked in."""
        return {
            "CMAKE_OSX_ARCHITECTURES": "arm64",
            "CMAKE_OSX_DEPLOYMENT_TARGET": DEPLOYMENT_TARGET,
            "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
            "CMAKE_INSTALL_RPATH": "@loader_path",
            "GGML_METAL": "ON" if backend == "metal" else "OFF",
            "GGML_METAL_EMBED_LIBRARY": "ON" if backend == "metal" else "OFF",
            "GGML_BACKEND_DL": "OFF",
            "GGML_CPU_ALL_VARIANTS": "OFF",
        }

    def build(
        self,
        recipe: BuildRecipe,
        backend: Backend,
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
