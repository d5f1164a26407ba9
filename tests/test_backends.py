"""The backend seam: one registry, the names the CLI and MCP offer, and each backend's hooks as the planner,
the runtime image and the deploy targets read them."""

from __future__ import annotations

from typing import get_args

import pytest

from llamaforge.backends import BACKENDS, backend_devices, backend_names, get_backend
from llamaforge.backends.base import Backend, Devices
from llamaforge.build.names import BackendName
from llamaforge.build.ops import BuildParams
from llamaforge.build.options import BuildOptions
from llamaforge.build.plan import plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption

pytestmark = pytest.mark.quick


def test_the_registry_the_recipe_names_and_the_build_parameter_list_the_same_backends() -> None:
    assert backend_names() == sorted(get_args(BackendName)) == ["cpu", "cuda", "metal", "vulkan"]
    assert all(get_backend(name).name == name for name in backend_names())
    schema = BuildParams.model_json_schema()["properties"]["backend"]
    offered = {value for choice in schema["anyOf"] for value in choice.get("enum", [])}
    assert offered == set(BACKENDS)


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(InvalidOption) as info:
        get_backend("rocm")
    assert "rocm" in info.value.message and "vulkan" in (info.value.hint or "")


def test_every_hook_has_a_default() -> None:
    class Plain(Backend):
        name = "cpu"

    plain = Plain()
    recipe = load_recipe("default")
    assert plain.cmake(()) == {} and plain.archs((), recipe) == ()
    assert plain.devices == Devices() and plain.devices.docker_args() == []
    assert plain.script_steps() == "" and plain.records() == () and plain.runtime_packages == ()
    with pytest.raises(InvalidOption, match="--arch only applies to CUDA builds"):
        plain.archs(("86",), recipe)


def test_devices_per_backend_as_docker_passes_them() -> None:
    assert backend_devices("cpu").docker_args() == []
    assert backend_devices("cuda").docker_args() == ["--gpus", "all"] and backend_devices("cuda").gpus == 1
    assert backend_devices("vulkan").docker_args() == ["--device=/dev/dri"]
    assert backend_devices(None) == backend_devices("from-another-tool") == Devices()


@pytest.mark.parametrize(
    ("platform", "backend"),
    [("linux", "metal"), ("windows", "vulkan"), ("windows", "metal"), ("macos", "cuda"), ("macos", "vulkan")],
)
def test_a_platform_refuses_the_backends_that_do_not_list_it(platform: str, backend: str) -> None:
    options = BuildOptions(platform=platform, backend=backend, no_patches=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption) as info:
        plan_build(load_recipe("default"), options)
    assert repr(backend) in info.value.message and "cannot be built for" in info.value.message
