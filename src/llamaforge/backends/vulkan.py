"""The Vulkan backend (ggml-vulkan): AMD, Intel and NVIDIA GPUs through their Vulkan drivers, and Mesa's software
device (lavapipe) on any CPU.

Built on Linux in a Debian builder image with ``libvulkan-dev``, ``glslc`` (which compiles ggml's shaders while
it builds) and ``spirv-headers``. Bookworm's Vulkan headers (1.3.239) are too old for the ggml-vulkan this
project builds (it uses ``VK_EXT_layer_settings``; ``vk::LayerSettingEXT`` is missing from them), so the
builder's default base is a trixie image, made with ``invoke images.bootstrap --suite trixie --tag
llamaforge/debian:trixie``; a recipe's ``[images.vulkan]`` or ``--base-image`` names another. A container
reaches the GPU through ``/dev/dri``; the runtime image carries the Vulkan loader and Mesa's drivers, lavapipe
among them (a device of the CPU type, which ggml-vulkan uses only when ``GGML_VK_VISIBLE_DEVICES`` names it).
``nox -s vulkan_build`` builds it and runs llama-bench and llama-server on lavapipe."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from llamaforge.backends.base import DEBIAN_BUILD_PACKAGES, Backend, Devices, LinuxBuilder
from llamaforge.build.names import BackendName, PlatformName

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions
    from llamaforge.build.recipes import BuildRecipe

BASE_IMAGE = "llamaforge/debian:trixie"
BUILD_PACKAGES = ("glslc", "libvulkan-dev", "spirv-headers")


class VulkanBackend(Backend):
    """ggml-vulkan, its shaders compiled with glslc."""

    name: ClassVar[BackendName] = "vulkan"
    description: ClassVar[str] = "Vulkan GPUs (AMD, Intel, NVIDIA; lavapipe on the CPU)"
    platforms: ClassVar[tuple[PlatformName, ...]] = ("linux",)
    runtime_packages: ClassVar[tuple[str, ...]] = ("libvulkan1", "mesa-vulkan-drivers")
    runtime_libraries: ClassVar[tuple[str, ...]] = ("libvulkan.so.1",)
    devices: ClassVar[Devices] = Devices(paths=("/dev/dri",))
    host_tools: ClassVar[tuple[tuple[str, str], ...]] = (
        ("glslc", "install glslc, libvulkan-dev and spirv-headers, or use --executor docker"),
    )
    doctor_tools: ClassVar[tuple[tuple[str, str, str], ...]] = (
        (
            "glslc",
            "Vulkan builds with the local executor",
            "apt-get install glslc libvulkan-dev spirv-headers",
        ),
    )
    tool_versions: ClassVar[tuple[tuple[str, str], ...]] = (("glslc", "glslc --version | head -n 1"),)

    def cmake(self, archs: tuple[str, ...]) -> dict[str, str]:
        """Vulkan on."""
        return {"GGML_VULKAN": "ON"}

    def linux_builder(self, recipe: BuildRecipe, options: BuildOptions) -> LinuxBuilder:
        """The CPU builder's packages, the Vulkan headers and glslc, on trixie unless the recipe says otherwise."""
        return LinuxBuilder(
            flavour="vulkan",
            packages=tuple(sorted(DEBIAN_BUILD_PACKAGES + BUILD_PACKAGES)),
            default_base=BASE_IMAGE,
        )
