"""Deploy over SSH: releases, the systemd unit, the health gate and the rolling loop.

Unit tests (no host) cover host parsing, batches, release ids and the unit (golden). The rest deploy the
suite's real CPU build and a tiny model to the systemd + sshd test hosts (tests/testhosts.py), reached only on
127.0.0.1, and query each host's llama-server through the SSH connection.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import unloadable_model
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.hosts.ops import DeployParams, DeployRollbackParams, HostsParams
from llamaforge.deploy.hosts.probe import probe_model
from llamaforge.deploy.hosts.remote import HostState, releases_to_prune
from llamaforge.deploy.hosts.rollout import batches
from llamaforge.deploy.release import Layout, ReleaseSpec, release_id
from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.deploy.targets import get_target
from llamaforge.deploy.targets.systemd import SystemdTarget, render_unit
from llamaforge.runners.ssh import SshProcessRunner, parse_hosts
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.serve.launcher import LlamaFlags
from llamaforge.smoke.answers import GoldenRequest, greedy_completion
from testhosts import USER, TestHost, write_known_hosts

pytestmark = pytest.mark.quick

GOLDEN = Path(__file__).parent / "golden" / "deploy-llama-server.service"
UPDATE = bool(os.environ.get("LLAMAFORGE_UPDATE_GOLDEN"))


def spec(**changes: Any) -> ReleaseSpec:
    base = ReleaseSpec(
        build_key="0c746799120471183e5949a10bb9dc1e",
        build_dir=Path("/nowhere"),
        manifest_sha256="a" * 64,
        model=Path("/m.gguf"),
        model_sha256="b" * 64,
        model_size=1000,
    )
    return replace(base, **changes)


# No host needed


def test_hosts_parse_in_order_and_bad_ones_are_refused() -> None:
    hosts = parse_hosts("lf@127.0.0.1:2201, gpu2 ,root@gpu3:22", key_file=Path("/k"))
    assert [host.address for host in hosts] == ["lf@127.0.0.1:2201", "gpu2:22", "root@gpu3:22"]
    assert hosts[0].key_file == Path("/k")
    v6 = parse_hosts("lf@[::1]:2201,[fd00::2],fd00::3")
    assert [(host.host, host.port) for host in v6] == [("::1", 2201), ("fd00::2", 22), ("fd00::3", 22)]
    assert v6[0].address == "lf@[::1]:2201" and v6[0].known_hosts_name == "[::1]:2201"
    for bad in ("lf@host:port", "lf@host:0", "", "a,a", "lf@:22", "h:²", "[::1]x", "[::1", "h:1:2", "@h"):
        with pytest.raises(InvalidOption):
            parse_hosts(bad)
    for hostile in ("h;id", "-oProxyCommand=id", "$(id)", "a@b@h", "lf x@h", "-l@h"):
        with pytest.raises(
            InvalidOption, match="is not a"
        ):  # neither reaches ssh as an option or a shell word
            parse_hosts(hostile)
    for twice in ("h:22,lf@h", "H,h", "::1,[0::1]:22"):  # one machine under two users or spellings
        with pytest.raises(InvalidOption, match="hosts given twice"):
            parse_hosts(twice)


def test_batches_put_the_canary_first() -> None:
    assert batches(5, 1, 2) == [[0], [1, 2], [3, 4]]
    assert batches(3, 0, 1) == [[0], [1], [2]]
    assert batches(2, 3, 1) == [[0, 1]]


def test_release_id_follows_the_inputs() -> None:
    files = {"llama-server.service": "unit"}
    first = release_id(spec(), files)
    assert first == release_id(spec(), files) and len(first) == 16
    changed = [
        spec(flags=LlamaFlags(ctx=512)),
        spec(model_sha256="c" * 64),
        spec(port=9000),
        spec(build_key="other"),
        spec(manifest_sha256="d" * 64),
    ]
    ids = {release_id(item, files) for item in changed} | {release_id(spec(), {"llama-server.service": "x"})}
    assert first not in ids and len(ids) == 6


class LddRunner:
    """Answers ``ldd`` as on the build machine: the build's own libraries through RPATH $ORIGIN, libgomp and
    libstdc++ from the system."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir

    def run(self, argv: list[str], **options: Any) -> Any:
        from llamaforge.runners.process import ProcessResult

        lines = [
            f"\tlibllama.so.0 => {self.bin_dir}/libllama.so.0 (0x1)",
            f"\tlibggml-base.so.0 => {self.bin_dir}/libggml-base.so.0 (0x1)",
            "\tlibgomp.so.1 => /usr/lib/x86_64-linux-gnu/libgomp.so.1 (0x1)",
            "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)",
        ]
        return ProcessResult(argv=list(argv), exit_code=0, stdout="\n".join(lines), stderr="", duration_s=0.0)


