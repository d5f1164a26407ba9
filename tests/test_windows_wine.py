"""The Windows cross build for real: `invoke build --platform windows --cpu x86-64-v2` (mingw-w64 in Docker, one
CPU level so CI's cold build stays short), its manifest and PE files, and the .exe files run under Debian's wine
8.0 in a container of the local base image: llama-cli --version, llama-bench on the tiny model, and llama-server
answering /health on the container's loopback (the container has no network; nothing is published).

Real Windows never runs here: wine stands in for it."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke_json
from llamaforge.build.reproducible import pe_sections

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]

# The suite's cross build: the default recipe at one CPU level (`cpu = "variants"` would compile ggml-cpu 14
# times); the DLLs are the ones this build makes.
BUILD_ARGS = ("build", "--platform", "windows", "--cpu", "x86-64-v2")
EXES = ("llama-server.exe", "llama-bench.exe", "llama-cli.exe", "ggml-rpc-server.exe")
# ggml drops the lib prefix on Windows; llama's own libraries keep it.
DLLS = (
    "ggml.dll",
    "ggml-base.dll",
    "ggml-cpu.dll",
    "ggml-rpc.dll",
    "libllama.dll",
    "libllama-common.dll",
    "libmtmd.dll",
    "libllama-server-impl.dll",
    "libllama-bench-impl.dll",
    "libllama-cli-impl.dll",
)
MODEL = "/models/tiny-qwen3.gguf"


@pytest.fixture(scope="module")
def mingw_build(build_env: dict[str, str]) -> dict[str, Any]:
    """The published mingw build (built once, then a cache hit from LLAMAFORGE_TEST_HOME)."""
    build = invoke_json(*BUILD_ARGS, env=build_env)["build"]
    manifest = json.loads((Path(build["path"]) / "manifest.json").read_text(encoding="utf-8"))
    return {"path": Path(build["path"]), "manifest": manifest}


@pytest.fixture(scope="module")
def wine_image(base_image: str) -> str:
    """The wine image (Debian bookworm's wine on the local base image), built once."""
    from winehost import ensure_image

    return ensure_image(base_image)


def _run(
    client: Any, image: str, command: list[str], build: Path, model: Path | None = None, timeout: int = 300
) -> tuple[int, str]:
    """Run ``command`` in a fresh, network-less container of ``image`` with the build's bin/ (and the model)
    mounted read-only; the exit code and the output. The container is removed whatever happens.

    Docker's init is PID 1, not wine: wine starts wineboot, wineserver and services that outlive the program,
    and a wine process as PID 1 inherits them unreaped. Seen once: `wine llama-cli.exe --version` printed its
    version, then spun at exit beside a defunct wineboot.exe until the 300 s timeout."""
    volumes = {str(build / "bin"): {"bind": "/opt/build/bin", "mode": "ro"}}
    if model is not None:
        volumes[str(model)] = {"bind": MODEL, "mode": "ro"}
    container = client.containers.run(
        image, command, detach=True, init=True, network_mode="none", volumes=volumes
    )
    try:
        status = container.wait(timeout=timeout)
        return int(status["StatusCode"]), container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_manifest_lists_every_exe_and_dll_with_its_sha256(mingw_build: dict[str, Any]) -> None:
    manifest, path = mingw_build["manifest"], mingw_build["path"]
    assert manifest["recipe"]["platform"] == "windows" and manifest["platform_toolchain"] == "mingw"
    assert manifest["cpu"] == "x86-64-v2"
    assert "0002-ggml-cpu-mingw-thread-power-throttling.patch" in [p["name"] for p in manifest["patches"]]
    artifacts = manifest["artifacts"]
    for name in (*EXES, *DLLS):
        assert f"bin/{name}" in artifacts, sorted(artifacts)
    for relative, entry in artifacts.items():
        assert hashlib.sha256((path / relative).read_bytes()).hexdigest() == entry["sha256"], relative
    assert "x86_64-w64-mingw32-g++-posix" in manifest["toolchain"]["cxx"]
    assert "g++-mingw-w64-x86-64-posix=" in manifest["toolchain"]["packages"]


def test_pe_files_are_x86_64_without_a_link_time_stamp(mingw_build: dict[str, Any]) -> None:
    for relative in mingw_build["manifest"]["artifacts"]:
        data = (mingw_build["path"] / relative).read_bytes()
        assert pe_sections(data), f"{relative} is not a PE file"
        header = struct.unpack_from("<I", data, 0x3C)[0]
        machine, _, stamp = struct.unpack_from("<HHI", data, header + 4)
        assert machine == 0x8664, relative
        assert stamp == 0, f"{relative} carries a link time stamp ({stamp})"


def test_no_artifact_imports_a_mingw_runtime_dll(mingw_build: dict[str, Any], docker_engine: Any) -> None:
    """Read with the builder image's own objdump: only Windows' DLLs and the build's own are imported."""
    builder = mingw_build["manifest"]["image"]["builder_tag"]
    script = "for f in *.exe *.dll; do x86_64-w64-mingw32-objdump -p $f | awk -v f=$f '/DLL Name:/ {print f, $3}'; done"
    code, output = _run(
        docker_engine, builder, ["bash", "-c", f"cd /opt/build/bin && {script}"], mingw_build["path"]
    )
    assert code == 0, output
    imports = {tuple(line.split()) for line in output.splitlines() if line.strip()}
    assert ("libllama.dll", "ggml.dll") in imports and ("ggml.dll", "ggml-base.dll") in imports
    own = {Path(relative).name.lower() for relative in mingw_build["manifest"]["artifacts"]}
    foreign = {dll for _, dll in imports if dll.lower() not in own}
    assert not {
        dll for dll in foreign if dll.lower().startswith(("libgcc", "libstdc++", "libwinpthread", "libgomp"))
    }
    assert "KERNEL32.dll" in foreign, foreign


def test_llama_cli_version_runs_under_wine(
    mingw_build: dict[str, Any], wine_image: str, docker_engine: Any
) -> None:
    code, output = _run(
        docker_engine, wine_image, ["wine", "llama-cli.exe", "--version"], mingw_build["path"]
    )
    assert code == 0, output
    assert "build 11312, commit 0c1e570" in output, output
    assert "for Windows x86_64" in output, output  # CMAKE_SYSTEM_NAME / _PROCESSOR of the toolchain file


def test_llama_bench_runs_the_tiny_model_under_wine(
    mingw_build: dict[str, Any], wine_image: str, docker_engine: Any, tiny_qwen3: Path
) -> None:
    command = [
        "wine",
        "llama-bench.exe",
        "-m",
        f"Z:{MODEL}",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "2",
        "-o",
        "json",
    ]
    code, output = _run(docker_engine, wine_image, command, mingw_build["path"], tiny_qwen3)
    assert code == 0, output
    rows = json.loads(output[output.index("[") : output.rindex("]") + 1])
    assert {(row["n_prompt"], row["n_gen"]) for row in rows} == {(16, 0), (0, 4)}, rows
    assert all(row["avg_ts"] > 0 and row["build_number"] == 11312 for row in rows), rows
    assert all("qwen3" in row["model_type"] for row in rows), rows


def test_llama_server_answers_health_under_wine(
    mingw_build: dict[str, Any], wine_image: str, docker_engine: Any, tiny_qwen3: Path
) -> None:
    # The server listens on the container's loopback; curl asks it there (the container has no network at all).
    script = (
        f"wine llama-server.exe -m Z:{MODEL} --host 127.0.0.1 --port 8080 -t 2 > /tmp/server.log 2>&1 & "
        "for i in $(seq 120); do "
        '  if body=$(curl -fsS http://127.0.0.1:8080/health 2>/dev/null); then echo "health: $body"; exit 0; fi; '
        "  sleep 1; "
        "done; cat /tmp/server.log; exit 1"
    )
    code, output = _run(docker_engine, wine_image, ["bash", "-c", script], mingw_build["path"], tiny_qwen3)
    assert code == 0, output
    health = json.loads(output.split("health: ", 1)[1].splitlines()[0])
    assert health == {"status": "ok"}, output
