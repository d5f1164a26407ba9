"""One model over a head and two RPC workers on the test hosts, CPU-only, deployed for real.

The head (host 0) runs llama-server ``--rpc``; hosts 1 and 2 run ggml-rpc-server bound to their address on the
hosts' internal network (tests/testhosts.py: no route out). This side talks to the hosts only through their
127.0.0.1-published SSH ports. The same model deployed alone on host 0 (another deployment name) is the
reference: the split must give the same greedy tokens. Faults: a worker stopped while serving, then started
again; a worker on another build; a public or unspecified RPC address.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamaforge.core.errors import InvalidOption, LlamaforgeError, OperationFailed
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.topology.orchestrate import TopologyDeployResult, TopologyStatusResult
from llamaforge.deploy.topology.workers import BuildMismatch
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.smoke.answers import GoldenRequest, greedy_completion
from testhosts import USER, TestHost, write_known_hosts

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]
RPC_PORT = 50052


def run(operation: str, **arguments: Any) -> Any:
    op = operations()[operation]
    return op.run(op.params(**arguments), OperationContext())


@pytest.fixture(scope="module")
def split_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    vocab = os.environ.get("LLAMAFORGE_TEST_VOCAB", "")
    if not Path(vocab).is_file():
        pytest.skip("set LLAMAFORGE_TEST_VOCAB to llama.cpp's models/ggml-vocab-qwen2.gguf")
    path = tmp_path_factory.mktemp("rpc-model") / "tiny-qwen3-6L.gguf"
    return write_tiny_model(path, TinyModelSpec(arch="qwen3", n_layer=6), Path(vocab)).path


@pytest.fixture
def topology(
    test_hosts: list[TestHost],
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """Head host 0, workers hosts 1 and 2 on the internal network; a deployment name of this test's own; the
    units it started are stopped afterwards."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
    known = write_known_hosts(tmp_path / "known_hosts", test_hosts)
    name = f"rpc{os.getpid() % 10000}-{len(list(tmp_path.parent.iterdir()))}"
    head, *workers = test_hosts
    port = 19000 + (os.getpid() + sum(map(ord, tmp_path.name))) % 900
    hosts = {
        "head": f"{USER}@127.0.0.1:{head.port}",
        "rpc_workers": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in workers),
        "rpc_addresses": ",".join(host.private_address for host in workers),
        "ssh_key": str(head.key_file),
        "known_hosts": str(known),
        "name": name,
        "rpc_threads": 1,
    }
    yield {
        "hosts": hosts,
        "build": patched_build.name,
        "port": port,
        "known": known,
        "name": name,
        "head": head,
        "workers": workers,
    }
    for host in test_hosts:
        for unit in (
            f"llamaforge-{name}.service",
            f"llamaforge-{name}-rpc.service",
            f"llamaforge-{name}-single.service",
        ):
            host.exec(["systemctl", "stop", unit])


def completion(host: TestHost, known: Path, port: int, n_predict: int = 8) -> list[str]:
    with (
        SshProcessRunner(host.ssh_host(known), user_known_hosts=None) as runner,
        forward_local(runner, port) as local,
    ):
        tokens = greedy_completion(f"http://127.0.0.1:{local}", GoldenRequest(n_predict=n_predict, n_probs=1))
    return [str(token["token"]) for token in tokens]


def on_host(host: TestHost, command: str) -> str:
    code, output = host.exec(["sh", "-c", command])
    assert code == 0, output
    return output.strip()