def test_release_keeps_the_builds_libraries_beside_the_binaries(tmp_path: Path) -> None:
    """ggml looks for its backend modules in the executable's directory: bin/ travels whole; only the system
    libraries a bare host may lack go to lib/ (the unit's LD_LIBRARY_PATH)."""
    from llamaforge.deploy.release import release_files

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (
        "llama-server",
        "libllama.so.0",
        "libggml-base.so.0",
        "libggml-cpu-haswell.so",
        "libggml-cpu-x64.so",
    ):
        (bin_dir / name).write_bytes(b"\x7fELF")
    spec = ReleaseSpec(
        build_key="k",
        build_dir=tmp_path,
        manifest_sha256="0" * 64,
        model=tmp_path / "m.gguf",
        model_sha256="0" * 64,
        model_size=0,
    )
    files = {inside: local for local, inside in release_files(spec, LddRunner(bin_dir))}  # type: ignore[arg-type]
    assert {"bin/llama-server", "bin/libllama.so.0", "bin/libggml-cpu-haswell.so"} <= set(files)
    assert sorted(inside for inside in files if inside.startswith("lib/")) == ["lib/libgomp.so.1"]
    assert files["lib/libgomp.so.1"] == Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1").resolve()


def test_a_system_library_newer_than_the_builds_glibc_is_refused_before_any_host(tmp_path: Path) -> None:
    """A release takes the system libraries `ldd` finds on the deploying machine: one that needs a newer glibc
    than the build's system (the manifest's libc6-dev) would stop every host, so it is refused, naming it; the
    build's own lib/ is the build's and is not checked."""
    from llamaforge.deploy.release import LibraryTooNew, build_glibc, release_files

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("llama-server", "libllama.so.0", "libggml-base.so.0"):
        (bin_dir / name).write_bytes(b"\x7fELF GLIBC_2.34")
    system = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"  # where LddRunner says libgomp is
    release = spec(build_dir=tmp_path)
    packages = "g++=4:12.2.0-3 libc6-dev=2.36-9+deb12u14 make=4.3-4.1"
    (tmp_path / "manifest.json").write_text(
        json.dumps({"toolchain": {"packages": packages}}), encoding="utf-8"
    )
    assert build_glibc(tmp_path) == (2, 36)

    class Ldd(LddRunner):
        def run(self, argv: list[str], **options: Any) -> Any:
            result = super().run(argv, **options)
            return replace(result, stdout=result.stdout.replace("/usr/lib/x86_64-linux-gnu", str(system)))

    system.mkdir(parents=True)
    (system / "libgomp.so.1").write_bytes(b"\x7fELF GLIBC_2.2.5 GLIBC_2.34 GLIBC_2.36")
    files = {inside for _local, inside in release_files(release, Ldd(bin_dir))}  # type: ignore[arg-type]
    assert "lib/libgomp.so.1" in files  # as new as the build's glibc: shipped
    (system / "libgomp.so.1").write_bytes(b"\x7fELF GLIBC_2.34 GLIBC_2.38")
    with pytest.raises(
        LibraryTooNew,
        match=r"libgomp.so.1 on this machine \(.*\) needs GLIBC_2.38, but the "
        r"build was made against glibc 2.36",
    ) as refused:
        release_files(release, Ldd(bin_dir))  # type: ignore[arg-type]
    assert refused.value.exit_code == 22
    assert "build again" in (refused.value.hint or "")  # a build with no lib/ of its own
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libstdc++.so.6").write_bytes(b"\x7fELF GLIBC_2.36")
    with pytest.raises(LibraryTooNew, match=r"libgomp\.so\.1 on this machine") as refused:
        release_files(release, Ldd(bin_dir))  # type: ignore[arg-type]
    assert "LD_LIBRARY_PATH" in (refused.value.hint or "")  # the build has a lib/, without that library
    (tmp_path / "lib" / "libgomp.so.1").write_bytes(b"\x7fELF GLIBC_2.38")  # the build's own: taken as it is
    files = {inside: local for local, inside in release_files(release, Ldd(bin_dir))}  # type: ignore[arg-type]
    assert files["lib/libgomp.so.1"] == tmp_path / "lib" / "libgomp.so.1"
    assert files["lib/libstdc++.so.6"] == tmp_path / "lib" / "libstdc++.so.6"
    (tmp_path / "manifest.json").write_text("{}", encoding="utf-8")  # a manifest that names no glibc
    assert build_glibc(tmp_path) is None


