"""Does the build use the CPU it runs on? The CPU features the binaries use against the host's.

What the binaries use comes from llama.cpp's own words: the ``system_info`` line llama-server logs
(``CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | …``: the features ggml-cpu was compiled with), or, when only llama-bench
ran, the CPU variant it loaded (``load_backend: loaded CPU backend from …/libggml-cpu-haswell.so``) and that
variant's features from ggml's table. What the host has comes from ``/proc/cpuinfo``. A feature the host has and
the build leaves unused is a warning that names the cause (the build's CPU level) and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from llamaforge.core.exits import cpu_variant, loaded_backend_path
from llamaforge.runners.process import LOCAL, ProcessRunner

# ggml's system_info feature name -> the /proc/cpuinfo flag of the same instructions (x86 and arm64).
HOST_FLAGS: dict[str, str] = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
    "NEON": "asimd",
    "FP16_VA": "asimdhp",
    "DOTPROD": "asimddp",
    "MATMUL_INT8": "i8mm",
    "SVE": "sve",
    "SME": "sme",
}

_SSE = ("SSE3", "SSSE3")  # what ggml reports for SSE4.2 builds (-msse4.2 implies both)
_HASWELL = (*_SSE, "AVX", "F16C", "FMA", "AVX2", "BMI2")
_SKYLAKEX = (*_HASWELL, "AVX512")
_ZEN4 = (*_SKYLAKEX, "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")
# The features (system_info names) of each CPU variant ggml builds (ggml/src/CMakeLists.txt, b11312).
VARIANT_FEATURES: dict[str, tuple[str, ...]] = {
    "x64": (),
    "sse42": _SSE,
    "sandybridge": (*_SSE, "AVX"),
    "ivybridge": (*_SSE, "AVX", "F16C"),
    "piledriver": (*_SSE, "AVX", "F16C", "FMA"),
    "haswell": _HASWELL,
    "skylakex": _SKYLAKEX,
    "cannonlake": (*_SKYLAKEX, "AVX512_VBMI"),
    "cascadelake": (*_SKYLAKEX, "AVX512_VNNI"),
    "icelake": (*_SKYLAKEX, "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": (*_SKYLAKEX, "AVX512_VNNI", "AVX512_BF16"),
    "zen4": _ZEN4,
    "alderlake": (*_HASWELL, "AVX_VNNI"),
    "sapphirerapids": (*_ZEN4, "AMX_INT8"),
    "armv8.0_1": ("NEON",),
    "armv8.2_1": ("NEON", "DOTPROD"),
    "armv8.2_2": ("NEON", "DOTPROD", "FP16_VA"),
    "armv8.2_3": ("NEON", "DOTPROD", "FP16_VA", "SVE"),
    "armv8.6_1": ("NEON", "DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8"),
    "armv8.6_2": ("NEON", "DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8"),
    "armv9.2_1": ("NEON", "DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8", "SME"),
    "armv9.2_2": ("NEON", "DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8", "SME"),
}

_SYSTEM_INFO_CPU = re.compile(r"\bCPU : ((?:[A-Z0-9_]+ = [^|]*\|\s*)+)")


def host_cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU flags of ``/proc/cpuinfo`` text (``flags`` on x86, ``Features`` on arm64; the first CPU's)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def host_cpu(cpuinfo: str) -> tuple[str, list[str]]:
    """The CPU's model name (``unknown`` when /proc/cpuinfo names none) and its features, in ggml's
    ``system_info`` names, from ``/proc/cpuinfo`` text."""
    model = next(
        (
            line.partition(":")[2].strip()
            for line in cpuinfo.splitlines()
            if line.partition(":")[0].strip() in ("model name", "Model")
        ),
        "",
    )
    flags = host_cpu_flags(cpuinfo)
    return model or "unknown", [name for name, flag in HOST_FLAGS.items() if flag in flags]


def read_host_flags(runner: ProcessRunner = LOCAL) -> set[str]:
    """The CPU flags of the host ``runner`` runs on."""
    result = runner.run(["cat", "/proc/cpuinfo"], warn=True)
    return host_cpu_flags(result.stdout)


def system_info_features(log: str) -> set[str] | None:
    """The CPU features of the last ``system_info`` line in a llama.cpp log (``FEATURE = 1``), or None."""
    matches = _SYSTEM_INFO_CPU.findall(log)
    if not matches:
        return None
    pairs = (item.split("=", 1) for item in matches[-1].split("|") if "=" in item)
    return {name.strip() for name, value in pairs if value.strip() not in ("", "0")}


def loaded_variant(log: str) -> tuple[str | None, str | None]:
    """The CPU backend module a log says ggml loaded (its path) and that module's variant (None: no module,
    or the single ``libggml-cpu.so``)."""
    path = loaded_backend_path(log.splitlines())
    return path, cpu_variant(path) if path else None


def _cause_and_fix(level: str | None, variant: str | None, unused: list[str]) -> tuple[str, str]:
    names = ", ".join(unused)
    if level == "variants":
        if variant is None:
            return (
                f"this is a variants build, but no CPU variant module with {names} was loaded",
                "keep every libggml-cpu-*.so beside the binaries (a release or image must copy the whole bin/)",
            )
        return (
            f"the best CPU variant ggml has for this host ({variant}) lacks {names}",
            "build with --cpu native on this host for every feature it has",
        )
    if level == "native":
        return (
            f"the build is native to the machine that built it, which lacks {names}",
            'rebuild on this host, or build the default cpu = "variants" to pick the best code at run time',
        )
    described = f"CPU level {level!r}" if level else "the x86-64 baseline (an older build: no variants)"
    return (
        f"ggml-cpu was compiled for {described}, without {names}",
        'rebuild with the default cpu = "variants" (or --cpu native for this host only)',
    )


def build_cpu_level(manifest: Mapping[str, Any]) -> str | None:
    """The CPU level a build was made for: the manifest's ``cpu``, or read from the cmake arguments of builds
    older than that field (None when they name no level: the baseline)."""
    if manifest.get("cpu"):
        return str(manifest["cpu"])
    args = set(manifest.get("cmake_args") or ())
    if "-DGGML_CPU_ALL_VARIANTS=ON" in args:
        return "variants"
    if "-DGGML_NATIVE=ON" in args:
        return "native"
    return None


def diagnose(logs: Iterable[str], host_flags: set[str], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the CPU features the build uses (from llama.cpp ``logs``: the server log's system_info, or the
    variant llama-bench loaded) with the host's; ``warning`` is set when the build leaves some unused."""
    text = "\n".join(logs)
    used = system_info_features(text)
    module, variant = loaded_variant(text)
    source = "system_info"
    if used is None and variant in VARIANT_FEATURES:
        used, source = set(VARIANT_FEATURES[variant]), f"the features of ggml's {variant} variant"
    level = build_cpu_level(manifest)
    result: dict[str, Any] = {
        "build_cpu_level": level,
        "loaded_module": module,
        "variant": variant,
        "used": None,
        "host": sorted(feature for feature, flag in HOST_FLAGS.items() if flag in host_flags),
        "unused": [],
        "source": None,
        "warning": None,
        "cause": None,
        "fix": None,
    }
    if used is None or not host_flags:
        result["note"] = "not checked: " + (
            "no system_info line or loaded CPU variant in the logs"
            if used is None
            else "no /proc/cpuinfo flags"
        )
        return result
    unused = [feature for feature in result["host"] if feature not in used]
    if "AVX512_VNNI" in used and "AVX_VNNI" in unused:  # the AVX-512 form of the same instructions
        unused.remove("AVX_VNNI")
    result.update(used=[name for name in HOST_FLAGS if name in used], unused=unused, source=source)
    if unused:
        cause, fix = _cause_and_fix(level, variant, unused)
        result.update(
            warning=f"the build leaves {', '.join(unused)} unused on this host", cause=cause, fix=fix
        )
    return result


def diagnosis_line(diagnosis: Mapping[str, Any] | None) -> str | None:
    """One line for the roofline figure: the warning with its cause and fix, or what the build uses."""
    if not diagnosis:
        return None
    if diagnosis.get("warning"):
        return f"warning: {diagnosis['warning']}: {diagnosis['cause']}; fix: {diagnosis['fix']}"
    if diagnosis.get("used") is not None:
        via = f" (variant {diagnosis['variant']})" if diagnosis.get("variant") else ""
        return f"CPU features: the build uses every one this host has{via}: {', '.join(diagnosis['used'])}"
    return str(diagnosis.get("note") or "") or None
