"""A release proven on each host before it is switched on (llamaforge.deploy.hosts.probe).

Unit tests (no host) check the probe's command for each target: the systemd probe carries every [Service]
setting of the release's own unit but those that start and restart the server, pointed at the release instead of
``current``; the docker probe runs the release's image with the container's restrictions. The live tests deploy to
the systemd + sshd test hosts: the suite's build is probed and switched; a copy of it whose CPU modules execute
an illegal instruction (``ud2`` written over ``ggml_graph_compute``, so the loader loads the module, names it,
and the CPU raises SIGILL in it on the first graph, as the AMX tiles did) is refused on every host before any
switch, naming the host and SIGILL, while planning too once it is there; a copy whose llama-bench lacks a library
is refused by the canary.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import copy_build, sigill_copy
from llamaforge.core.errors import OperationFailed
from llamaforge.core.events import Event
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.hosts.probe import PROBE_LIMIT_S, probe_args, probe_model
from llamaforge.deploy.release import Layout, ReleaseSpec
from llamaforge.deploy.report import DeployPlanResult, DeployResult
from llamaforge.deploy.targets.container import PROBE_MOUNT, ContainerImage, DockerTarget, render_container
from llamaforge.deploy.targets.rpc_server import RpcServerTarget
from llamaforge.deploy.targets.systemd import SystemdTarget
from llamaforge.serve.launcher import LlamaFlags
from test_deploy_ssh import complete_through_ssh, on_host
from testhosts import USER, TestHost, write_known_hosts

pytestmark = pytest.mark.quick

RID = "0123456789abcdef"
LAYOUT = Layout("lab")
RELEASE = f"/opt/llamaforge/lab/releases/{RID}"


def spec(**changes: Any) -> ReleaseSpec:
    base = ReleaseSpec(
        build_key="0c746799120471183e5949a10bb9dc1e",
        build_dir=Path("/nowhere"),
        manifest_sha256="a" * 64,
        model=Path("/m.gguf"),
        model_sha256="b" * 64,
        model_size=1000,
        flags=LlamaFlags(ctx=512, threads=2),
        port=8081,
    )
    return replace(base, **changes)


# No host needed


def test_the_systemd_probe_runs_with_every_setting_of_the_release_unit_but_start_and_restart() -> None:
    target = SystemdTarget()
    files = target.service_files(spec(), LAYOUT)
    args = probe_args("/opt/llamaforge/lab/models/x.gguf", LlamaFlags(threads=2))
    command = target.probe_command(LAYOUT, RID, files, "/opt/llamaforge/lab/models/x.gguf", args)
    # a command for root: sudo is added only for a deploy user who is not root
    assert command[:4] == ["systemd-run", "--wait", "--pipe", "--collect"]
    assert f"--unit=llamaforge-lab-probe-{RID}" in command
    assert f"--property=RuntimeMaxSec={PROBE_LIMIT_S}" in command
    properties = [part.removeprefix("--property=") for part in command if part.startswith("--property=")]
    unit = files["llama-server.service"]
    service = unit[unit.index("[Service]") : unit.index("[Install]")].splitlines()[1:]
    expected = [
        line.replace("/opt/llamaforge/lab/current", RELEASE)
        for line in service
        if line and not line.startswith(("ExecStart=", "Restart=", "RestartSec="))
    ]
    assert properties == [f"RuntimeMaxSec={PROBE_LIMIT_S}", *expected]
    for setting in (
        "User=llamaforge",
        "Group=llamaforge",
        f"Environment=LD_LIBRARY_PATH={RELEASE}/lib",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadOnlyPaths=/opt/llamaforge/lab",
    ):
        assert setting in properties, setting
    assert not any("current" in part for part in command)
    assert command[command.index("--") + 1 :] == [f"{RELEASE}/bin/llama-bench", *args]
    assert args == [
        "-m",
        "/opt/llamaforge/lab/models/x.gguf",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-o",
        "json",
        "-t",
        "2",
    ]


def test_an_rpc_worker_is_probed_with_its_own_units_environment() -> None:
    target = RpcServerTarget("10.0.0.5", 50052)
    worker = spec(model=Path(), model_sha256="", model_size=0, flags=LlamaFlags())
    command = target.probe_command(LAYOUT, RID, target.service_files(worker, LAYOUT), "/m", ["-m", "/m"])
    assert "--property=Environment=LLAMA_CACHE=/var/cache/llamaforge-lab-rpc" in command
    assert f"--property=Environment=LD_LIBRARY_PATH={RELEASE}/lib" in command
    assert "--unit=llamaforge-lab-rpc-probe-" + RID in command
    assert command[-3:] == [f"{RELEASE}/bin/llama-bench", "-m", "/m"]


def test_the_probe_follows_the_services_threads_gpu_layers_and_repack() -> None:
    args = probe_args("/m", LlamaFlags(threads=4, n_gpu_layers=0, repack=False))
    assert args[args.index("-t") + 1] == "4" and args[args.index("-ngl") + 1] == "0"
    assert args[-2:] == ["--repack", "0"]
    assert "-t" not in probe_args("/m", LlamaFlags()) and "-ngl" not in probe_args("/m", LlamaFlags())


def test_the_docker_probe_runs_the_image_as_the_container_would() -> None:
    image = ContainerImage("sha256:" + "c" * 64, "llamaforge/llama-server:k", gpus=False)
    target = DockerTarget(image)
    model = "/opt/llamaforge/lab/models/x.gguf"
    command = target.probe_command(LAYOUT, RID, {}, model, probe_args(model, LlamaFlags()))
    assert command[:2] == ["sh", "-c"]  # for root: sudo only when not root
    script, positional = command[2], command[3:]
    # the service's container restrictions, as its script has them
    service = render_container(spec(), LAYOUT, image)
    for option in ("--read-only --cap-drop ALL --security-opt no-new-privileges", '--user "$user"'):
        assert option in script and option in service, option
    assert 'user="$(id -u "$1"):$(id -g "$1")"' in script and "docker run --rm --network none" in script
    assert f"target={PROBE_MOUNT},readonly" in script
    assert positional[:3] == ["sh", "llamaforge", model]
    assert positional[3:6] == ["--entrypoint", "/opt/llamaforge/bin/llama-bench", image.id]
    assert positional[6:8] == ["-m", PROBE_MOUNT] and model not in positional[6:]
    gpu = DockerTarget(replace(image, gpus=True)).probe_command(LAYOUT, RID, {}, model, ["-m", model])
    assert gpu[6:8] == ["--gpus", "all"]


def test_each_target_names_the_signal_that_ended_its_probe() -> None:
    summary = [
        "Running as unit: x.service",
        "Finished with result: signal",
        "Main processes terminated with: code=killed/status=ILL",
    ]
    assert SystemdTarget().probe_signal(255, summary) is signal.SIGILL
    assert SystemdTarget().probe_signal(0, summary) is None
    exited = ["Finished with result: exit-code", "Main processes terminated with: code=exited/status=127"]
    assert SystemdTarget().probe_signal(127, exited) is None
    docker = DockerTarget(ContainerImage("sha256:" + "c" * 64, "t"))
    assert docker.probe_signal(132, []) is signal.SIGILL and docker.probe_signal(139, []) is signal.SIGSEGV
    assert docker.probe_signal(127, []) is None and docker.probe_signal(0, []) is None


def test_a_library_too_new_for_the_host_is_named_and_the_refused_hosts_log_is_shown() -> None:
    """What a Debian bookworm host's loader said of a libstdc++ that a machine with a newer glibc shipped in the
    release (seen on a real host): the refusal ends on that line, and the table's host gets its log."""
    from rich.console import Console

    from llamaforge.deploy.hosts.probe import judge_probe
    from llamaforge.deploy.hosts.render import rollout_cli
    from llamaforge.deploy.report import HostReport

    loader = (
        "/opt/llamaforge/x/releases/r1/bin/llama-bench: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' "
        "not found (required by /opt/llamaforge/x/releases/r1/lib/libstdc++.so.6)"
    )
    summary = ["Running as unit: p.service", loader, "Main processes terminated with: code=exited/status=1"]
    outcome = judge_probe("lf@h:22: release r1 cannot run there", None, 1, "", summary, 0.1)
    assert outcome.refusal is not None and not outcome.passed
    assert outcome.refusal.message.endswith(f": {loader}")
    assert "newer system" in (outcome.refusal.hint or "")
    report = HostReport(
        host="lf@h:22",
        status="failed",
        release=None,
        previous=None,
        detail=outcome.detail,
        logs=list(outcome.logs),
    )
    console = Console(record=True, width=300)
    rollout_cli(
        DeployResult(name="x", target="systemd", release="r1", passed=False, wall_s=1.0, hosts=[report]),
        console,
    )
    shown = console.export_text()
    assert "lf@h:22: its last log lines:" in shown and f"  {loader}" in shown