def test_previous_release_comes_from_the_history() -> None:
    state = HostState("c", ("a", "b", "c"), ("a", "b", "c"), None)
    assert state.previous() == "b"
    assert HostState("c", ("a", "c"), ("a", "b", "c"), None).previous() == "a"  # b was pruned
    assert HostState("a", ("a",), ("a",), None).previous() is None


def test_pruning_keeps_the_most_recently_current_releases() -> None:
    state = HostState("d", ("a", "b", "c", "d", "x"), ("a", "b", "c", "b", "d"), None)
    assert releases_to_prune(state, 2) == ["a", "c", "x"]  # keeps d (current) and b (the one before)
    assert releases_to_prune(state, 5) == ["x"]  # never current: a failed release's leftovers
    assert releases_to_prune(state, 1) == ["a", "b", "c", "x"]


def test_the_unit_matches_its_golden_and_refuses_specifiers() -> None:
    text = render_unit(spec(flags=LlamaFlags(ctx=512, threads=2), port=8081), Layout("lab"))
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.read_text(encoding="utf-8") == text, "rerun with LLAMAFORGE_UPDATE_GOLDEN=1"
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "Restart=on-failure",
        "User=llamaforge",
        "ReadOnlyPaths=/opt/llamaforge/lab",
    ):
        assert line in text.splitlines()
    assert "--host 127.0.0.1 --port 8081" in text
    with pytest.raises(InvalidOption):
        render_unit(spec(), Layout("lab", "/opt/100%"))
    with pytest.raises(InvalidOption):
        Layout("Not A Name")
    with pytest.raises(InvalidOption) as unknown:
        get_target("systemdd")
    assert "did you mean" in (unknown.value.hint or "")


def test_deploy_and_rollback_are_destructive_plan_and_status_read_only() -> None:
    ops = operations()
    assert ops["deploy"].destructive and ops["deploy.rollback"].destructive
    assert ops["deploy.plan"].read_only and ops["deploy.status"].read_only


# On the test hosts


@pytest.fixture
def fleet(
    test_hosts: list[TestHost],
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """Access to the three hosts (their real keys trusted), a deployment name and port of this test's own,
    and the build store the suite's build is in; the deployment's service is stopped afterwards."""
    monkeypatch.setenv("HOME", str(tmp_path))  # never this machine's ~/.ssh/known_hosts
    monkeypatch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
    known = write_known_hosts(tmp_path / "known_hosts", test_hosts)
    name = f"t{os.getpid() % 10000}-{len(list(tmp_path.parent.iterdir()))}"
    port = 18000 + (os.getpid() + len(name) * 7 + sum(map(ord, tmp_path.name))) % 2000
    access = {
        "hosts": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in test_hosts),
        "ssh_key": str(test_hosts[0].key_file),
        "known_hosts": str(known),
        "name": name,
    }
    yield {"access": access, "build": patched_build.name, "port": port, "known": known, "name": name}
    for host in test_hosts:
        host.exec(["systemctl", "stop", f"llamaforge-{name}.service"])


def run(operation: str, **arguments: Any) -> Any:
    op = operations()[operation]
    return op.run(op.params(**arguments), OperationContext())


def runner(host: TestHost, known: Path) -> SshProcessRunner:
    return SshProcessRunner(host.ssh_host(known), user_known_hosts=None)


