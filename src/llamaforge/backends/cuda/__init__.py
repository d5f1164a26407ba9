"""The CUDA backend (ggml-cuda): NVIDIA GPUs, built for the compute capabilities ``--arch`` names.

Its parts: :mod:`.arch` parses arch lists, :mod:`.device_code` checks what device code a finished build carries,
:mod:`.probe` compiles one unit to prove what a set of cmake arguments produces, :mod:`.unit_probe` does that in
a plan's builder image. On Linux the toolkit is NVIDIA's PyPI wheels on the local Debian base (``wheels``) or
the recipe's ``nvidia/cuda`` image (``image``); on Windows it is the host's, with MSVC."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from llamaforge.backends.base import DEBIAN_BUILD_PACKAGES, Backend, Devices, LinuxBuilder
from llamaforge.backends.cuda.arch import check_toolkit_range, parse_cuda_archs
from llamaforge.backends.cuda.device_code import LISTING, check_device_code
from llamaforge.build.names import BackendName, PlatformName
from llamaforge.core.templates import render_cached

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions
    from llamaforge.build.recipes import BuildRecipe

# The nvidia/cuda image has the rest of a C/C++ toolchain; the wheel toolkit goes onto the plain Debian base.
IMAGE_PACKAGES = ("ca-certificates", "ccache", "cmake", "g++", "ninja-build")
WHEELS_PACKAGES = (*DEBIAN_BUILD_PACKAGES, "python3-pip")


def toolkit_kind(recipe: BuildRecipe, options: BuildOptions) -> str:
    """Where a CUDA build's toolkit comes from: ``wheels`` or ``image`` (``--cuda-toolkit`` over the recipe)."""
    return options.cuda_toolkit or recipe.cuda.toolkit


class CudaBackend(Backend):
    """ggml-cuda for the archs of ``--arch`` (else the recipe's ``cuda_architectures``)."""

    name: ClassVar[BackendName] = "cuda"
    description: ClassVar[str] = "NVIDIA GPUs"
    platforms: ClassVar[tuple[PlatformName, ...]] = ("linux", "windows")
    driver_libraries: ClassVar[tuple[str, ...]] = ("libcuda.so.1", "libnvidia-ml.so.1")
    devices: ClassVar[Devices] = Devices(gpus=1)
    host_tools: ClassVar[tuple[tuple[str, str], ...]] = (
        ("nvcc", "install a CUDA toolkit, or use --executor docker"),
    )
    doctor_tools: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("nvcc", "CUDA compile checks", "pip install nvidia-cuda-nvcc (or a CUDA toolkit)"),
    )
    tool_versions: ClassVar[tuple[tuple[str, str], ...]] = (("nvcc", "nvcc --version | tail -n 1"),)

    def archs(self, requested: Sequence[str], recipe: BuildRecipe) -> tuple[str, ...]:
        """``--arch`` parsed (GPU names and dotted capabilities allowed), else the recipe's list."""
        return tuple(parse_cuda_archs(list(requested))) if requested else tuple(recipe.cuda_architectures)

    def check(self, recipe: BuildRecipe, options: BuildOptions, archs: tuple[str, ...]) -> None:
        """The archs against the CUDA toolkit the build will use (its major from the wheel release or the image
        tag)."""
        if toolkit_kind(recipe, options) == "wheels" and not options.base_image:
            check_toolkit_range(list(archs), recipe.cuda.major, f"cuda-toolkit {recipe.cuda.release} wheels")
            return
        image = recipe.images.get(self.name)
        tag = options.base_image or (image.tag if image else "")
        found = re.search(r"cuda:(\d+)\.", tag)
        check_toolkit_range(list(archs), int(found.group(1)) if found else None, tag)

    def cmake(self, archs: tuple[str, ...]) -> dict[str, str]:
        """CUDA on, for exactly ``archs``."""
        return {"GGML_CUDA": "ON", "CMAKE_CUDA_ARCHITECTURES": ";".join(archs)}

    def linux_builder(self, recipe: BuildRecipe, options: BuildOptions) -> LinuxBuilder:
        """The wheel toolkit on the CPU base image (``cuda-wheels``), or the ``nvidia/cuda`` image (``cuda``);
        either downloads over TLS (PyPI, NVIDIA's apt repository)."""
        variables = {
            "release": recipe.cuda.release,
            "cuobjdump": recipe.cuda.cuobjdump,
            "major": str(recipe.cuda.major),
        }
        if toolkit_kind(recipe, options) == "wheels":
            return LinuxBuilder(
                "cuda-wheels", WHEELS_PACKAGES, images="cpu", downloads_over_tls=True, variables=variables
            )
        return LinuxBuilder("cuda", IMAGE_PACKAGES, downloads_over_tls=True, variables=variables)

    def script_steps(self) -> str:
        """List every artifact's device code with cuobjdump (checked by ``after_build``)."""
        return render_cached("linux/cuda-device-code.sh.j2")

    def records(self) -> tuple[str, ...]:
        """The device-code listing."""
        return (LISTING,)

    def after_build(self, out: Path, archs: tuple[str, ...], log_path: str) -> dict[str, object]:
        """The device code of every artifact, matched against the archs asked for."""
        return {"cuda_device_code": check_device_code(out, archs, log_path)}
