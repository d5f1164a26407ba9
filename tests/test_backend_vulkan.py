"""The Vulkan backend: its plan (golden files, and the linters pass on them), its runtime image and the devices
its containers get. No build here: the build on lavapipe is the nox session ``vulkan_build``."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from helpers import check_golden
from llamaforge.build.options import BuildOptions
from llamaforge.build.plan import BuildPlan, plan_build
from llamaforge.build.recipes import ImageRef, load_recipe
from llamaforge.build.runtime_image import plan_runtime_image
from llamaforge.core.errors import ImageError, InvalidOption
from llamaforge.deploy.manifests.files import ManifestInputs, render_compose
from llamaforge.deploy.release import Layout
from llamaforge.deploy.targets.container import ContainerImage, render_container
from test_deploy_docker import IMAGE, spec
from test_deploy_render import CPU, SPEC
from test_runtime_image import FakeLdd, fake_build

pytestmark = pytest.mark.quick


def vulkan_plan(**changes: object) -> BuildPlan:
    return plan_build(load_recipe("default"), BuildOptions(backend="vulkan", no_patches=True, **changes))  # type: ignore[arg-type]


def test_the_vulkan_plan_matches_its_golden_files() -> None:
    plan = vulkan_plan()
    assert plan.environment.image is not None
    check_golden("vulkan.Dockerfile", plan.environment.image.dockerfile)
    check_golden("vulkan.build.sh", plan.script.text)
    assert plan.backend == "vulkan" and plan.cuda_architectures == ()
    assert "-DGGML_VULKAN=ON" in plan.cmake_args and not any("CUDA" in arg for arg in plan.cmake_args)
    # Bookworm's Vulkan headers are too old for this llama.cpp: the builder is based on trixie.
    assert plan.environment.image.base == ImageRef(tag="llamaforge/debian:trixie")
    assert plan.environment.image.tag.startswith("llamaforge-builder:vulkan-")
    assert [tool.name for tool in plan.environment.host_tools][-1] == "glslc"


def test_the_vulkan_builder_and_script_pass_the_linters(tmp_path: Path) -> None:
    plan = vulkan_plan()
    assert plan.environment.image is not None
    hadolint, shellcheck = shutil.which("hadolint"), shutil.which("shellcheck")
    assert hadolint and shellcheck, "hadolint and shellcheck are needed"
    (tmp_path / "Dockerfile").write_text(plan.environment.image.dockerfile, encoding="utf-8")
    (tmp_path / "build.sh").write_text(plan.script.text, encoding="utf-8")
    for command in ([hadolint, "--no-color", "Dockerfile"], [shellcheck, "build.sh"]):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_recipe_or_the_user_names_another_base_and_arch_is_refused() -> None:
    recipe = load_recipe("default")
    named = recipe.model_copy(update={"images": {**recipe.images, "vulkan": ImageRef(tag="debian:sid")}})
    image = plan_build(named, BuildOptions(backend="vulkan", no_patches=True)).environment.image
    assert image is not None and image.base.tag == "debian:sid"
    image = vulkan_plan(base_image="ubuntu:24.04").environment.image
    assert image is not None and image.base.tag == "ubuntu:24.04"
    with pytest.raises(InvalidOption, match="--arch only applies to CUDA builds"):
        vulkan_plan(cuda_architectures=("86",))


def test_the_runtime_image_installs_the_vulkan_loader_and_mesa(tmp_path: Path) -> None:
    manifest, build = fake_build(tmp_path, backend="vulkan")
    loader = FakeLdd("\tlibvulkan.so.1 => not found\n")  # this machine need not have the loader
    plan = plan_runtime_image(manifest, build, "llamaforge/debian:trixie", "sha256:" + "e" * 64, loader)
    assert plan.packages == ("curl", "libgomp1", "libvulkan1", "mesa-vulkan-drivers")
    assert "grep -v -F" not in plan.dockerfile  # the image's own ldd check finds the loader it installed
    manifest["backend"] = "cpu"
    with pytest.raises(ImageError, match=r"libvulkan\.so\.1"):
        plan_runtime_image(manifest, build, "b", "i", loader)


def test_a_vulkan_container_gets_dev_dri_from_docker_and_compose() -> None:
    image = replace(IMAGE, devices=("/dev/dri",))
    text = render_container(spec(), Layout("lab"), image)
    assert "  --device=/dev/dri \\\n" in text and "--gpus" not in text
    assert "--device" not in render_container(spec(), Layout("lab"), IMAGE)
    vulkan = ManifestInputs(name="lab", image=CPU.image, backend="vulkan")
    assert (vulkan.gpus, vulkan.devices) == (0, ("/dev/dri",))
    service = yaml.safe_load(render_compose(SPEC, vulkan))["services"]["llama-server"]
    assert service["devices"] == ["/dev/dri"] and "deploy" not in service
    assert "devices" not in yaml.safe_load(render_compose(SPEC, CPU))["services"]["llama-server"]
    assert ContainerImage("i", "t").devices == ()


@pytest.mark.docker
def test_a_missing_suite_base_image_names_the_bootstrap_that_makes_it() -> None:
    """A builder on a llamaforge base image of another suite (trixie for Vulkan) that this engine lacks: the error
    names the one `images.bootstrap` call, suite and tag included, that makes it."""
    from llamaforge.build.executors import make_executor

    tag = "llamaforge/debian:nosuite-of-this-test"
    plan = vulkan_plan(base_image=tag)
    with pytest.raises(ImageError) as raised:
        make_executor("docker").prepare_environment(plan, lambda event: None)
    assert f"base image {tag} is not available" in str(raised.value)
    assert raised.value.hint is not None
    assert f"invoke images.bootstrap --suite nosuite-of-this-test --tag {tag}" in raised.value.hint
