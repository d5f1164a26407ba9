"""The units' sandbox: ``systemd-analyze security --offline=yes`` rates every rendered unit (llama-server on CPU and
CUDA, on loopback and beyond it, as an RPC head, and the RPC worker on CPU and CUDA) "OK" (4.9 or less) and each
passes ``systemd-analyze verify``. On a test host, preparing a deployment creates its directories and never
re-owns one that is there already. The hardened units start and serve in test_deploy_ssh.py and
test_deploy_rpc.py (the probe runs llama-bench in the same sandbox through systemd-run)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from llamaforge.deploy.release import Layout, ReleaseSpec
from llamaforge.deploy.targets.rpc_server import RpcServerTarget
from llamaforge.deploy.targets.systemd import RootNotOwned, SystemdTarget, render_unit
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.serve.launcher import LlamaFlags
from testhosts import USER, TestHost, write_known_hosts

pytestmark = pytest.mark.quick

OK = 4.9  # systemd-analyze's highest "OK" exposure
SPEC = ReleaseSpec(
    build_key="0c746799120471183e5949a10bb9dc1e",
    build_dir=Path("/nowhere"),
    manifest_sha256="a" * 64,
    model=Path("/m.gguf"),
    model_sha256="b" * 64,
    model_size=1000,
    flags=LlamaFlags(ctx=512, threads=2),
    port=8081,
)
HEAD = replace(SPEC, flags=LlamaFlags(rpc=("10.0.0.2:50052", "10.0.0.3:50052")))
UNITS = {
    "cpu-loopback": lambda: render_unit(SPEC, Layout("lab")),
    "cpu-beyond-loopback": lambda: render_unit(replace(SPEC, listen="0.0.0.0"), Layout("lab")),
    "cuda-loopback": lambda: render_unit(replace(SPEC, backend="cuda"), Layout("lab")),
    "vulkan-beyond-loopback": lambda: render_unit(
        replace(SPEC, backend="vulkan", listen="10.0.0.5"), Layout("lab")
    ),
    "rpc-head": lambda: render_unit(HEAD, Layout("lab")),
    "rpc-worker-cpu": lambda: RpcServerTarget("10.0.0.2").service_files(SPEC, Layout("lab"))[
        "rpc-server.service"
    ],
    "rpc-worker-cuda": lambda: RpcServerTarget("10.0.0.2").service_files(
        replace(SPEC, backend="cuda"), Layout("lab")
    )["rpc-server.service"],
}


def analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze missing: apt-get install systemd"
    return found


def exposure(unit: Path) -> float:
    """The overall exposure ``systemd-analyze security --offline=yes`` gives the unit file."""
    result = subprocess.run(
        [analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        cwd=unit.parent,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1))


@pytest.mark.parametrize("kind", UNITS)
def test_every_unit_is_rated_ok_by_systemd_analyze_security(kind: str, tmp_path: Path) -> None:
    unit = tmp_path / "llamaforge-lab.service"
    unit.write_text(UNITS[kind](), encoding="utf-8")
    score = exposure(unit)
    print(f"\n{kind}: exposure {score}")
    assert score <= OK, f"{kind}: {score} is above {OK}"


def test_the_sandbox_opens_only_what_each_unit_needs() -> None:
    lines = {kind: UNITS[kind]().splitlines() for kind in UNITS}
    cpu, cuda = lines["cpu-loopback"], lines["cuda-loopback"]
    assert {
        "PrivateDevices=yes",
        "MemoryDenyWriteExecute=yes",
        "CapabilityBoundingSet=",
        "UMask=0077",
        "IPAddressDeny=any",
        "IPAddressAllow=localhost",
        "ProtectProc=invisible",
    } <= set(cpu)
    assert "DeviceAllow=char-nvidia* rw" in cuda and "DevicePolicy=closed" in cuda
    assert "PrivateDevices=yes" not in cuda and "MemoryDenyWriteExecute=yes" not in cuda  # CUDA's JIT
    assert not any(line.startswith("IPAddress") for line in lines["cpu-beyond-loopback"])
    head = [line for line in lines["rpc-head"] if line.startswith("IPAddressAllow=")]
    assert head == [
        "IPAddressAllow=localhost",
        "IPAddressAllow=10.0.0.2",
        "IPAddressAllow=10.0.0.3",
    ]  # its workers
    assert not any(line.startswith("IPAddress") for line in lines["rpc-worker-cpu"])  # its head reaches it


def test_a_score_above_ok_is_seen(tmp_path: Path) -> None:
    unit = tmp_path / "bare.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n", encoding="utf-8")
    assert exposure(unit) > OK  # the parse does read the score


@pytest.mark.parametrize("kind", UNITS)
def test_every_unit_passes_systemd_analyze_verify(kind: str, tmp_path: Path) -> None:
    # verify resolves ExecStart and the unit's dependencies inside --root: the binary and the system's units.
    layout = Layout("lab")
    root = tmp_path / "root"
    for program in ("llama-server", "ggml-rpc-server"):
        binary = root / layout.current.lstrip("/") / "bin" / program
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\n", encoding="utf-8")
        binary.chmod(0o755)
    shutil.copytree(Path("/lib/systemd/system"), root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/llamaforge-lab.service").write_text(UNITS[kind](), encoding="utf-8")
    result = subprocess.run(
        [analyze(), "verify", f"--root={root}", "/etc/systemd/system/llamaforge-lab.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# On a test host


@pytest.mark.docker
def test_preparing_creates_the_directories_and_never_reowns_one_that_is_there(
    test_hosts: list[TestHost], tmp_path: Path
) -> None:
    host = test_hosts[0]
    known = write_known_hosts(tmp_path / "known_hosts", test_hosts)
    base = f"/srv/lf-prepare-{tmp_path.name[-12:].lower().replace('_', '-')}"
    code, output = host.exec(
        [
            "sh",
            "-c",
            f"mkdir -p {base}/taken {base}/half && chown {USER} {base}/half && ln -s /etc {base}/link",
        ]
    )
    assert code == 0, output
    with SshProcessRunner(host.ssh_host(known), user_known_hosts=None) as runner:
        SystemdTarget().prepare(runner, Layout("fresh", base))
        for refused, words in (
            ("taken", "owned by root, not by the deploy user lf"),
            ("half", "releases"),
            ("link", "no directory"),
        ):
            if refused == "half":  # the deployment's own directory, but a subdirectory someone else made
                host.exec(["mkdir", f"{base}/half/releases"])
            with pytest.raises(RootNotOwned) as caught:
                SystemdTarget().prepare(runner, Layout(refused, base))
            assert runner.host.host in caught.value.message and f"{base}/{refused}" in caught.value.message
            assert words in caught.value.message, caught.value.message
        SystemdTarget().prepare(runner, Layout("fresh", base))  # its own directories: fine again
    _, owners = host.exec(
        [
            "stat",
            "-c",
            "%n %U",
            f"{base}/fresh",
            f"{base}/fresh/releases",
            f"{base}/fresh/models",
            f"{base}/taken",
            f"{base}/half/releases",
            "/etc",
        ]
    )
    assert owners.split("\n")[:6] == [
        f"{base}/fresh {USER}",
        f"{base}/fresh/releases {USER}",
        f"{base}/fresh/models {USER}",
        f"{base}/taken root",
        f"{base}/half/releases root",
        "/etc root",
    ]
    host.exec(["rm", "-rf", base])