def test_a_split_over_two_workers_serves_what_one_host_serves(
    topology: dict[str, Any], split_model: Path
) -> None:
    hosts, known, port, name = topology["hosts"], topology["known"], topology["port"], topology["name"]
    head, workers = topology["head"], topology["workers"]
    base = {
        **hosts,
        "build": topology["build"],
        "model": str(split_model),
        "port": port,
        "ctx": 512,
        "worker_memory": "2GiB,2GiB",
        "gate_timeout_s": 120,
        "threads": 1,
    }
    plan = run("topology.plan", **base)
    assert [device.layer_range for device in plan.devices] == ["0-3", "4-5"] and plan.fits
    started = time.monotonic()
    report = run("topology.deploy", **base)
    deploy_s = time.monotonic() - started
    assert isinstance(report, TopologyDeployResult) and report.passed, report
    assert [item.status for item in [*report.workers, report.head]] == ["updated"] * 3
    assert all(item.model_bytes == 0 for item in report.workers)  # workers never get the model file
    # each worker and the head ran the release's llama-bench as its unit would before its switch
    assert all(
        (item.probe or "").startswith("llama-bench ran as llamaforge")
        for item in [*report.workers, report.head]
    )
    assert report.flags == plan.flags
    for worker in workers:  # bound to its private address only, with its cache
        unit = f"llamaforge-{name}-rpc.service"
        assert on_host(worker, f"systemctl is-active {unit}") == "active"
        argv = on_host(worker, f"systemctl show -p ExecStart {unit}")
        assert f"-H {worker.private_address} -p {RPC_PORT} -c" in argv
        assert (
            on_host(worker, "cat /proc/net/tcp | awk '$4 == \"0A\" {print $2}'").count(f":{RPC_PORT:04X}")
            == 1
        )
    split_tokens = completion(head, known, port)

    # The same model alone on the head host (a deployment of its own, no --rpc). The RPC workers compute in
    # plain CPU buffers (ggml-rpc offers no extra buffer types), while a single host would put its weights in
    # the CPU's repacked or AMX buffers, whose kernels round differently (on an AMX Xeon the answers parted at
    # token 3). --no-repack gives the single host the workers' kernels, so the two must agree token for token.
    single = run(
        "deploy",
        hosts=hosts["head"],
        ssh_key=hosts["ssh_key"],
        known_hosts=hosts["known_hosts"],
        name=f"{name}-single",
        build=topology["build"],
        model=str(split_model),
        port=port + 1,
        ctx=512,
        parallel=1,
        threads=1,
        gate_timeout_s=120,
        repack=False,
    )
    assert "--no-repack" in on_host(head, f"systemctl show -p ExecStart llamaforge-{name}-single.service")
    assert single.passed
    assert completion(head, known, port + 1) == split_tokens

    status = run("topology.status", **hosts)
    assert isinstance(status, TopologyStatusResult) and status.healthy
    assert [(item.active, item.from_head, item.build_key) for item in status.workers] == [
        ("active", True, status.head.build_key)
    ] * 2

    smoke = run("topology.smoke", **hosts, single_host=hosts["head"], single_name=f"{name}-single", runs=3)
    assert smoke.same_tokens is True
    by_device = {row["device"]: row for row in smoke.devices}
    for worker in workers:
        row = by_device[f"RPC {worker.private_address}:{RPC_PORT}"]
        assert row["allocated_weights"] > 0 and row["allocated_kv_cache"] > 0
    print(
        f"\ntopology.deploy 1 head + 2 workers: {deploy_s:.1f} s; tg tok/s split {smoke.head['tg_tps']} vs single "
        f"{smoke.single['tg_tps']}; pp tok/s split {smoke.head['pp_tps']} vs single {smoke.single['pp_tps']}"
    )
    for row in smoke.devices:
        print("  " + ", ".join(f"{key}={value}" for key, value in row.items()))

    again = run("topology.deploy", **base)
    assert [item.status for item in [*again.workers, again.head]] == ["unchanged"] * 3
    second = run("topology.deploy", **{**base, "ctx": 1024})
    assert [item.status for item in second.workers] == ["unchanged"] * 2 and second.head.status == "updated"
    back = run("topology.rollback", **hosts, gate_timeout_s=120)
    assert back.passed and back.head.status == "rolled back" and back.head.release == report.head.release
    assert completion(head, known, port) == split_tokens


def test_a_stopped_worker_is_named_and_starting_it_recovers(
    topology: dict[str, Any], split_model: Path
) -> None:
    hosts, known, port, name = topology["hosts"], topology["known"], topology["port"], topology["name"]
    head, workers = topology["head"], topology["workers"]
    report = run(
        "topology.deploy",
        **hosts,
        build=topology["build"],
        model=str(split_model),
        port=port,
        ctx=512,
        worker_memory="2GiB,2GiB",
        gate_timeout_s=120,
        threads=1,
    )
    assert report.passed
    before = completion(head, known, port)
    unit = f"llamaforge-{name}-rpc.service"
    on_host(workers[1], f"systemctl stop {unit}")  # the worker goes away while the head serves
    with pytest.raises(OperationFailed) as caught:
        run("topology.status", **hosts)
    status = caught.value.result
    assert isinstance(status, TopologyStatusResult) and not status.healthy
    assert f"{workers[1].private_address}:{RPC_PORT}" in status.detail and "worker" in status.detail
    assert workers[0].private_address not in status.detail
    assert [item.from_head for item in status.workers] == [True, False]
    with pytest.raises(OSError):  # the head cannot compute without it
        completion(head, known, port)

    on_host(workers[1], f"systemctl start {unit}")
    deadline, tokens = time.monotonic() + 120, None
    while time.monotonic() < deadline and tokens is None:  # the head restarts itself and reconnects
        try:
            tokens = completion(head, known, port)
        except (OSError, LlamaforgeError):
            time.sleep(2)
    assert tokens == before
    assert run("topology.status", **hosts).healthy