# On the test hosts


@pytest.fixture
def store(
    test_hosts: list[TestHost],
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """A build store of this test's own beside the suite's (its build linked in, its sources and tiny models
    shared), access to the three hosts, a deployment name and port of the test's own."""
    shared = Path(build_env["LLAMAFORGE_HOME"])
    home = tmp_path / "lf-home"
    (home / "builds").mkdir(parents=True)
    (home / "builds" / patched_build.name).symlink_to(patched_build)
    for name in ("sources", "models"):
        (shared / name).mkdir(exist_ok=True)
        (home / name).symlink_to(shared / name)
    monkeypatch.setenv("HOME", str(tmp_path))  # never this machine's ~/.ssh/known_hosts
    monkeypatch.setenv("LLAMAFORGE_HOME", str(home))
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", build_env["LLAMAFORGE_SOURCE_MIRROR"])
    known = write_known_hosts(tmp_path / "known_hosts", test_hosts)
    name = f"probe{os.getpid() % 10000}"
    access = {
        "hosts": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in test_hosts),
        "ssh_key": str(test_hosts[0].key_file),
        "known_hosts": str(known),
        "name": name,
    }
    yield {
        "access": access,
        "home": home,
        "build": patched_build,
        "known": known,
        "name": name,
        "port": 21000 + os.getpid() % 2000,
    }
    for host in test_hosts:
        host.exec(["systemctl", "stop", f"llamaforge-{name}.service"])


