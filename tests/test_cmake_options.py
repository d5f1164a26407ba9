"""`[cmake]` and `--cmake` never name a program or CMake code to run: a compiler, a launcher in front of it, a
toolchain file, a project include, a module path or a tool CMake runs beside the compiler. Refused the same way
from a recipe, the CLI, a manifest and an MCP call, naming the option; ordinary options still plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from llamaforge.build.cmake_options import refused_cmake_keys, unnamed_cmake_keys
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption, RecipeError

pytestmark = pytest.mark.quick

REPO = Path(__file__).parents[1]
if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

from mcp_server import build_server  # noqa: E402

HOSTILE = [
    "CMAKE_C_COMPILER_LAUNCHER",
    "CMAKE_CXX_COMPILER_LAUNCHER",
    "CMAKE_CUDA_COMPILER_LAUNCHER",
    "CMAKE_C_LINKER_LAUNCHER",
    "CMAKE_C_COMPILER",
    "CMAKE_CXX_COMPILER",
    "CMAKE_TOOLCHAIN_FILE",
    "CMAKE_PROJECT_INCLUDE",
    "CMAKE_PROJECT_INCLUDE_BEFORE",
    "CMAKE_PROJECT_llama.cpp_INCLUDE",  # not even a CMake name
    "CMAKE_PROJECT_ggml_INCLUDE",
    "CMAKE_MODULE_PATH",
    "CMAKE_CXX_CLANG_TIDY",
    "CMAKE_C_CPPCHECK",
    "CMAKE_AR",
    "CMAKE_LINKER",
    "CMAKE_MAKE_PROGRAM",
    "CMAKE_USER_MAKE_RULES_OVERRIDE",
    "cmake_c_compiler_launcher",
    "GGML_RPC;X",
    "",
    # What the deny-list missed (issue 49): flags that run a program, rule variables, the link-what-you-use check,
    # and project options that name a toolchain or a directory CMake reads.
    "CMAKE_C_FLAGS",
    "CMAKE_CXX_FLAGS",
    "CMAKE_CUDA_FLAGS",
    "CMAKE_EXE_LINKER_FLAGS",
    "CMAKE_SHARED_LINKER_FLAGS",
    "CMAKE_C_COMPILE_OBJECT",
    "CMAKE_CXX_LINK_EXECUTABLE",
    "CMAKE_CXX_CREATE_SHARED_LIBRARY",
    "CMAKE_LINK_WHAT_YOU_USE_CHECK",
    "CMAKE_C_FLAGS_RELEASE",
    "CMAKE_CUDA_HOST_COMPILER",
    "CMAKE_INSTALL_PREFIX",
    "CMAKE_PREFIX_PATH",
    "GGML_VULKAN_SHADERS_GEN_TOOLCHAIN",
    "GGML_OPENMP_ROOT",
    "LLAMA_SOURCE_DIR",
    "LLAMA_UI_HF_BUCKET",
]
ALLOWED = [
    "GGML_VULKAN",
    "GGML_CCACHE",
    "LLAMA_CURL",
    "BUILD_SHARED_LIBS",
    "CMAKE_BUILD_TYPE",
    "CMAKE_INSTALL_RPATH",
    "CMAKE_BUILD_WITH_INSTALL_RPATH",
    "CMAKE_OSX_DEPLOYMENT_TARGET",
    "CMAKE_CUDA_ARCHITECTURES",
    "GGML_CPU_ARM_ARCH",
    "GGML_BLAS_VENDOR",
]


@pytest.mark.parametrize("key", HOSTILE)
def test_options_that_run_code_are_refused_by_the_plan(key: str) -> None:
    assert refused_cmake_keys([key]) == [key]
    with pytest.raises(InvalidOption) as caught:
        plan_build(load_recipe("default"), BuildOptions(cmake=((key, "sh;-c;touch /tmp/pwned"),)))
    if not unnamed_cmake_keys([key]):
        assert f"--cmake {key}" in caught.value.message and "--platform" in (caught.value.hint or "")
    else:  # no variable name at all: named as such, not as a program CMake would run
        assert caught.value.message == f"--cmake {key!r}: not a CMake variable name"


def test_ordinary_options_still_plan() -> None:
    assert refused_cmake_keys(ALLOWED) == []
    plan = plan_build(
        load_recipe("default"), BuildOptions(cmake=(("GGML_CCACHE", "OFF"), ("LLAMA_CURL", "OFF")))
    )
    assert "-DGGML_CCACHE=OFF" in plan.cmake_args and "-DLLAMA_CURL=OFF" in plan.cmake_args


def test_a_recipe_that_names_a_launcher_is_refused(tmp_path: Path) -> None:
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    text = source.read_text(encoding="utf-8").replace(
        "[cmake]\n", '[cmake]\nCMAKE_CXX_COMPILER_LAUNCHER = "sh;-c;id>/tmp/pwned"\n'
    )
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as caught:
        load_recipe(str(path))
    assert "CMAKE_CXX_COMPILER_LAUNCHER" in caught.value.message and "may not be set" in caught.value.message


def test_a_manifest_that_names_a_toolchain_file_is_refused(tmp_path: Path) -> None:
    manifest = {
        "recipe": load_recipe("default").model_dump(mode="json"),
        "options": {"cmake": [["CMAKE_TOOLCHAIN_FILE", "/tmp/evil.cmake"]]},
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "invoke", "build", "--from-manifest", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == InvalidOption.exit_code, out.stderr
    assert "CMAKE_TOOLCHAIN_FILE" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_an_mcp_call_with_a_launcher_is_a_tool_error_and_plans_nothing() -> None:
    async with Client(build_server()) as client:
        result = await client.call_tool(
            "build", {"cmake": ["CMAKE_C_COMPILER_LAUNCHER=sh;-c;id>/tmp/pwned"], "dry_run": True}
        )
    assert result.is_error
    text = "".join(getattr(part, "text", "") for part in result.content)
    assert "--cmake CMAKE_C_COMPILER_LAUNCHER" in text and "Traceback" not in text


@pytest.mark.parametrize("key", ["GGML_CUDA", "CMAKE_CUDA_ARCHITECTURES", "GGML_VULKAN", "GGML_METAL"])
def test_options_that_choose_the_backend_are_refused(key: str, tmp_path: Path) -> None:
    """Set by -D, a build planned as cpu would compile a GPU backend: the recipe and --cmake refuse them."""
    with pytest.raises(InvalidOption, match=f"--cmake {key}: not set by -D") as flag:
        plan_build(load_recipe("default"), BuildOptions(cmake=((key, "ON"),)))
    assert "--backend" in (flag.value.hint or "")
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    path = tmp_path / "r.toml"
    path.write_text(source.read_text(encoding="utf-8").replace("[cmake]\n", f"[cmake]\n{key} = true\n"))
    with pytest.raises(RecipeError, match=f"{key} may not be set in"):
        load_recipe(str(path))


@pytest.mark.parametrize("value", ["Release\n-DGGML_CUDA=ON", "Release\t", "a\rb"])
def test_a_value_with_a_control_character_is_refused(value: str, tmp_path: Path) -> None:
    """A newline in a value would reach the plan's and the script's one-option-a-line listings as two options."""
    with pytest.raises(InvalidOption, match="--cmake CMAKE_BUILD_TYPE: the value holds a control character"):
        plan_build(load_recipe("default"), BuildOptions(cmake=(("CMAKE_BUILD_TYPE", value),)))
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    path = tmp_path / "r.toml"
    path.write_text(
        source.read_text(encoding="utf-8").replace(
            "[cmake]\n", f"[cmake]\nGGML_BLAS_VENDOR = {json.dumps(value)}\n"
        )
    )
    with pytest.raises(RecipeError, match="GGML_BLAS_VENDOR holds a control character"):
        load_recipe(str(path))


@pytest.mark.parametrize(
    "value", ["armv8.2-a;-wrapper;sh,-c,id>/tmp/pwned", "armv8.2-a -fplugin=/tmp/evil.so", "x -B/tmp/evil"]
)
def test_a_value_of_several_words_is_refused(value: str, tmp_path: Path) -> None:
    """A ';' is a CMake list, which becomes several compiler arguments (`-wrapper sh,-c,…` runs a program);
    a space may too where a project pastes the value into a flags string."""
    with pytest.raises(InvalidOption, match="--cmake GGML_CPU_ARM_ARCH: the value is more than one word"):
        plan_build(load_recipe("default"), BuildOptions(cmake=(("GGML_CPU_ARM_ARCH", value),)))
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    path = tmp_path / "r.toml"
    path.write_text(
        source.read_text(encoding="utf-8").replace(
            "[cmake]\n", f"[cmake]\nGGML_CPU_ARM_ARCH = {json.dumps(value)}\n"
        )
    )
    with pytest.raises(RecipeError, match="GGML_CPU_ARM_ARCH: the value is more than one word"):
        load_recipe(str(path))


def test_a_list_of_names_keeps_its_semicolons() -> None:
    from llamaforge.build.cmake_options import unsafe_cmake_values

    assert unsafe_cmake_values([("CMAKE_OSX_ARCHITECTURES", "arm64;x86_64")]) == []
    assert unsafe_cmake_values([("CMAKE_OSX_ARCHITECTURES", "arm64 -B/tmp")]) == ["CMAKE_OSX_ARCHITECTURES"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "option",
    [
        "CMAKE_C_FLAGS=-wrapper sh,-c,id>/tmp/pwned",
        "CMAKE_CXX_LINK_EXECUTABLE=sh -c id",
        "CMAKE_LINK_WHAT_YOU_USE_CHECK=sh;-c;id",
        "CMAKE_C_COMPILE_OBJECT=sh -c id",
        "GGML_CPU_ARM_ARCH=armv8-a;-fplugin=/tmp/evil.so",
    ],
)
async def test_the_options_that_ran_code_are_refused_over_mcp(option: str) -> None:
    """Issue 49: 17 of 18 code-running options passed the deny-list from an MCP call, and the build ran them."""
    async with Client(build_server()) as client:
        result = await client.call_tool("build", {"cmake": [option], "dry_run": True})
    assert result.is_error
    text = "".join(getattr(part, "text", "") for part in result.content)
    assert f"--cmake {option.split('=', maxsplit=1)[0]}" in text and "Traceback" not in text