def complete_through_ssh(host: TestHost, known: Path, port: int) -> list[dict[str, Any]]:
    """A real greedy completion from the host's llama-server, on its loopback, through SSH."""
    with runner(host, known) as opened, forward_local(opened, port) as local:
        return greedy_completion(f"http://127.0.0.1:{local}", GoldenRequest(n_predict=6, n_probs=1))


def listening(host: TestHost, port: int) -> list[str]:
    """The addresses (hex, as /proc/net/tcp writes them) the host listens on at ``port``."""
    rows = [line.split() for line in on_host(host, "cat /proc/net/tcp /proc/net/tcp6").splitlines()]
    return [row[1].split(":")[0] for row in rows if row[3] == "0A" and row[1].endswith(f":{port:04X}")]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def on_host(host: TestHost, command: str) -> str:
    code, output = host.exec(["sh", "-c", command])
    assert code == 0, output
    return output.strip()


@pytest.mark.docker
@pytest.mark.llamacpp
def test_deploy_query_redeploy_second_release_and_rollback(
    fleet: dict[str, Any], test_hosts: list[TestHost], tiny_qwen3: Path
) -> None:
    access, port, known, name = fleet["access"], fleet["port"], fleet["known"], fleet["name"]
    root = f"/opt/llamaforge/{name}"
    base = {**access, "build": fleet["build"], "model": str(tiny_qwen3), "port": port, "gate_timeout_s": 120}
    plan = run("deploy.plan", **base)
    assert isinstance(plan, DeployPlanResult)
    assert [item.action for item in plan.hosts] == ["upload"] * 3 and all(
        item.model_upload for item in plan.hosts
    )

    started = time.monotonic()
    first = run("deploy", **base, canary=1, batch=2)
    first_s = time.monotonic() - started
    assert isinstance(first, DeployResult) and first.passed, first
    assert [item.status for item in first.hosts] == ["updated"] * 3
    assert all(item.model_bytes == tiny_qwen3.stat().st_size for item in first.hosts)
    for host in test_hosts:
        assert len(complete_through_ssh(host, known, port)) == 6
        assert on_host(host, f"readlink {root}/current") == f"releases/{first.release}"
        assert on_host(host, f"readlink {root}/releases/{first.release}/model.gguf").startswith(
            f"{root}/models/"
        )
        shown = on_host(
            host,
            f"systemctl show -p User -p NoNewPrivileges -p ProtectSystem -p ActiveState "
            f"llamaforge-{name}.service",
        )
        assert sorted(shown.splitlines()) == [
            "ActiveState=active",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "User=llamaforge",
        ]
        assert listening(host, port) == ["0100007F"]  # 127.0.0.1 only
    with runner(test_hosts[0], known) as opened:
        assert SystemdTarget().verify(opened, Layout(name)) == []
        record = opened.run(["cat", f"{root}/current/release.json"]).stdout
    assert fleet["build"] in record and first.release in record

    started = time.monotonic()
    again = run("deploy", **base)
    again_s = time.monotonic() - started
    assert [item.status for item in again.hosts] == ["unchanged"] * 3
    assert sum(item.sent_bytes for item in again.hosts) == 0
    assert [item.action for item in run("deploy.plan", **base).hosts] == ["none"] * 3
    changed = run("deploy.plan", **base, ctx=1024).hosts
    assert [(item.action, item.model_upload, item.flags_before, item.flags_after) for item in changed] == [
        ("upload", False, [], ["-c", "1024"])
    ] * 3

    second = run("deploy", **base, ctx=1024, batch=2)
    assert second.passed and second.release != first.release
    assert [item.status for item in second.hosts] == ["updated"] * 3
    assert all(item.model_bytes == 0 for item in second.hosts)  # the model stayed on the hosts
    assert all(item.sent_bytes < 1_000_000 for item in second.hosts)  # binaries seeded from the last release
    status = run("deploy.status", **access)
    assert isinstance(status, DeployStatusResult)
    assert [(item.current, item.active, item.healthy, item.flags) for item in status.hosts] == [
        (second.release, "active", True, ["-c", "1024"])
    ] * 3

    back = run("deploy.rollback", **access, gate_timeout_s=120)
    assert back.passed and [item.status for item in back.hosts] == ["rolled back"] * 3
    assert all(item.release == first.release and item.health_s is not None for item in back.hosts)
    for host in test_hosts:
        assert on_host(host, f"readlink {root}/current") == f"releases/{first.release}"
        assert len(complete_through_ssh(host, known, port)) == 6
    print(
        f"\ndeploy 3 hosts {first_s:.1f} s; already-current redeploy {again_s:.2f} s; rollback {back.wall_s:.1f} s"
    )


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_release_that_fails_its_gate_is_rolled_back_on_the_canary_only(
    fleet: dict[str, Any], test_hosts: list[TestHost], tiny_qwen3: Path, tmp_path: Path
) -> None:
    access, port, known, name = fleet["access"], fleet["port"], fleet["known"], fleet["name"]
    root = f"/opt/llamaforge/{name}"
    base = {**access, "build": fleet["build"], "port": port, "gate_timeout_s": 120}
    good = run("deploy", **base, model=str(tiny_qwen3), batch=2)
    assert good.passed
    broken = unloadable_model(tmp_path / "unknown-arch.gguf")
    with pytest.raises(OperationFailed) as caught:
        run("deploy", **base, model=str(broken), batch=2)
    report = caught.value.result
    assert isinstance(report, DeployResult) and not report.passed
    assert [item.status for item in report.hosts] == ["rolled back", "untouched", "untouched"], report
    canary = report.hosts[0]
    assert canary.release == good.release and canary.logs and "restarted" in canary.detail
    assert caught.value.exit_code == 15
    for host in test_hosts:
        assert on_host(host, f"readlink {root}/current") == f"releases/{good.release}"
        assert len(complete_through_ssh(host, known, port)) == 6
    assert on_host(test_hosts[1], f"ls {root}/releases") == good.release  # nothing reached it
    assert len(on_host(test_hosts[0], f"ls {root}/models").split()) == 3  # good, broken and the probe model
    pruned = run("deploy", **base, model=str(tiny_qwen3), ctx=2048, keep=1, batch=2)
    assert pruned.passed
    kept = sorted(f"{sha}.gguf" for sha in (sha256_of(tiny_qwen3), probe_model().sha256))  # the release's two
    for host in test_hosts:  # the releases beyond keep=1 and the broken model they linked to are gone
        assert on_host(host, f"ls {root}/releases") == pruned.release
        assert on_host(host, f"ls {root}/models").split() == kept