def run(operation: str, events: list[str] | None = None, **arguments: Any) -> Any:
    op = operations()[operation]
    context = OperationContext(
        reporter=lambda event: events.append(event.message) if events is not None else None
    )
    return op.run(op.params(**arguments), context)


def refused(events: list[str], **arguments: Any) -> DeployResult:
    with pytest.raises(OperationFailed) as caught:
        run("deploy", events, **arguments)
    assert isinstance(caught.value.result, DeployResult) and caught.value.exit_code == 15
    return caught.value.result


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_release_is_probed_before_its_switch_and_a_crashing_one_is_refused_on_every_host(
    store: dict[str, Any], test_hosts: list[TestHost], tiny_qwen3: Path
) -> None:
    root = f"/opt/llamaforge/{store['name']}"
    base = {**store["access"], "model": str(tiny_qwen3), "port": store["port"], "gate_timeout_s": 120}
    addresses = [f"{USER}@127.0.0.1:{host.port}" for host in test_hosts]

    events: list[str] = []
    started = time.monotonic()
    good = run("deploy", events, **base, build=store["build"].name, batch=2)
    good_s = time.monotonic() - started
    assert isinstance(good, DeployResult) and good.passed, good
    probe = probe_model()
    for address, host, item in zip(addresses, test_hosts, good.hosts, strict=True):
        assert item.status == "updated" and item.probe, item
        # the release's lib/ (libgomp) reached llama-bench: it ran with the unit's LD_LIBRARY_PATH
        assert item.probe.startswith("llama-bench ran as llamaforge: pp16 ") and "tg4 " in item.probe, (
            item.probe
        )
        assert "libggml-cpu-" in item.probe  # the CPU module the loader picked there
        probing = events.index(f"probing release on {address}")
        assert probing < events.index(f"{address}: switching to {good.release} and restarting")
        assert on_host(host, f"readlink {root}/releases/{good.release}/probe.gguf") == (
            f"{root}/models/{probe.sha256}.gguf"
        )
    again = run("deploy", **base, build=store["build"].name, ctx=1024, batch=3)  # the probe model stays there
    assert again.passed and all(item.sent_bytes < 1_000_000 for item in again.hosts), again

    # Every CPU module of this copy runs ud2 at the start of ggml_graph_compute: llama.cpp loads the module and
    # the model, and the CPU raises SIGILL on the first graph.
    key, _ = sigill_copy(store["build"], store["home"])
    events.clear()
    report = refused(events, **base, build=key, canary=0, batch=3)  # every host in one batch: each one probes
    for address, host, item in zip(addresses, test_hosts, report.hosts, strict=True):
        assert item.status == "failed" and item.release == again.release, item
        assert item.detail.startswith(
            f"{address}: release {report.release} cannot run there: llama-bench was "
            "killed by SIGILL (illegal instruction)"
        ), item.detail
        assert "with libggml-cpu-" in item.detail and "smoke.cpu-modules" in item.detail
        assert item.detail.endswith(f"still on {again.release}")
        assert any("load_backend: loaded CPU backend" in line for line in item.logs), item.logs
        assert any("code=killed/status=ILL" in line for line in item.logs), item.logs
        assert f"probing release on {address}" in events
        assert not any(message.startswith(f"{address}: switching") for message in events), events
        assert on_host(host, f"readlink {root}/current") == f"releases/{again.release}"
        assert len(complete_through_ssh(host, store["known"], store["port"])) == 6  # still serving
    assert str(report.release) in on_host(test_hosts[0], f"ls {root}/releases")  # there, never switched on

    # Now that the release is on the hosts, planning probes it: refused before anything changes anywhere.
    plan = run("deploy.plan", **base, build=key)
    assert isinstance(plan, DeployPlanResult) and [item.action for item in plan.hosts] == ["switch"] * 3
    assert all(
        "killed by SIGILL" in item.probe and "nothing was changed" in item.detail for item in plan.hosts
    )
    events.clear()
    again_refused = refused(events, **base, build=key)
    assert [item.status for item in again_refused.hosts] == ["failed"] * 3
    assert all("killed by SIGILL" in item.detail and item.sent_bytes == 0 for item in again_refused.hosts)
    assert not any("switching" in message for message in events), events

    # A llama-bench that needs a library no release has (its DT_NEEDED entry renamed): the canary is refused,
    # the rest untouched.
    key, directory = copy_build(store["build"], store["home"], "nolib")
    bench = directory / "bin" / "llama-bench"
    text = bench.read_bytes()
    assert text.count(b"libllama-bench-impl.so\0") == 1
    bench.write_bytes(text.replace(b"libllama-bench-impl.so\0", b"libllama-bench-gone.so\0"))
    missing = refused([], **base, build=key)
    assert [item.status for item in missing.hosts] == ["failed", "untouched", "untouched"], missing
    detail = missing.hosts[0].detail
    assert "llama-bench ended with exit code 127" in detail, detail
    assert "error while loading shared libraries: libllama-bench-gone.so" in detail, detail
    assert all(
        on_host(host, f"readlink {root}/current") == f"releases/{again.release}" for host in test_hosts
    )
    print(
        f"\ndeploy 3 hosts with the probe {good_s:.1f} s; probe per host: "
        + ", ".join(f"{item.probe.rsplit(' in ', 1)[-1]}" for item in good.hosts if item.probe)
    )


@pytest.mark.docker
@pytest.mark.llamacpp
def test_no_probe_switches_without_it(store: dict[str, Any], tiny_qwen3: Path) -> None:
    events: list[str] = []
    report = run(
        "deploy",
        events,
        **store["access"],
        build=store["build"].name,
        model=str(tiny_qwen3),
        port=store["port"],
        gate_timeout_s=120,
        batch=3,
        probe=False,
    )
    assert report.passed and all(item.probe is None for item in report.hosts), report
    assert not any(message.startswith("probing release") for message in events)


@pytest.mark.docker
def test_the_probe_model_is_quantized_and_written_once(
    source_tree: Path, build_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gguf import GGUFReader

    monkeypatch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", build_env["LLAMAFORGE_SOURCE_MIRROR"])
    first = probe_model()
    seen: list[Event] = []
    assert probe_model(seen.append) == first and not seen  # written once, then found
    assert first.path.parent == Path(build_env["LLAMAFORGE_HOME"]) / "models" / "tiny"
    types = {tensor.tensor_type.name for tensor in GGUFReader(first.path).tensors}
    assert "Q4_0" in types and first.size < 32 << 20, (types, first.size)
