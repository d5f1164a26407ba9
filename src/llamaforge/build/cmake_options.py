"""Which ``-D`` options a recipe's ``[cmake]`` or ``--cmake`` may set.

A CMake variable can make the configure step or the build run a program, or load CMake code, of the caller's
choosing: a compiler or a launcher in front of it (``CMAKE_C_COMPILER_LAUNCHER=sh;-c;…``), a toolchain file or a
project include (``CMAKE_PROJECT_INCLUDE``), a module path, the tools CMake runs beside the compiler (``clang-tidy``,
``cpplint``, the archiver, the linker). The platform and the recipe's backend choose those, and the build key and
manifest record them; a user's option never does, whoever passes it (CLI, MCP, a matrix, a manifest). The list is of
names; compiler flags (``CMAKE_C_FLAGS``) pass as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

#: A CMake variable name.
CMAKE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_RUNS_CODE: Final = re.compile(
    r"""
    CMAKE_TOOLCHAIN_FILE
    | CMAKE_PROJECT_\w*INCLUDE\w*                    # CMAKE_PROJECT_INCLUDE(_BEFORE), CMAKE_PROJECT_<name>_INCLUDE
    | CMAKE_\w*COMPILER\w*                           # CMAKE_C_COMPILER, CMAKE_CXX_COMPILER_LAUNCHER, CMAKE_RC_COMPILER
    | CMAKE_\w*LAUNCHER                              # CMAKE_C_LINKER_LAUNCHER
    | CMAKE_\w*_(CLANG_TIDY|CPPLINT|CPPCHECK|INCLUDE_WHAT_YOU_USE|LINK_WHAT_YOU_USE)\w*
    | CMAKE_USER_MAKE_RULES_OVERRIDE\w* | CMAKE_MODULE_PATH | CMAKE_\w*LINKER\w*
    | CMAKE_(AR|RANLIB|NM|OBJCOPY|OBJDUMP|STRIP|ADDR2LINE|READELF|DLLTOOL|MT|MAKE_PROGRAM|CROSSCOMPILING_EMULATOR)
    """,
    re.VERBOSE | re.IGNORECASE,
)


def refused_cmake_keys(keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that are no CMake variable name, or that name a program or CMake code to run."""
    return sorted(key for key in keys if not CMAKE_NAME.fullmatch(key) or _RUNS_CODE.fullmatch(key))


def unnamed_cmake_keys(keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that are no CMake variable name (``A B``, ``GGML_RPC:BOOL``) and name no program
    either: a typing mistake, told apart from the options :func:`refused_cmake_keys` refuses for what they run."""
    # CMAKE_PROJECT_llama.cpp_INCLUDE or CMAKE_C_COMPILER:FILEPATH still name a program CMake runs
    return [
        key
        for key in keys
        if not CMAKE_NAME.fullmatch(key) and not _RUNS_CODE.fullmatch(re.sub(r"\W", "_", key))
    ]


_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def multiline_cmake_values(items: Iterable[tuple[str, object]]) -> list[str]:
    """The keys whose value holds a control character (a newline, a tab): such a value reaches the build
    script's and the manifest's one-option-a-line listings as several lines."""
    return sorted(key for key, value in items if isinstance(value, str) and _CONTROL.search(value))


CONTROL_HINT: Final = "give each -D value on one line, without tabs or other control characters"

REFUSED_HINT: Final = (
    "options that name a compiler, a launcher, a toolchain file, a project include or another program CMake "
    "runs are chosen by the platform and backend (--platform, --backend, --toolchain), not by -D options"
)

# ggml's GPU backends and their architectures: what --backend and --arch decide. Set by -D, a build planned as
# one backend would compile another (GGML_CUDA=ON in a cpu recipe plans "cpu" and builds CUDA).
_BACKEND_KEYS = frozenset(
    {
        "GGML_CUDA",
        "GGML_HIP",
        "GGML_VULKAN",
        "GGML_METAL",
        "GGML_SYCL",
        "GGML_OPENCL",
        "GGML_MUSA",
        "GGML_CANN",
        "GGML_WEBGPU",
        "CMAKE_CUDA_ARCHITECTURES",
        "CMAKE_HIP_ARCHITECTURES",
    }
)
BACKEND_HINT: Final = "the backend and its architectures come from backend / --backend and --arch"


def backend_cmake_keys(keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that choose ggml's backend or its GPU architectures."""
    return sorted(key for key in keys if key in _BACKEND_KEYS)
