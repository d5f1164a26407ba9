"""The platforms registry: linux plans its builder image, bash script and bin/ artifacts; windows and macos
plan host builds from their own templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.backends.base import DEBIAN_BUILD_PACKAGES
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import BuildRecipe, load_recipe
from llamaforge.core.errors import InvalidOption
from llamaforge.platforms import get_platform, platform_names

pytestmark = pytest.mark.quick


def _recipe(platform: str) -> BuildRecipe:
    return load_recipe("default").model_copy(update={"platform": platform})


def test_every_recipe_platform_is_registered() -> None:
    assert platform_names() == ["linux", "macos", "windows"]
    for name in platform_names():
        assert get_platform(name).name == name


def test_unknown_platform_names_the_known_ones() -> None:
    with pytest.raises(InvalidOption) as info:
        get_platform("plan9")
    assert "plan9" in info.value.message
    assert "linux" in (info.value.hint or "") and "windows" in (info.value.hint or "")


def test_linux_plan_has_a_builder_image_a_bash_script_and_bin_artifacts() -> None:
    plan = plan_build(load_recipe("default"), BuildOptions(no_patches=True))
    image = plan.environment.image
    assert image is not None
    assert image.tag.startswith("llamaforge-builder:cpu-")
    assert image.base.tag == "llamaforge/debian:bookworm"
    assert image.dockerfile.startswith("# Builder image for llama.cpp CPU builds.")
    assert " ".join(DEBIAN_BUILD_PACKAGES) in image.dockerfile
    assert plan.script.name == "build.sh"
    assert plan.script.interpreter == ("bash",)
    assert plan.script.command("/llamaforge/build.sh") == ["bash", "/llamaforge/build.sh"]
    # The required artifacts; the manifest adds the libraries and backend modules the build leaves beside them.
    assert plan.artifacts == ("bin/llama-server", "bin/llama-bench", "bin/llama-cli", "bin/ggml-rpc-server")
    tools = [tool.name for tool in plan.environment.host_tools]
    assert tools == ["cmake", "ninja", "cc", "c++", "ccache"]
    assert get_platform("linux").template_dir == "linux"
    assert (Path(__file__).parents[1] / "templates" / "linux" / "build.sh.j2").is_file()


def test_linux_cuda_plan_needs_nvcc_on_a_host_and_the_cuda_image() -> None:
    options = BuildOptions(cuda_architectures=("86",), no_patches=True, cuda_toolkit="image")
    plan = plan_build(load_recipe("default"), options)
    assert [tool.name for tool in plan.environment.host_tools][-1] == "nvcc"
    assert plan.environment.image is not None
    assert plan.environment.image.tag.startswith("llamaforge-builder:cuda-")
    assert plan.environment.image.base.tag.startswith("nvidia/cuda:")
    assert "LIBRARY_PATH=/usr/local/cuda/lib64/stubs" in plan.environment.image.dockerfile


def test_linux_cuda_plan_defaults_to_the_wheel_toolkit_on_the_local_base() -> None:
    plan = plan_build(load_recipe("default"), BuildOptions(cuda_architectures=("86",), no_patches=True))
    image = plan.environment.image
    assert image is not None and image.tag.startswith("llamaforge-builder:cuda-wheels-")
    assert image.base.tag == "llamaforge/debian:bookworm", "no registry: the local Debian base"
    assert "'cuda-toolkit[nvcc,nvvm,crt,cccl,cudart,culibos,cublas]==13.0.2'" in image.dockerfile
    assert "nvidia-cuda-cuobjdump==13.2.51" in image.dockerfile
    assert "cuobjdump --list-elf" in plan.script.text, "every CUDA build lists its device code"


def test_linux_refuses_a_backend_it_cannot_build() -> None:
    with pytest.raises(InvalidOption) as info:
        plan_build(load_recipe("default"), BuildOptions(backend="metal"))
    assert "metal" in info.value.message and "Linux" in info.value.message
    assert "--backend cpu" in (info.value.hint or "")


def test_linux_without_a_base_image_says_how_to_name_one() -> None:
    recipe = load_recipe("default").model_copy(update={"images": {}})
    with pytest.raises(InvalidOption) as info:
        plan_build(recipe, BuildOptions(no_patches=True))
    assert "names no base image" in info.value.message
    assert "--base-image" in (info.value.hint or "")
    plan = plan_build(recipe, BuildOptions(no_patches=True, base_image="debian:bookworm"))
    assert plan.environment.image is not None and plan.environment.image.base.tag == "debian:bookworm"


@pytest.mark.parametrize(("platform", "script"), [("windows", "build.ps1"), ("macos", "build.sh")])
def test_a_recipe_for_windows_or_macos_plans_a_host_build_with_its_templates(
    platform: str, script: str
) -> None:
    toolchain = "msvc" if platform == "windows" else None  # mingw, the docker default, builds in Docker
    plan = plan_build(_recipe(platform), BuildOptions(no_patches=True, toolchain=toolchain))
    assert plan.recipe.platform == platform and plan.script.name == script
    assert plan.environment.image is None, "these platforms build on a host of their own"
    assert get_platform(platform).template_dir == platform


def test_default_build_key_inputs_are_unchanged() -> None:
    """Build keys change only on purpose, so published builds stay cache hits. The pin moves when a build file's
    text or a recipe's options change (last: the Linux build script copies the compiler's runtime libraries into
    lib/, so a release no longer takes them from the deploying machine)."""
    plan = plan_build(load_recipe("default"), BuildOptions(no_patches=True))
    assert plan.plan_digest == "8e9daeedf438841ae4ea704db6069ff0b385ae99892a3fe6346a5be8db6208d8"
    assert plan.environment.image is not None
    assert plan.environment.image.tag == "llamaforge-builder:cpu-5deab6154b99080f"
