"""Windows: MSVC (+ CUDA) builds on a Windows build host, from a PowerShell script rendered from
``templates/windows/build.ps1.j2``; artifacts are ``bin/<target>.exe`` with ggml's DLLs (and, for CUDA, the CUDA
runtime DLLs) beside them, the way upstream's Windows releases ship. The host is reached with the ssh executor
(Windows' OpenSSH server with a POSIX ``DefaultShell``, e.g. Git for Windows' bash) or the local executor on
Windows itself; nothing here runs in Docker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.build.recipes import Backend, BuildRecipe
from llamaforge.build.recipes import Platform as PlatformName
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render
from llamaforge.platforms import BuildEnvironment, BuildScript, PlatformBuild

if TYPE_CHECKING:
    from llamaforge.build.plan import BuildOptions

TEMPLATES = "windows"  # templates/windows/
BACKENDS: tuple[Backend, ...] = ("cpu", "cuda")
POWERSHELL = ("powershell.exe", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-File")


class WindowsPlatform:
    """Windows builds with MSVC (CPU, or CUDA with ``--arch``) on a Windows host."""

    name: PlatformName = "windows"
    template_dir: str | None = TEMPLATES
    preferred_backend: Backend | None = None

    def check(self, recipe: BuildRecipe, backend: Backend) -> None:
        """Windows builds the cpu and cuda backends with MSVC."""
        if backend not in BACKENDS:
            raise InvalidOption(
                f"backend {backend!r} cannot be built for Windows",
                hint="for Windows use --backend cpu or --arch 86 (CUDA); Metal builds need --platform macos",
            )

    def cmake(self, recipe: BuildRecipe, backend: Backend) -> dict[str, str]:
        """Nothing beyond the recipe (MSVC's default runtime, /MD, is what upstream's releases use)."""
        return {}

    def build(
        self,
        recipe: BuildRecipe,
        backend: Backend,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Render the PowerShell build script; the environment is the build host (no builder image)."""
        script = render(
            f"{TEMPLATES}/build.ps1.j2",
            recipe_name=recipe.name,
            backend=backend,
            cmake_args=cmake_args,
            targets=recipe.targets,
            source_date_epoch=source_date_epoch,
        )
        return PlatformBuild(
            # The script checks Visual Studio, cmake, ninja and CUDA inside the VS developer shell itself:
            # outside it they are not on PATH.
            environment=BuildEnvironment(image=None, host_tools=()),
            script=BuildScript(name="build.ps1", text=script, interpreter=POWERSHELL),
            artifacts=tuple(f"bin/{target}.exe" for target in recipe.targets),
        )
