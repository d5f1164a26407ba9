"""CPU levels: which instruction sets a build's CPU backend (ggml-cpu) is compiled for.

A recipe's ``cpu`` (or ``invoke build --cpu``) names one of:

* ``variants`` (the default): every CPU variant ggml knows for the build machine's architecture, each a
  dynamically loaded module (``libggml-cpu-<variant>.so``); at run time ggml loads the best one the host
  supports, like upstream's release builds. x86-64 builds 14 variants (x64 … sapphirerapids), Linux arm64 8
  (armv8.0_1 … armv9.2_2).
* ``native``: the build machine's own CPU (``GGML_NATIVE=ON``, ``-march=native``): fast there, may crash with
  "illegal instruction" on an older CPU.

A one-level build has one module, ``libggml-cpu.so``; ``native`` links ggml-cpu into libggml instead
(``GGML_BACKEND_DL=OFF``: ggml refuses ``GGML_NATIVE`` with the backend loader on x86). The shared libraries and
RPATH stay as in the variants build.

Each turns into CMake options (``cpu_cmake``); a recipe's ``[cmake]`` or ``--cmake`` must not set them itself.
"""

from __future__ import annotations

import re

from llamaforge.core.validation import suggest

VARIANTS = "variants"
NATIVE = "native"
BASELINE = "baseline"

# ggml's x86 feature options (ggml/CMakeLists.txt); ggml_add_cpu_backend_variant turns the same list off
# before it switches a variant's features on.
X86_FEATURES = (
    "SSE42",
    "AVX",
    "AVX2",
    "BMI2",
    "AVX_VNNI",
    "FMA",
    "F16C",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_TILE",
    "AMX_INT8",
    "AMX_BF16",
)
_V2 = ("SSE42",)
_V3 = (*_V2, "AVX", "AVX2", "BMI2", "FMA", "F16C")
# The psABI micro-architecture levels, in ggml's feature names (x86-64-v4 adds AVX-512 F/BW/CD/DQ/VL: AVX512).
X86_LEVELS: dict[str, tuple[str, ...]] = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": (*_V3, "AVX512")}
_ARM_ARCH = re.compile(r"^armv[0-9]+(\.[0-9]+)?-a(\+[a-z0-9]+)*$")

LEVELS = (VARIANTS, NATIVE, BASELINE, *X86_LEVELS)
"""The named levels (an ``armv…`` architecture is accepted besides these)."""

# Every CMake option a CPU level decides: set by cpu_cmake, refused in [cmake] and --cmake.
CONTROLLED = frozenset(
    {
        "GGML_NATIVE",
        "GGML_CPU_ALL_VARIANTS",
        "GGML_BACKEND_DL",
        "GGML_CPU_ARM_ARCH",
        *(f"GGML_{name}" for name in X86_FEATURES),
    }
)


def check_cpu_level(value: str) -> str:
    """``value`` when it names a CPU level; otherwise a ValueError with "did you mean" and the known levels."""
    if value in LEVELS or _ARM_ARCH.match(value):
        return value
    close = suggest(value, LEVELS, end=" ")
    raise ValueError(
        f"unknown CPU level {value!r}; {close}known: {', '.join(LEVELS)}, or an arm64 architecture "
        "such as armv8.2-a+dotprod"
    )


def cpu_architecture(level: str) -> str | None:
    """The machine architecture a level is for (``x86_64``, ``aarch64``), or None when it fits any."""
    if level in X86_LEVELS:
        return "x86_64"
    if level.startswith("armv"):
        return "aarch64"
    return None


def is_multi_variant(level: str) -> bool:
    """True when the build carries several CPU variants and picks one at run time."""
    return level == VARIANTS


def cpu_cmake(level: str, *, machine: str | None = None) -> dict[str, str]:
    """The CMake options that build ggml-cpu for ``level`` (a checked level); ``machine`` is the architecture
    the build is for when the platform fixes one (an arm64 build is given no x86 feature options)."""
    if level == VARIANTS:
        # The variants are modules ggml loads at run time: they need shared libraries and the backend loader.
        return {
            "GGML_NATIVE": "OFF",
            "GGML_CPU_ALL_VARIANTS": "ON",
            "GGML_BACKEND_DL": "ON",
            "BUILD_SHARED_LIBS": "ON",
        }
    # One module, libggml-cpu.so, loaded like the variants (the other compile flags stay those of the variants
    # build, so ccache serves them); native links ggml-cpu in: ggml refuses GGML_NATIVE with the loader on x86.
    options = {
        "GGML_CPU_ALL_VARIANTS": "OFF",
        "GGML_BACKEND_DL": "OFF" if level == NATIVE else "ON",
        "GGML_NATIVE": "ON" if level == NATIVE else "OFF",
    }
    if level.startswith("armv"):
        options["GGML_CPU_ARM_ARCH"] = level
    elif level != NATIVE and machine != "aarch64":
        # Every feature is set explicitly, so a level means the same whatever ggml's defaults become.
        enabled = X86_LEVELS.get(level, ())
        options.update({f"GGML_{name}": "ON" if name in enabled else "OFF" for name in X86_FEATURES})
    return options


def controlled_keys(cmake: dict[str, object] | tuple[tuple[str, str], ...]) -> list[str]:
    """The keys among ``cmake`` that a CPU level decides (which a recipe or --cmake must leave alone)."""
    keys = cmake if isinstance(cmake, dict) else dict(cmake)
    return sorted(key for key in keys if key in CONTROLLED)