@pytest.mark.docker
@pytest.mark.llamacpp
def test_an_unknown_host_key_or_a_closed_port_is_refused_before_anything_changes(
    fleet: dict[str, Any], test_hosts: list[TestHost], tiny_qwen3: Path, tmp_path: Path
) -> None:
    access, name = fleet["access"], fleet["name"]
    partial = tmp_path / "partial_known_hosts"
    partial.write_text("".join(f"{line}\n" for line in test_hosts[0].host_key_lines()), encoding="utf-8")
    params = {
        **access,
        "known_hosts": str(partial),
        "build": fleet["build"],
        "model": str(tiny_qwen3),
        "port": fleet["port"],
    }
    with pytest.raises(OperationFailed) as caught:
        run("deploy", **params)
    report = caught.value.result
    assert [item.status for item in report.hosts] == ["untouched", "unreachable", "unreachable"]
    assert "unknown" in report.hosts[1].detail and "--accept-new-host-keys" in report.hosts[1].detail
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    params["hosts"] = f"{USER}@127.0.0.1:{test_hosts[0].port},{USER}@127.0.0.1:{closed}"
    params["known_hosts"] = str(fleet["known"])
    with pytest.raises(OperationFailed) as caught:
        run("deploy", **params)
    report = caught.value.result
    assert [item.status for item in report.hosts] == ["untouched", "unreachable"]
    assert f"127.0.0.1:{closed}" in report.hosts[1].detail
    for host in test_hosts:
        assert host.exec(["test", "-e", f"/opt/llamaforge/{name}"])[0] != 0
    assert not HostsParams.model_fields["accept_new_host_keys"].default
    assert DeployRollbackParams.model_fields["release"].default is None
    assert DeployParams.model_fields["canary"].default == 1