def test_a_worker_killed_by_sigill_fails_its_gate_naming_the_signal_and_its_cpu_module(
    topology: dict[str, Any], split_model: Path
) -> None:
    """The first worker's ggml-rpc-server gets a real SIGILL once ggml's loader has named its CPU module (a
    systemd drop-in whose ExecStartPost starts a watcher on the journal): its gate names both, from the journal,
    and the head is never touched."""
    hosts, name, worker = topology["hosts"], topology["name"], topology["workers"][0]
    unit = f"llamaforge-{name}-rpc.service"
    watcher = f"/usr/local/sbin/{name}-sigill-at-load"
    body = "\n".join(
        [
            "#!/bin/sh",
            "for i in $(seq 1 500); do",
            '  journalctl _PID="$MAINPID" -o cat | grep -q "load_backend: loaded CPU" && exec kill -ILL "$MAINPID"',
            "  sleep 0.02",
            "done </dev/null >/dev/null 2>&1 &",
        ]
    )
    dropin = f"/etc/systemd/system/{unit}.d"
    on_host(
        worker,
        f"printf '%s\\n' '{body}' > {watcher} && mkdir -p {dropin} && "
        f"printf '[Service]\\nExecStartPost=+/bin/sh {watcher}\\n' > {dropin}/sigill.conf"
        " && systemctl daemon-reload",
    )
    try:
        with pytest.raises(OperationFailed) as caught:
            run(
                "topology.deploy",
                **hosts,
                build=topology["build"],
                model=str(split_model),
                port=topology["port"],
                ctx=512,
                worker_memory="2GiB,2GiB",
                gate_timeout_s=120,
                threads=1,
            )
        # The worker went back to its release, whose server the watcher kills too: topology.status names the
        # signal while systemd still reports it (between the kill and the next start).
        deadline = time.monotonic() + 60
        while True:
            with pytest.raises(OperationFailed) as unhealthy:
                run("topology.status", **hosts)
            status = unhealthy.value.result
            assert isinstance(status, TopologyStatusResult)
            if status.workers[0].crash or time.monotonic() > deadline:
                break
        assert status.workers[0].crash == "killed by SIGILL (illegal instruction)", status
        words = f"RPC server {status.workers[0].active}, killed by SIGILL (illegal instruction)"
        assert words in status.detail and words in unhealthy.value.message
    finally:
        on_host(worker, f"rm -rf {dropin} {watcher} && systemctl daemon-reload")
    report = caught.value.result
    assert isinstance(report, TopologyDeployResult)
    assert [item.status for item in report.workers] == ["failed", "untouched"], report
    assert report.head.status == "untouched"
    # The module, read out of band from what the worker's own ggml-rpc-server wrote to the journal.
    journal = on_host(worker, f"journalctl -u {unit} -o cat --no-pager")
    module = re.findall(r"load_backend: loaded CPU backend from \S*/(libggml-cpu-\S+\.so)", journal)[-1]
    detail = report.workers[0].detail
    assert f"ggml-rpc-server was killed by SIGILL (illegal instruction) with {module} loaded" in detail, (
        detail
    )
    assert "the RPC server" in detail and "invoke smoke.cpu-modules" in detail and "exit code" not in detail


def test_another_build_and_public_addresses_are_refused_before_anything_starts(
    topology: dict[str, Any], split_model: Path, build_env: dict[str, str]
) -> None:
    from llamaforge.build.store import list_builds

    hosts, name = topology["hosts"], topology["name"]
    others = [str(item["key"]) for item in list_builds() if str(item["key"]) != topology["build"]]
    base = {
        **hosts,
        "build": topology["build"],
        "model": str(split_model),
        "port": topology["port"],
        "worker_memory": "2GiB,2GiB",
    }
    if others:
        with pytest.raises(BuildMismatch) as caught:
            run("topology.deploy", **base, worker_build=others[0])
        assert others[0] in caught.value.message and topology["build"] in caught.value.message
    workers = topology["workers"]
    for addresses, words in (
        (f"8.8.8.8,{workers[1].private_address}", "public"),
        (f"0.0.0.0,{workers[1].private_address}", "every network"),
    ):
        with pytest.raises(InvalidOption) as refused:
            run("topology.deploy", **{**base, "rpc_addresses": addresses})
        assert words in refused.value.message and hosts["rpc_workers"].split(",")[0] in refused.value.message
    for host in [topology["head"], *workers]:
        assert host.exec(["test", "-e", f"/opt/llamaforge/{name}"])[0] != 0  # nothing reached any host
    assert others, "the build store holds one build only: the mismatch case needs a second build key"
