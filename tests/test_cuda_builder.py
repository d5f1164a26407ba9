"""CUDA builds with no registry: the builder image made from the local Debian base plus NVIDIA's toolkit wheels
from PyPI, and the device-code check every CUDA build runs.

The image is built for real (apt + pip inside `docker build`; behind this network's TLS-intercepting proxy with the
CA bundle the machine's PIP_CERT / SSL_CERT_FILE / pip config names, which `invoke build --arch 86` picks up). In
it, llama.cpp is configured with exactly the plan's cmake arguments — nothing added, so the image alone must make
the toolkit findable — and a few ggml-cuda translation units are compiled for `--arch 86`; the build script's own
device-code listing runs over them and the product's check reads it. A whole CUDA build takes far longer on 2
cores (see `nox -s cuda_build`); no GPU runs anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.backends.cuda.device_code import LISTING, check_device_code, expected, parse_listing, problems
from llamaforge.backends.cuda.unit_probe import probe_units
from llamaforge.build.ops import BuildParams, _plan_from_params
from llamaforge.core.errors import BuildFailed

pytestmark = pytest.mark.quick

UNITS = ("fill.cu", "arange.cu")

# build.sh's listing for a fill.cu object built with CMAKE_CUDA_ARCHITECTURES=86 and a file without device code
# (the cuobjdump lines exactly as the image's cuobjdump 13.2 printed them in the docker test below).
LISTING_86 = """== bin/fill.cu.o
ELF file    1: fill.cu.1.sm_86.cubin
PTX file    1: fill.cu.1.sm_86.ptx
== bin/llama-server
"""


def test_requested_entries_mean_sass_and_ptx_as_cmake_does() -> None:
    assert expected(["86"]) == ({"sm_86"}, {"sm_86"})
    assert expected(["86-real", "89-virtual", "120a-real"]) == ({"sm_86", "sm_120a"}, {"sm_89"})


def test_listing_is_read_per_artifact() -> None:
    code = parse_listing(LISTING_86)
    assert code == {
        "bin/fill.cu.o": {"sass": ["sm_86"], "ptx": ["sm_86"]},
        "bin/llama-server": {"sass": [], "ptx": []},
    }
    assert problems(code, ["86"]) == []


def test_a_missing_or_unrequested_arch_is_named() -> None:
    code = parse_listing(LISTING_86)
    found = problems(code, ["86", "89"])
    assert "SASS for sm_89 was asked for but no artifact carries it" in found
    assert "PTX for sm_89 was asked for but no artifact carries it" in found
    assert problems(code, ["86-virtual"]) == ["bin/fill.cu.o carries SASS for sm_86, which nobody asked for"]
    assert problems({}, ["86"]) == ["no artifact carries CUDA device code"]


def test_a_build_whose_device_code_does_not_match_fails_before_publishing(tmp_path: Path) -> None:
    (tmp_path / LISTING).write_text(LISTING_86)
    assert check_device_code(tmp_path, ["86"])["bin/fill.cu.o"]["sass"] == ["sm_86"]
    with pytest.raises(BuildFailed, match="does not match --arch 89"):
        check_device_code(tmp_path, ["89"])
    (tmp_path / LISTING).unlink()
    with pytest.raises(BuildFailed, match=r"wrote no cuda-device-code\.txt"):
        check_device_code(tmp_path, ["86"])


@pytest.mark.docker
@pytest.mark.llamacpp
def test_the_wheel_builder_image_compiles_ggml_cuda_for_the_requested_arch_only(
    source_tree: Path, tmp_path: Path
) -> None:
    from llamaforge.build.executors import make_executor

    plan, _ = _plan_from_params(BuildParams(arch="86"))  # as `invoke build --arch 86` plans it
    assert (
        plan.environment.image is not None and plan.environment.image.base.tag == "llamaforge/debian:bookworm"
    )
    out = tmp_path / "out"
    # prepare_environment runs docker build: apt, then the toolkit wheels from PyPI
    probe_units(plan, UNITS, source_tree, out, make_executor("docker"))
    assert "cuda_13.0" in (out / "nvcc.txt").read_text(), "the toolkit of the recipe's [cuda] release"
    code = check_device_code(out, plan.cuda_architectures)
    for unit in UNITS:
        assert code[f"bin/{unit}.o"] == {"sass": ["sm_86"], "ptx": ["sm_86"]}, code
    with pytest.raises(BuildFailed, match="sm_89"):
        check_device_code(out, ["86", "89"])
