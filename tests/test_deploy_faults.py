"""Deploy faults and safety on the real systemd + sshd test hosts (tests/testhosts.py).

One deployment of this module's own (its name and port) is put on the three hosts once, on the suite's CPU build
and the tiny model ("good"); every test starts from it and puts every host back on it, so the order of the tests
does not matter. What each fault leaves on the hosts is read out of band (docker exec), not from the report.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.deploy.hosts import rollout as rollout_module
from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.runners.ssh import connection as ssh_connection
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.runners.ssh.transfer import CHUNK
from test_deploy_ssh import complete_through_ssh, listening, on_host, runner, sha256_of
from testhosts import USER, TestHost, restart_host, write_known_hosts

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]


def deploy(
    operation: str = "deploy", *, cancel: CancelToken | None = None, on_event: Any = None, **arguments: Any
) -> Any:
    """Run a deploy operation in this process, as the fronts do."""
    op = operations()[operation]
    context = OperationContext(reporter=on_event or (lambda event: None), cancel=cancel or CancelToken())
    return op.run(op.params(**arguments), context)


def failed(operation: str = "deploy", **arguments: Any) -> DeployResult:
    """The report of a deploy operation that must fail."""
    with pytest.raises(OperationFailed) as caught:
        deploy(operation, **arguments)
    assert isinstance(caught.value.result, DeployResult)
    return caught.value.result


class Site:
    """The module's deployment: access to the hosts (rebuilt after a host restarts on another port)."""

    def __init__(self, hosts: list[TestHost], home: Path, build: str, model: Path) -> None:
        self.hosts, self.home, self.build, self.model = hosts, home, build, model
        self.name = f"faults{os.getpid() % 10000}"
        self.port = 20000 + os.getpid() % 2000
        self.root = f"/opt/llamaforge/{self.name}"
        self.good = ""

    @property
    def known(self) -> Path:
        return write_known_hosts(self.home / "known_hosts", self.hosts)

    def access(self) -> dict[str, Any]:
        return {
            "hosts": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in self.hosts),
            "ssh_key": str(self.hosts[0].key_file),
            "known_hosts": str(self.known),
            "name": self.name,
        }

    def params(self, **more: Any) -> dict[str, Any]:
        return {
            **self.access(),
            "build": self.build,
            "model": str(self.model),
            "port": self.port,
            "gate_timeout_s": 120,
            **more,
        }

    def address(self, index: int) -> str:
        return f"{USER}@127.0.0.1:{self.hosts[index].port}"

    def current(self, index: int) -> str:
        return on_host(self.hosts[index], f"readlink {self.root}/current").removeprefix("releases/")

    def restore(self) -> None:
        """Every host back on the good release, serving."""
        report = deploy(**self.params(batch=2))
        assert report.release == self.good and report.passed, report
        for index in range(len(self.hosts)):
            assert self.current(index) == self.good


