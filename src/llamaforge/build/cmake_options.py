"""Which ``-D`` options a recipe's ``[cmake]`` or ``--cmake`` may set: an allow-list.

A CMake variable can make the configure step or the build run a program, or load CMake code, of the caller's
choosing: a compiler or a launcher in front of it (``CMAKE_C_COMPILER_LAUNCHER=sh;-c;…``), a toolchain file or a
project include, a rule variable (``CMAKE_C_COMPILE_OBJECT``), a tool CMake runs beside the compiler, or compiler
flags that run one (``CMAKE_C_FLAGS=-wrapper …``, ``-fplugin=``, ``-B``, nvcc's ``-ccbin``). A deny-list of such
names always misses one, so only these pass: ggml's and llama.cpp's own options (``GGML_*``, ``LLAMA_*``) but
those that name a program, a toolchain, a directory or a file, and a few of CMake's own (build type, shared
libraries, RPATH, macOS targets, PIC, IPO). The platform and the recipe's backend choose compilers, tools and flags,
and the build key and manifest record them; a user's option never does, whoever passes it (CLI, MCP, a matrix, a
manifest). Values hold no whitespace or ``;`` (a CMake list: it becomes several compiler arguments), but where
CMake takes a list of names (``CMAKE_OSX_ARCHITECTURES``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

#: A CMake variable name.
CMAKE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: CMake's own variables that a recipe may set; none names a program, a file of CMake code or compiler flags.
CMAKE_ALLOWED: Final = frozenset(
    {
        "BUILD_SHARED_LIBS",
        "CMAKE_BUILD_TYPE",
        "CMAKE_BUILD_WITH_INSTALL_RPATH",
        "CMAKE_INSTALL_RPATH",
        "CMAKE_SKIP_RPATH",
        "CMAKE_OSX_ARCHITECTURES",
        "CMAKE_OSX_DEPLOYMENT_TARGET",
        "CMAKE_POSITION_INDEPENDENT_CODE",
        "CMAKE_INTERPROCEDURAL_OPTIMIZATION",
        "CMAKE_EXPORT_COMPILE_COMMANDS",
        "CMAKE_VERBOSE_MAKEFILE",
        # chosen by --backend and --arch: allowed as names so that their own refusal names the flag to use
        "CMAKE_CUDA_ARCHITECTURES",
        "CMAKE_HIP_ARCHITECTURES",
    }
)
_PROJECT_OPTION: Final = re.compile(r"(GGML|LLAMA)_[A-Z0-9_]+")
# Project options that name a program, a toolchain, a directory, a file or a remote to fetch from
# (GGML_VULKAN_SHADERS_GEN_TOOLCHAIN, GGML_OPENMP_ROOT, LLAMA_SOURCE_DIR, GGML_HEXAGON_HTP_CERT, LLAMA_UI_HF_BUCKET).
_PROJECT_NAMES_A_THING: Final = re.compile(
    r".*(TOOLCHAIN|COMPILER|LAUNCHER|EXECUTABLE|PROGRAM|_DIR|_ROOT|_PATH|_FILE|_CERT|_BUCKET|_URL)(_.*)?"
)
# CMake takes these as lists of names.
_LISTS: Final = frozenset({"CMAKE_OSX_ARCHITECTURES", "CMAKE_CUDA_ARCHITECTURES", "CMAKE_HIP_ARCHITECTURES"})
_UNSAFE_VALUE: Final = re.compile(r"[\s;]")
_UNSAFE_LIST_VALUE: Final = re.compile(r"\s")

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


def allowed_cmake_key(key: str) -> bool:
    """Whether ``key`` is on the allow-list (see the module docstring)."""
    if key in CMAKE_ALLOWED:
        return True
    return bool(_PROJECT_OPTION.fullmatch(key)) and not _PROJECT_NAMES_A_THING.fullmatch(key)


def refused_cmake_keys(keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that are not on the allow-list: no CMake variable name, or one that may name a
    program, CMake code, compiler flags or a path."""
    return sorted({key for key in keys if not CMAKE_NAME.fullmatch(key) or not allowed_cmake_key(key)})


def unsafe_cmake_values(items: Iterable[tuple[str, object]]) -> list[str]:
    """The keys whose value holds whitespace or a ``;`` (several compiler arguments once CMake splits it), but
    ``;`` in a list of names (``CMAKE_OSX_ARCHITECTURES=arm64;x86_64``)."""
    return sorted(
        key
        for key, value in items
        if isinstance(value, str) and (_UNSAFE_LIST_VALUE if key in _LISTS else _UNSAFE_VALUE).search(value)
    )


VALUE_HINT: Final = (
    "an option's value is one word (ON, Release, 13.3, armv8.2-a+dotprod): no spaces and no ';', which CMake "
    "would turn into several compiler arguments"
)


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
    "-D takes ggml's and llama.cpp's options (GGML_*, LLAMA_*) and CMAKE_BUILD_TYPE, BUILD_SHARED_LIBS, the "
    "RPATH and macOS target options; compilers, launchers, toolchain files, rule variables, compiler flags and "
    "paths are chosen by the platform, the backend and the CPU level (--platform, --backend, --toolchain, --cpu)"
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
