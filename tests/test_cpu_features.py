"""Smoke's CPU diagnosis on captured real text: llama-server's system_info lines (a baseline build of b11312 and
the default variants build, both run on this project's 2-core AMD EPYC machine), llama-bench's load_backend line
and that machine's /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.smoke.cpu_features import (
    build_cpu_level,
    diagnose,
    diagnosis_line,
    host_cpu_flags,
    loaded_variant,
    system_info_features,
)

pytestmark = pytest.mark.quick

DATA = Path(__file__).parent / "data"
HOST = host_cpu_flags((DATA / "cpuinfo-x86-avx2.txt").read_text(encoding="utf-8"))
BASELINE = (DATA / "system-info-baseline.log").read_text(encoding="utf-8")
VARIANTS = (DATA / "system-info-variants.log").read_text(encoding="utf-8")
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 asimdhp asimddp\n"


def test_host_flags_come_from_cpuinfo() -> None:
    assert {"avx2", "fma", "f16c", "bmi2", "pni", "ssse3"} <= HOST and "avx512f" not in HOST
    assert {"asimd", "asimdhp", "asimddp"} <= host_cpu_flags(ARM_CPUINFO)
    assert host_cpu_flags("") == set()


def test_system_info_lines_are_parsed() -> None:
    assert system_info_features(BASELINE) == {"LLAMAFILE", "OPENMP", "REPACK"}
    used = system_info_features(VARIANTS)
    assert used is not None and {"AVX2", "FMA", "F16C", "BMI2", "SSE3"} <= used
    assert system_info_features("no such line") is None


def test_loaded_variant_is_read_from_the_load_backend_line() -> None:
    module, variant = loaded_variant(VARIANTS)
    assert module is not None and module.endswith("libggml-cpu-haswell.so") and variant == "haswell"
    assert loaded_variant("load_backend: loaded CPU backend from /opt/x/bin/libggml-cpu.so\n")[1] is None
    assert loaded_variant(BASELINE) == (None, None)


def test_baseline_build_is_a_warning_naming_cause_and_fix() -> None:
    manifest = {"cpu": "baseline"}
    result = diagnose([BASELINE], HOST, manifest)
    assert {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"} <= set(result["unused"])
    assert "AVX2" in result["warning"] and "'baseline'" in result["cause"]
    assert 'cpu = "variants"' in result["fix"] and "--cpu native" in result["fix"]
    line = diagnosis_line(result)
    assert line is not None and line.startswith("warning: the build leaves") and "fix:" in line


def test_an_old_static_build_is_recognised_as_baseline() -> None:
    manifest = {"cmake_args": ["-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF"]}
    assert build_cpu_level(manifest) is None
    result = diagnose([BASELINE], HOST, manifest)
    assert "x86-64 baseline" in result["cause"]


def test_the_variants_build_uses_what_this_host_has() -> None:
    result = diagnose([VARIANTS], HOST, {"cpu": "variants"})
    assert result["warning"] is None and result["unused"] == []
    assert result["variant"] == "haswell" and result["source"] == "system_info"
    line = diagnosis_line(result)
    assert line is not None and "variant haswell" in line and "AVX2" in line


def test_bench_log_alone_gives_the_variant_features() -> None:
    bench_log = next(line for line in VARIANTS.splitlines() if "load_backend: loaded CPU" in line)
    result = diagnose([bench_log], HOST, {"cpu": "variants"})
    assert result["source"] == "the features of ggml's haswell variant" and result["warning"] is None


def test_a_missing_variant_module_is_named_as_the_cause() -> None:
    result = diagnose([BASELINE], HOST, {"cpu": "variants"})
    assert result["warning"] and "libggml-cpu-*.so" in result["fix"]


def test_nothing_to_compare_is_a_note_not_a_warning() -> None:
    result = diagnose(["llama-server listening"], HOST, {})
    assert result["warning"] is None and result["note"].startswith("not checked")
    assert diagnose([BASELINE], set(), {})["note"] == "not checked: no /proc/cpuinfo flags"