@pytest.fixture(scope="module")
def site(
    test_hosts: list[TestHost],
    patched_build: Path,
    build_env: dict[str, str],
    tiny_qwen3: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("deploy-faults-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))  # never this machine's ~/.ssh/known_hosts
        patch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
        site = Site(test_hosts, home, patched_build.name, tiny_qwen3)
        first = deploy(**site.params(batch=2))
        assert first.passed, first
        site.good = first.release
        yield site
        for host in test_hosts:
            host.exec(["systemctl", "stop", f"llamaforge-{site.name}.service"])


@pytest.fixture(autouse=True)
def back_on_good(site: Site) -> Iterator[None]:
    """After each test every host is on the good release again, also after a test that failed half-way, so
    one failure never shows up as the next test's."""
    yield
    if any(site.current(index) != site.good for index in range(len(site.hosts))):
        site.restore()


def other_model(directory: Path, n_layer: int) -> Path:
    vocab = Path(os.environ["LLAMAFORGE_TEST_VOCAB"])
    return write_tiny_model(
        directory / f"tiny-{n_layer}.gguf", TinyModelSpec(arch="qwen3", n_layer=n_layer), vocab
    ).path


def post(local_port: int, path: str, body: dict[str, Any], key: str | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", local_port, timeout=60)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def test_an_inventory_deploy_listening_beyond_loopback_keeps_its_key_secret(
    site: Site, tmp_path: Path
) -> None:
    gpus = ['gpu = "rtx4060"\n', "", ""]  # the first host has a GPU: its flags come from the fit plan
    hosts = "\n".join(
        f'[[hosts]]\nname = "h{index}"\naddress = "127.0.0.1"\nport = {host.port}\n{gpus[index]}'
        for index, host in enumerate(site.hosts)
    )
    (tmp_path / "fleet_known_hosts").write_text(site.known.read_text(encoding="utf-8"), encoding="utf-8")
    inventory = tmp_path / "lab.toml"
    inventory.write_text(
        f'user = "{USER}"\nkey_file = "{site.hosts[0].key_file}"\nknown_hosts = "fleet_known_hosts"\n{hosts}',
        encoding="utf-8",
    )
    wide = {
        "inventory": str(inventory),
        "name": site.name,
        "build": site.build,
        "model": str(site.model),
        "port": site.port,
        "gate_timeout_s": 120,
        "listen": "0.0.0.0",
    }
    with pytest.raises(InvalidOption, match="needs an API key"):
        deploy("deploy.plan", **wide, api_key=False)
    with pytest.raises(InvalidOption) as unknown:
        deploy("deploy.plan", **wide, hosts="h1,h11")
    assert "did you mean 'h1'" in (unknown.value.hint or "")
    plan = deploy("deploy.plan", **wide)
    assert isinstance(plan, DeployPlanResult)
    assert plan.hosts[0].flags_after[:4] == ["-ngl", "3", "-c", "4096"] and plan.hosts[0].fit  # the GPU host
    assert [item.flags_after for item in plan.hosts[1:]] == [[], []] and not plan.hosts[1].fit
    assert all(item.api_key and item.listen == "0.0.0.0" for item in plan.hosts)

    report = deploy(**wide, batch=2)
    assert report.passed and report.release is None, report  # the GPU host got a release of its own
    assert len({item.release for item in report.hosts}) == 2
    text = json.dumps(result_json(report)) + json.dumps(result_json(plan))
    unit = f"/etc/systemd/system/llamaforge-{site.name}.service"
    for index, (host, item) in enumerate(zip(site.hosts, report.hosts, strict=True)):
        assert item.api_key_file == f"{site.root}/releases/{item.release}/api-key"
        assert on_host(host, f"stat -c '%a %U %G' {item.api_key_file}") == "600 llamaforge llamaforge"
        assert host.exec(["cat", item.api_key_file], user=USER)[0] != 0  # the deploy user cannot read it
        key = on_host(host, f"cat {item.api_key_file}")
        assert len(key) >= 32
        for where in (
            f"cat {unit} {site.root}/current/release.json",
            "ps -eo args",
            f"journalctl -u llamaforge-{site.name} --no-pager -o cat",
        ):
            assert key not in on_host(host, where), where
        assert key not in text
        assert "--api-key-file" in on_host(host, f"cat {unit}")
        assert listening(host, site.port) == ["00000000"]  # 0.0.0.0
        with runner(host, site.known) as opened, forward_local(opened, site.port) as local:
            body = {"prompt": "hi", "n_predict": 2}
            assert post(local, "/completion", body) == 401, index  # no key: refused
            assert post(local, "/completion", body, key="wrong-key") == 401
            assert post(local, "/completion", body, key=key) == 200
    status = deploy("deploy.status", inventory=str(inventory), name=site.name)
    assert [item.healthy for item in status.hosts] == [True] * 3
    site.restore()
    assert listening(site.hosts[0], site.port) == ["0100007F"]  # back on loopback only


def test_a_full_disk_switches_nothing_and_max_fail_lets_the_next_batch_go_on(
    site: Site, tmp_path: Path
) -> None:
    model = other_model(tmp_path, 3)
    full = site.hosts[1]
    # The deploy user's own small disk: a directory it does not own is refused before any space is counted.
    on_host(
        full, f"mount -t tmpfs -o size=1m,uid=$(id -u {USER}),gid=$(id -g {USER}) tmpfs {site.root}/models"
    )
    try:
        stopped = failed(**site.params(model=str(model), canary=0, batch=2))
        assert [item.status for item in stopped.hosts] == ["updated", "failed", "untouched"], stopped
        detail = stopped.hosts[1].detail
        assert site.address(1) in detail and "MiB free" in detail and "nothing was sent" in detail
        assert site.current(1) == site.good and site.current(2) == site.good
        assert on_host(full, f"ls {site.root}/models") == ""  # nothing was sent there either
        goes_on = failed(**site.params(model=str(model), canary=0, batch=2, max_fail=50))
        assert [item.status for item in goes_on.hosts] == ["unchanged", "failed", "updated"], goes_on
        assert site.current(1) == site.good and site.current(2) == goes_on.hosts[2].release
    finally:
        full.exec(["umount", f"{site.root}/models"])
    site.restore()


def test_a_port_another_deployment_listens_on_is_refused_before_anything_changes(site: Site) -> None:
    other = {**site.params(), "name": f"{site.name}-other"}  # a second deployment, on the first one's port
    plan = deploy("deploy.plan", **other)
    assert isinstance(plan, DeployPlanResult)
    for item in plan.hosts:
        assert f"port {site.port} is in use there (127.0.0.1:{site.port} listens" in item.detail, item.detail
        assert "choose another --port" in item.detail
    report = failed(**other)
    assert [item.status for item in report.hosts] == ["failed"] * 3, report
    assert all("nothing was changed" in item.detail and item.sent_bytes == 0 for item in report.hosts)
    for host in site.hosts:
        assert host.exec(["test", "-e", f"/opt/llamaforge/{site.name}-other"])[0] != 0
    assert [site.current(index) for index in range(3)] == [site.good] * 3
    moved = deploy(**{**other, "port": site.port + 1})  # another port is free: it deploys beside the first
    assert moved.passed, moved
    for host in site.hosts:
        assert listening(host, site.port + 1) == ["0100007F"]  # the second deployment's server, on 127.0.0.1
        host.exec(["systemctl", "stop", f"llamaforge-{site.name}-other.service"])


def test_a_setting_llama_server_cannot_start_with_fails_the_gate_and_the_canary_is_rolled_back(
    site: Site,
) -> None:
    # A context no host can allocate: llamaforge passes it on (the host decides), the probe does not use it, and
    # llama-server exits while it creates its context. (Values llamaforge knows to be wrong, such as an unknown
    # cache type, are refused before any host is reached: tests/test_deploy_inputs.py.)
    report = failed(**site.params(ctx=2**31 - 1))
    assert [item.status for item in report.hosts] == ["rolled back", "untouched", "untouched"], report
    canary = report.hosts[0]
    assert canary.release == site.good and "restarted" in canary.detail and "healthy" in canary.detail
    assert any("failed to create context" in line.lower() for line in canary.logs), canary.logs
    assert [site.current(index) for index in range(3)] == [site.good] * 3
    assert len(complete_through_ssh(site.hosts[0], site.known, site.port)) == 6


@contextlib.contextmanager
def sigill_at_load(host: TestHost, site: Site) -> Iterator[None]:
    """On ``host``, llama-server of every release but the good one gets a real SIGILL once it has loaded its
    backends and starts to load the model, before it is ready: a systemd drop-in beside the deployment's unit
    whose ExecStartPost (as root) starts a watcher that waits for that line in the main process's journal, then
    kills it, where an AMX Xeon's faulting kernel would; the start itself succeeds, as it does there."""
    dropin = f"/etc/systemd/system/llamaforge-{site.name}.service.d"
    script = f"/usr/local/sbin/{site.name}-sigill-at-load"
    body = "\n".join(
        [
            "#!/bin/sh",
            f'[ "$(readlink {site.root}/current)" = releases/{site.good} ] && exit 0',
            "for i in $(seq 1 500); do",
            '  journalctl _PID="$MAINPID" -o cat | grep -q "load_model: loading model" && exec kill -ILL "$MAINPID"',
            "  sleep 0.02",
            "done </dev/null >/dev/null 2>&1 &",
        ]
    )
    conf = f"[Service]\nExecStartPost=+/bin/sh {script}\n"
    on_host(
        host,
        f"printf '%s\\n' '{body}' > {script} && mkdir -p {dropin} && "
        f"printf '{conf}' > {dropin}/sigill-at-load.conf && systemctl daemon-reload",
    )
    try:
        yield
    finally:
        on_host(host, f"rm -rf {dropin} {script} && systemctl daemon-reload")


def test_a_server_killed_by_sigill_fails_the_gate_naming_the_signal_and_its_cpu_module(
    site: Site, patched_build: Path
) -> None:
    with sigill_at_load(site.hosts[0], site):
        report = failed(**site.params(ctx=1280))
    assert [item.status for item in report.hosts] == ["rolled back", "untouched", "untouched"], report
    canary = report.hosts[0]
    # The module the loader picks for this build on this CPU (the hosts are containers on it), asked here.
    listed = subprocess.run(
        [str(patched_build / "bin" / "llama-bench"), "--list-devices"],
        capture_output=True,
        text=True,
        check=True,
    )
    module = re.findall(r"load_backend: loaded CPU backend from \S*/(libggml-cpu-\S+\.so)", listed.stderr)[-1]
    assert f"llama-server was killed by SIGILL (illegal instruction) with {module} loaded" in canary.detail
    assert "invoke smoke.cpu-modules" in canary.detail and "--no-repack" in canary.detail, canary.detail
    assert "exit code" not in canary.detail and canary.logs
    assert canary.release == site.good and "healthy" in canary.detail
    assert [site.current(index) for index in range(3)] == [site.good] * 3


def test_a_host_stopped_before_its_batch_is_unreachable_and_the_rest_untouched(site: Site) -> None:
    victim = site.hosts[1]

    def stop_after_canary(event: Event) -> None:
        if event.message.startswith(f"{site.address(0)}: updated"):
            victim.container.stop(timeout=5)

    params = site.params(ctx=1024)
    try:
        report = failed(**params, on_event=stop_after_canary)
        assert [item.status for item in report.hosts] == ["updated", "unreachable", "untouched"], report
        assert site.address(1) in report.hosts[1].detail or "connection" in report.hosts[1].detail
        assert report.hosts[1].release == site.good  # it went down before anything changed on it
        assert site.current(0) == report.hosts[0].release != site.good and site.current(2) == site.good
    finally:
        restart_host(victim)
    assert site.current(1) == site.good  # the enabled service came back with the host
    site.restore()
    assert len(complete_through_ssh(victim, site.known, site.port)) == 6


@contextlib.contextmanager
def slow_start(host: TestHost, name: str, seconds: int = 4) -> Iterator[None]:
    """The host's llama-server waits ``seconds`` before it starts (a systemd drop-in beside the deployment's
    unit). ``systemctl restart`` waits for ExecStartPre, so the host's switch-and-restart command takes that
    long: a signal sent as the host starts switching lands while that command runs, on a quiet machine as on
    a busy one (the tiny model loads in well under a second, so a signal sent later could come too late)."""
    dropin = f"/etc/systemd/system/llamaforge-{name}.service.d"
    conf = f"[Service]\\nExecStartPre=/bin/sleep {seconds}\\n"
    on_host(
        host, f"mkdir -p {dropin} && printf '{conf}' > {dropin}/slow-start.conf && systemctl daemon-reload"
    )
    try:
        yield
    finally:
        on_host(host, f"rm -rf {dropin} && systemctl daemon-reload")


def signal_invoke(
    command: list[str], options: dict[str, Any], marker: str, signum: int, what: str, timeout: int
) -> tuple[int, str, str, str]:
    """Run ``invoke COMMAND --json --OPTION=VALUE…`` from this checkout, send ``signum`` once a stderr line
    contains ``marker``; its exit code, stdout, stderr up to the signal and stderr after it."""
    argv = [sys.executable, "-m", "invoke", command[0], "--json", *command[1:]]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    with subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None and process.stdout is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if marker in line:
                process.send_signal(signum)
                break
        else:
            pytest.fail(f"the {what} ended before its marker {marker!r}:\n" + "".join(seen[-20:]))
        out, rest = process.communicate(timeout=timeout)
    return process.returncode, out, "".join(seen), rest


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_rollout_leaves_each_host_on_a_whole_release(site: Site, signum: int, code: int) -> None:
    params = site.params(ctx=2048 if signum == signal.SIGINT else 3072, canary=1, batch=1)
    with slow_start(site.hosts[1], site.name):
        code_seen, out, seen, rest = signal_invoke(
            ["deploy"], params, f"{site.address(1)}: switching to", signum, "rollout", 180
        )
    # the second host is switching to the new release when the signal comes: it is put back, not gated
    assert code_seen == code, seen + rest
    report = DeployResult.model_validate(json.loads(out))
    assert report.interrupted and "interrupted" in rest
    assert [item.status for item in report.hosts] == ["updated", "interrupted", "untouched"], report
    new = report.hosts[0].release
    assert new != site.good and report.hosts[1].release == site.good and report.hosts[2].release == site.good
    for index, item in enumerate(report.hosts):  # the report says where each host is, and it is there
        assert site.current(index) == item.release
        assert _service_settled(site.hosts[index], site.name) == "active"
    _wait_healthy(site, 1)  # put back on its release, restarted: it may still be loading
    assert len(complete_through_ssh(site.hosts[1], site.known, site.port)) == 6
    site.restore()


class CancelAtChunk(CancelToken):
    """Ctrl-C as the model's third chunk is about to be sent: the rollout's first check, then one per chunk."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.checks, self.at = 0, at

    def raise_if_cancelled(self) -> None:
        self.checks += 1
        if self.checks == self.at:
            self.cancel()
        super().raise_if_cancelled()


def test_an_upload_interrupted_mid_model_resumes_from_its_part(site: Site, tmp_path: Path) -> None:
    model = other_model(tmp_path, 4)
    size, sha = model.stat().st_size, sha256_of(model)
    assert size > 3 * CHUNK
    with pytest.raises(OperationFailed) as caught:
        deploy(**site.params(model=str(model)), cancel=CancelAtChunk(4))
    report = caught.value.result
    assert caught.value.exit_code == 130 and isinstance(report, DeployResult)
    assert [item.status for item in report.hosts] == ["interrupted", "untouched", "untouched"], report
    part = f"{site.root}/models/{sha}.gguf.part"
    assert on_host(site.hosts[0], f"stat -c %s {part}") == str(2 * CHUNK)
    assert site.current(0) == site.good
    resumed = deploy(**site.params(model=str(model), batch=2))
    assert resumed.passed
    assert [item.model_bytes for item in resumed.hosts] == [size - 2 * CHUNK, size, size]
    assert on_host(site.hosts[0], f"sha256sum {site.root}/models/{sha}.gguf").split()[0] == sha
    site.restore()


def _wait_healthy(site: Site, index: int, timeout_s: float = 60.0) -> None:
    """Until deploy.status says host ``index`` answers /health (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while not _healthy(site, index) and time.monotonic() < deadline:
        time.sleep(0.5)


def _healthy(site: Site, index: int) -> bool:
    try:
        status = deploy("deploy.status", **site.access())
    except OperationFailed as failed:  # a host did not answer (yet): exit 14, the report still says the rest
        status = failed.result
    assert isinstance(status, DeployStatusResult)
    return bool(status.hosts[index].healthy)


def _service_settled(host: TestHost, name: str, timeout_s: float = 60.0) -> str:
    """The host's service state once it is no longer starting (read out of band)."""
    deadline = time.monotonic() + timeout_s
    while True:
        _code, state = host.exec(["systemctl", "is-active", f"llamaforge-{name}"])
        if state.strip() not in ("activating", "reloading") or time.monotonic() > deadline:
            return state.strip()
        time.sleep(0.5)


@pytest.mark.parametrize("during", ["switch", "gate"])
def test_a_connection_lost_mid_rollout_leaves_the_host_on_one_whole_release(
    site: Site, monkeypatch: pytest.MonkeyPatch, during: str
) -> None:
    # sshd frozen on the second host (every sshd process, SIGSTOP): its connection stops answering, as in a
    # network partition, while the host itself goes on; the keepalive probe notices within seconds
    monkeypatch.setattr(ssh_connection, "ALIVE_INTERVAL_S", 1.0)
    monkeypatch.setattr(ssh_connection, "ALIVE_COUNT", 4)
    monkeypatch.setattr(rollout_module, "RECHECK_TIMEOUT_S", 3.0)
    victim, address = site.hosts[1], site.address(1)
    freeze = ["pkill", "-STOP", "-x", "sshd"]
    frozen = threading.Event()

    def on_event(event: Event) -> None:
        if frozen.is_set():
            return
        if during == "switch" and event.message.startswith(f"{address}: switching to"):
            frozen.set()  # while the switch-and-restart command is on its way or running there
            threading.Timer(0.3, victim.exec, args=(freeze,)).start()
        elif during == "gate" and event.message.startswith(f"{address}: switched to"):
            frozen.set()
            victim.exec(freeze)

    try:
        report = failed(**site.params(ctx=1536 if during == "switch" else 2560), on_event=on_event)
    finally:
        time.sleep(0.5)  # the timer's freeze has run
        victim.exec(["pkill", "-CONT", "-x", "sshd"])
    assert [item.status for item in report.hosts] == ["updated", "unreachable", "untouched"], report
    new, lost = report.hosts[0].release, report.hosts[1]
    assert new is not None and new != site.good
    assert "connection lost" in lost.detail and lost.release is None  # frozen: it did not answer again
    assert new in lost.detail and site.good in lost.detail  # it says which two releases it may be on
    assert site.current(2) == site.good and site.current(0) == new
    # back: one whole release, the unit installed from that release, its service active and answering
    assert _service_settled(victim, site.name) == "active"
    on = site.current(1)
    assert on == new if during == "gate" else on in (new, site.good)
    unit = f"/etc/systemd/system/llamaforge-{site.name}.service"
    on_host(victim, f"cmp {unit} {site.root}/releases/{on}/llama-server.service")
    assert len(complete_through_ssh(victim, site.known, site.port)) == 6
    status = deploy("deploy.status", **site.access())
    assert status.hosts[1].current == on and status.hosts[1].healthy
    site.restore()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_rollback_leaves_each_host_on_a_whole_release(
    site: Site, signum: int, code: int
) -> None:
    newer = deploy(**site.params(ctx=3584 if signum == signal.SIGINT else 3840, batch=2))
    assert newer.passed and newer.release != site.good
    with slow_start(site.hosts[1], site.name):
        code_seen, out, seen, rest = signal_invoke(
            ["deploy.rollback", f"--release={site.good}"],
            site.access(),
            f"{site.address(1)}: switching back to",
            signum,
            "rollback",
            120,
        )  # the second host is switching back to good when the signal comes: it stays there, not gated
    assert code_seen == code, seen + rest
    report = DeployResult.model_validate(json.loads(out))
    assert report.interrupted and "interrupted" in rest
    assert [item.status for item in report.hosts] == ["rolled back", "interrupted", "untouched"], report
    assert [item.release for item in report.hosts] == [site.good, site.good, newer.release]
    assert "not gated" in report.hosts[1].detail
    for index, item in enumerate(report.hosts):  # the report says where each host is, and it is there
        assert site.current(index) == item.release
        assert _service_settled(site.hosts[index], site.name) == "active"
    _wait_healthy(site, 1)  # the second host was restarted but not gated: it may still be loading
    assert len(complete_through_ssh(site.hosts[1], site.known, site.port)) == 6
    site.restore()
