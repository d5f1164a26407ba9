"""Windows: two toolchains.

* ``mingw`` (the docker executor's): cross-compiled in a Debian builder image with mingw-w64's posix-threads
  compilers, a CMake toolchain file from ``templates/windows/mingw-toolchain.cmake.j2`` written by the bash
  script ``templates/windows/build-mingw.sh.j2``; CPU only. The runtime (libgcc, libstdc++, winpthread) is linked
  in, so no mingw DLL ships.
* ``msvc`` (a Windows host's): MSVC (+ CUDA) builds on a Windows build host, from a PowerShell script rendered from
  ``templates/windows/build.ps1.j2``, reached with the ssh executor (Windows' OpenSSH server with a POSIX
  ``DefaultShell``, e.g. Git for Windows' bash) or the local executor on Windows itself.

Artifacts are ``bin/<target>.exe`` with ggml's DLLs (and, for CUDA, the CUDA runtime DLLs) beside them, the way
upstream's Windows releases ship."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from llamaforge.backends import get_backend
from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.recipes import BuildRecipe, WindowsToolchain
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render_cached
from llamaforge.platforms.base import (
    BuildEnvironment,
    BuilderImage,
    BuildScript,
    Platform,
    PlatformBuild,
    builder_tag,
    image_ca_bundle,
)
from llamaforge.platforms.linux import SOURCE_UNREAD, base_image, pinned

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions

TEMPLATES = "windows"  # templates/windows/
MINGW_BACKENDS: tuple[BackendName, ...] = ("cpu",)  # the mingw cross build; MSVC builds every Windows backend
POWERSHELL = ("powershell.exe", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-File")

TRIPLET = "x86_64-w64-mingw32"
# Windows 10: cpp-httplib (llama-server) refuses less; SetThreadInformation and PrefetchVirtualMemory need 0x0602.
WIN32_WINNT = "0x0A00"
# --exclude-libs: the static runtime's symbols (libgcc's _Unwind_Resume …) stay out of each DLL's exports, or
# the next DLL that links against it finds them twice.
MINGW_LINK_FLAGS = (
    "-static-libgcc",
    "-static-libstdc++",
    "-static",
    "-Wl,--exclude-libs,ALL",
    "-Wl,--no-insert-timestamp",
)
MINGW_CMAKE = {"GGML_OPENMP": "OFF"}
# Installed into the mingw builder image, and listed with their versions in each build's toolchain.json.
MINGW_PACKAGES = [
    "binutils-mingw-w64-x86-64",
    "ca-certificates",
    "ccache",
    "cmake",
    "g++-mingw-w64-x86-64-posix",
    "gcc-mingw-w64-x86-64-posix",
    "make",
    "mingw-w64-x86-64-dev",
    "ninja-build",
]


def default_toolchain(executor: str) -> WindowsToolchain:
    """The toolchain of a Windows build with no ``--toolchain``: mingw in Docker, MSVC on a build host."""
    return "mingw" if executor == "docker" else "msvc"


def check_toolchain(toolchain: WindowsToolchain, executor: str) -> None:
    """Refuse a toolchain the executor cannot run: mingw builds in Docker, MSVC on a Windows host."""
    if toolchain == "mingw" and executor != "docker":
        raise InvalidOption(
            f"the mingw toolchain cross-compiles in Docker, not with --executor {executor}",
            hint="use --executor docker for mingw, or --toolchain msvc for a Windows build host",
        )
    if toolchain == "msvc" and executor == "docker":
        raise InvalidOption(
            "the msvc toolchain builds on a Windows host, not in Docker",
            hint="use --toolchain mingw (a cross build in Docker), or --executor ssh --build-host user@host:port",
        )


def mingw_toolchain_file() -> str:
    """The CMake toolchain file of the mingw cross build."""
    return render_cached(
        f"{TEMPLATES}/mingw-toolchain.cmake.j2",
        triplet=TRIPLET,
        win32_winnt=WIN32_WINNT,
        win32_winnt_name="Windows 10",
        link_flags=MINGW_LINK_FLAGS,
    )


class WindowsPlatform(Platform):
    """Windows builds: cross-compiled with mingw-w64 in Docker, or with MSVC (CPU or CUDA) on a Windows host."""

    name: ClassVar[PlatformName] = "windows"
    title: ClassVar[str] = "Windows"
    template_dir: ClassVar[str | None] = TEMPLATES
    machine: ClassVar[str | None] = "x86_64"  # mingw's x86_64 triplet; MSVC's x64 developer shell

    def backend_hint(self, backend: BackendName) -> str:
        """Windows builds the cpu and cuda backends (CUDA with MSVC only; see ``build``)."""
        return "for Windows use --backend cpu or --arch 86 (CUDA); Metal builds need --platform macos"

    def cmake(self, recipe: BuildRecipe, backend: BackendName, options: BuildOptions) -> dict[str, str]:
        """MSVC: nothing beyond the recipe (its default runtime, /MD, is what upstream's releases use). mingw:
        OpenMP off, since ggml-cpu would import libgomp-1.dll (ggml's own thread pool runs instead)."""
        return MINGW_CMAKE if (options.toolchain or "mingw") == "mingw" else {}

    def build(
        self,
        recipe: BuildRecipe,
        backend: BackendName,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """The mingw builder image and bash script, or the MSVC PowerShell script (the build host is its
        environment)."""
        toolchain = options.toolchain or "mingw"
        artifacts = tuple(f"bin/{target}.exe" for target in recipe.targets)
        if toolchain == "msvc":
            script = render_cached(
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
                artifacts=artifacts,
                toolchain=toolchain,
            )
        if backend not in MINGW_BACKENDS:
            raise InvalidOption(
                f"{backend.upper()} builds for Windows need MSVC on a Windows build host; the mingw cross build "
                "is CPU only",
                hint="use --toolchain msvc --executor ssh --build-host user@host:port, or --backend cpu for mingw",
            )
        base = base_image(recipe, get_backend("cpu").linux_builder(recipe, options), options)
        # The mingw image downloads nothing over TLS (the Debian base's apt repository is plain http).
        ca_bundle, ca_origin = image_ca_bundle(options, downloads_over_tls=False)
        dockerfile = render_cached(
            f"{TEMPLATES}/Dockerfile.mingw.j2",
            base_image=pinned(base),
            packages=MINGW_PACKAGES,
            ca_bundle=ca_bundle is not None,
        )
        script = render_cached(
            f"{TEMPLATES}/build-mingw.sh.j2",
            recipe_name=recipe.name,
            cmake_args=cmake_args,
            targets=recipe.targets,
            source_date_epoch=source_date_epoch,
            packages=MINGW_PACKAGES,
            toolchain=mingw_toolchain_file(),
            triplet=TRIPLET,
        )
        image = BuilderImage(
            tag=builder_tag("mingw", dockerfile, base, ca_bundle),
            base=base,
            dockerfile=dockerfile,
            ca_bundle=ca_bundle,
            ca_bundle_origin=ca_origin,
        )
        return PlatformBuild(
            environment=BuildEnvironment(image=image),
            script=BuildScript(name="build.sh", text=script, interpreter=("bash",)),
            artifacts=artifacts,
            source_unread=SOURCE_UNREAD,
            toolchain=toolchain,
        )
