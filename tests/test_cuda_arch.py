"""The plan's CMAKE_CUDA_ARCHITECTURES yields exactly the SASS and PTX it names, by cuobjdump on one unit.

Needs nvcc with cuBLAS and cuobjdump (`.ci/cuda-toolkit.sh` installs what a wheel toolkit lacks; export what
it prints), cmake and ninja, and LLAMAFORGE_TEST_SOURCE pointing at an extracted llama.cpp tree (e.g. the
vendor/llama.cpp directory of the llama-cpp-python 0.3.36 sdist, which is b11312). No GPU is used. Each arch
list costs one configure (~5 s) and one unit compile (~5 s per arch on one core); results are shared per
session.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import require
from llamaforge.backends.cuda.probe import CudaProbeResult, compile_cuda_probe, find_cuda_toolkit
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe

pytestmark = pytest.mark.cuda_toolkit

SOURCE_ENV = "LLAMAFORGE_TEST_SOURCE"

# What the probe may add on its own: the toolkit's location, never a build option.
TOOLKIT_ARG = re.compile(
    r"-D(CMAKE_CUDA_COMPILER|CUDAToolkit_ROOT|CUDA_CUDART|CUDA_(cudart|cublas|cublasLt|cuda_driver)_LIBRARY"
    r"|CMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES)="
)

Probe = Callable[[str], CudaProbeResult]


def plan_args(archs: str) -> list[str]:
    """Return the cmake arguments llamaforge's plan gives the default recipe for ``--arch archs``."""
    return list(plan_build(load_recipe("default"), BuildOptions(cuda_architectures=(archs,))).cmake_args)


@pytest.fixture(scope="session")
def llama_source() -> Path:
    """The llama.cpp tree named by $LLAMAFORGE_TEST_SOURCE, or skip."""
    value = os.environ.get(SOURCE_ENV, "")
    require(bool(value), f"{SOURCE_ENV} is not set: point it at an extracted llama.cpp source tree (b11312)")
    source = Path(value)
    require(
        (source / "ggml" / "src" / "ggml-cuda" / "CMakeLists.txt").is_file(),
        f"{SOURCE_ENV}={value} is not a llama.cpp tree (no ggml/src/ggml-cuda/CMakeLists.txt)",
    )
    return source


@pytest.fixture(scope="session")
def toolkit_ready() -> None:
    """Skip unless nvcc, cuBLAS, cuobjdump, cmake and ninja are all there."""
    toolkit = find_cuda_toolkit()
    require(
        toolkit is not None, "no nvcc (CUDACXX, CUDA_HOME, PATH): run .ci/cuda-toolkit.sh, export its output"
    )
    assert toolkit is not None
    gaps = toolkit.missing()
    require(not gaps, f"CUDA toolkit {toolkit.version} lacks {'; '.join(gaps)}: run .ci/cuda-toolkit.sh")
    for tool in ("cmake", "ninja"):
        require(shutil.which(tool) is not None, f"{tool} is not on PATH")


@pytest.fixture(scope="session")
def probe(llama_source: Path, toolkit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Probe:
    """Compile the default unit once per arch list, in its own configure dir, for the whole session."""
    results: dict[str, CudaProbeResult] = {}

    def run(archs: str) -> CudaProbeResult:
        if archs not in results:
            work_dir = tmp_path_factory.mktemp("cuda-" + re.sub(r"[^0-9a-z-]+", "_", archs))
            result = compile_cuda_probe(llama_source, plan_args(archs), work_dir)
            seconds = (
                f"configure {result.configure_seconds or 0.0:.1f}s compile {result.compile_seconds:.1f}s"
            )
            print(f"\n[{archs}] {seconds}\n  {result.nvcc_command}\n  " + "\n  ".join(result.cuobjdump_lines))
            results[archs] = result
        return results[archs]

    return run


@pytest.mark.parametrize(
    ("archs", "elf", "ptx"),
    [
        # A bare number is SASS plus PTX for that arch (CMake: code=[compute_86,sm_86]).
        ("86", ("sm_86",), ("sm_86",)),
        ("86-real", ("sm_86",), ()),
        ("86;89", ("sm_86", "sm_89"), ("sm_86", "sm_89")),
        ("89-virtual", (), ("sm_89",)),
    ],
)
def test_object_carries_exactly_the_requested_archs(
    probe: Probe, archs: str, elf: tuple[str, ...], ptx: tuple[str, ...]
) -> None:
    result = probe(archs)
    assert result.elf_archs == elf, result.cuobjdump_lines
    assert result.ptx_archs == ptx, result.cuobjdump_lines


def test_nvcc_command_generates_code_only_for_the_list(probe: Probe) -> None:
    result = probe("86;89")
    assert "nvcc" in result.nvcc_command
    assert re.findall(r"--generate-code=arch=compute_(\d+),code=\[([^\]]*)\]", result.nvcc_command) == [
        ("86", "compute_86,sm_86"),
        ("89", "compute_89,sm_89"),
    ]
    assert re.findall(r"--generate-code=\S+", probe("89-virtual").nvcc_command) == [
        "--generate-code=arch=compute_89,code=[compute_89]"
    ]


def test_cmake_gets_the_plan_args_verbatim_plus_only_the_toolkit_location(probe: Probe) -> None:
    result = probe("86;89")
    assert result.cmake_args == tuple(plan_args("86;89"))
    assert result.toolkit_args, "the toolkit location is recorded"
    assert all(TOOLKIT_ARG.match(arg) for arg in result.toolkit_args), result.toolkit_args
    cache = (result.build_dir / "CMakeCache.txt").read_text()
    assert re.search(r"^CMAKE_CUDA_ARCHITECTURES:\w+=86;89$", cache, re.MULTILINE)
    assert re.search(r"^LLAMA_BUILD_COMMIT:\w+=0c1e570$", cache, re.MULTILINE)
    assert re.search(r"^GGML_CUDA:\w+=ON$", cache, re.MULTILINE)


def test_same_args_reuse_the_configure(probe: Probe, llama_source: Path) -> None:
    first = probe("86")
    again = compile_cuda_probe(llama_source, plan_args("86"), first.build_dir.parent)
    assert again.configure_seconds is None
    assert again.elf_archs == first.elf_archs
    with pytest.raises(ValueError, match=r"no unit 'no-such-unit\.cu'"):
        compile_cuda_probe(llama_source, plan_args("86"), first.build_dir.parent, unit="no-such-unit.cu")


def test_other_generators_are_refused(toolkit_ready: None, llama_source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unix Makefiles"):
        compile_cuda_probe(llama_source, ["-G", "Unix Makefiles", *plan_args("86")[2:]], tmp_path)
