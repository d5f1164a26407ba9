"""The SSH process runner against real hosts: systemd as PID 1 and sshd, in containers reached only through
127.0.0.1 (tests/testhosts.py). Host keys, commands, secrets, timeouts, cancellation and file transfer."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaforge.core.errors import Cancelled, InvalidOption, LlamaforgeError, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.runners.ssh.connection import HostKeyChanged, HostKeyUnknown, SshError, SshHost
from llamaforge.runners.ssh.runner import SshProcessRunner, remote_command
from testhosts import USER, TestHost, make_key, write_known_hosts

pytestmark = pytest.mark.quick


def fingerprint(blob: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(base64.b64decode(blob)).digest()).decode().rstrip("=")


def trusted(host: TestHost, directory: Path) -> Path:
    """A known_hosts file with the host's real keys, read out of band."""
    return write_known_hosts(directory / f"known_hosts-{host.port}", [host])


def runner_for(host: TestHost, tmp_path: Path) -> SshProcessRunner:
    """A runner that trusts ``host``'s real keys and never reads this machine's ~/.ssh."""
    return SshProcessRunner(host.ssh_host(trusted(host, tmp_path)), user_known_hosts=None)


@pytest.fixture
def host(test_hosts: list[TestHost]) -> TestHost:
    return test_hosts[0]


@pytest.fixture
def runner(host: TestHost, tmp_path: Path) -> Iterator[SshProcessRunner]:
    with runner_for(host, tmp_path) as opened:
        yield opened


def remote_processes(host: TestHost) -> list[str]:
    """Every process's pid and whole command line on the host (out of band, as root)."""
    _code, output = host.exec(["ps", "-eww", "-o", "pid=,args="])
    return [line.strip() for line in output.splitlines()]


# The command line and host names (no host needed)


def test_remote_command_quotes_argv_and_carries_no_env_value() -> None:
    command = remote_command(["printf", "%s", "a b", "it's"], env=True, cwd="/srv/my dir", merge=True)
    assert command == (
        'printf "llamaforge-pid %s\\n" "$$" >&2'
        ' && IFS= read -r n && eval "$(dd bs=1 count="$n" 2>/dev/null)"'
        " && cd -- '/srv/my dir'"
        " && exec printf %s 'a b' 'it'\"'\"'s' 2>&1"
    )
    assert (
        remote_command(["true"], env=False, cwd=None) == 'printf "llamaforge-pid %s\\n" "$$" >&2 && exec true'
    )


class SilentTransport:
    """A transport whose server answers the keepalive requests until ``answering`` is cleared (then never)."""

    def __init__(self) -> None:
        self.answering = threading.Event()
        self.answering.set()
        self.closed = threading.Event()
        self.probes = 0

    def is_active(self) -> bool:
        return not self.closed.is_set()

    def global_request(self, kind: str, wait: bool = True) -> None:
        assert kind == "keepalive@openssh.com" and wait
        self.probes += 1
        while not self.answering.is_set() and not self.closed.is_set():
            time.sleep(0.01)

    def close(self) -> None:
        self.closed.set()


def test_keepalive_closes_a_transport_after_its_server_stops_answering() -> None:
    from llamaforge.runners.ssh.connection import keep_alive

    transport = SilentTransport()
    watcher = keep_alive(transport, interval_s=0.05, count=3)
    time.sleep(0.5)
    assert not transport.closed.is_set() and transport.probes >= 3  # answered: left open
    transport.answering.clear()
    stopped = time.monotonic()
    assert transport.closed.wait(5)
    assert 0.1 <= time.monotonic() - stopped < 2  # three unanswered probes, not the first
    watcher.join(2)
    assert not watcher.is_alive()


def test_host_names_follow_openssh() -> None:
    assert SshHost("gpu1").known_hosts_name == "gpu1"
    assert SshHost("127.0.0.1", 2222, "lf").known_hosts_name == "[127.0.0.1]:2222"
    assert SshHost("127.0.0.1", 2222, "lf").address == "lf@127.0.0.1:2222"


def test_bad_env_names_and_accept_new_without_a_file_are_refused(tmp_path: Path) -> None:
    runner = SshProcessRunner(SshHost("127.0.0.1", 1), user_known_hosts=None)
    with pytest.raises(InvalidOption):
        runner.run(["true"], env={"NOT-A-NAME": "x"})
    with pytest.raises(InvalidOption, match="known_hosts"):
        SshProcessRunner(SshHost("127.0.0.1", 1), user_known_hosts=None, accept_new_host_keys=True).run(
            ["true"]
        )


# Host keys


@pytest.mark.docker
def test_unknown_host_is_refused_with_its_fingerprint_and_nothing_runs(
    host: TestHost, tmp_path: Path
) -> None:
    known = tmp_path / "inventory_known_hosts"
    marker = f"/tmp/must-not-exist-{os.getpid()}"
    runner = SshProcessRunner(host.ssh_host(known), user_known_hosts=tmp_path / "absent")
    with pytest.raises(HostKeyUnknown) as caught:
        runner.run(["touch", marker])
    message = caught.value.render()
    assert f"127.0.0.1:{host.port}" in message
    assert fingerprint(host.host_key()) in message
    assert "--accept-new-host-keys" in message
    assert not known.exists()
    assert host.exec(["test", "-e", marker])[0] != 0


@pytest.mark.docker
def test_user_known_hosts_is_read_by_default(
    host: TestHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    trusted(host, tmp_path).rename(tmp_path / ".ssh" / "known_hosts")
    with SshProcessRunner(host.ssh_host()) as runner:
        assert runner.run(["id", "-un"]).stdout == f"{USER}\n"


@pytest.mark.docker
def test_accept_new_records_the_key_then_the_default_policy_connects(host: TestHost, tmp_path: Path) -> None:
    known = tmp_path / "hosts" / "known_hosts"
    with SshProcessRunner(host.ssh_host(known), user_known_hosts=None, accept_new_host_keys=True) as first:
        assert first.run(["true"]).ok
    recorded = known.read_text(encoding="utf-8").splitlines()
    assert recorded == [f"[127.0.0.1]:{host.port} ssh-ed25519 {host.host_key()}"]
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    with SshProcessRunner(host.ssh_host(known), user_known_hosts=None) as second:
        assert second.run(["hostname"]).stdout.strip() == "host0"
    assert known.read_text(encoding="utf-8").splitlines() == recorded


@pytest.mark.docker
def test_a_wrong_recorded_key_is_refused_naming_both_fingerprints(host: TestHost, tmp_path: Path) -> None:
    make_key(tmp_path / "other")
    wrong = (tmp_path / "other.pub").read_text(encoding="utf-8").split()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{host.port} ssh-ed25519 {wrong}\n", encoding="utf-8")
    # accept-new never accepts a changed key
    for accept in (False, True):
        runner = SshProcessRunner(host.ssh_host(known), user_known_hosts=None, accept_new_host_keys=accept)
        with pytest.raises(HostKeyChanged) as caught:
            runner.run(["true"])
        message = caught.value.render()
        assert f"127.0.0.1:{host.port}" in message
        assert fingerprint(wrong) in message
        assert fingerprint(host.host_key()) in message
        assert "ssh-keygen -R" in message
    assert known.read_text(encoding="utf-8") == f"[127.0.0.1]:{host.port} ssh-ed25519 {wrong}\n"


@pytest.mark.docker
def test_a_host_whose_keys_were_regenerated_is_refused(test_hosts: list[TestHost], tmp_path: Path) -> None:
    host = test_hosts[2]
    known = tmp_path / "known_hosts"
    with SshProcessRunner(host.ssh_host(known), user_known_hosts=None, accept_new_host_keys=True) as runner:
        runner.run(["true"])
    old = host.host_key()
    code, output = host.exec(
        ["sh", "-c", "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A && systemctl restart ssh.service"]
    )
    assert code == 0, output
    new = host.host_key()
    assert new != old
    with pytest.raises(HostKeyChanged) as caught:
        SshProcessRunner(host.ssh_host(known), user_known_hosts=None).run(["true"])
    assert fingerprint(old) in caught.value.message
    assert fingerprint(new) in caught.value.message


@pytest.mark.docker
def test_unreachable_host_and_refused_key_are_named(host: TestHost, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    with pytest.raises(SshError) as caught:
        SshProcessRunner(SshHost("127.0.0.1", free_port, USER, host.key_file), user_known_hosts=None).run(
            ["true"]
        )
    assert f"127.0.0.1:{free_port}: connection refused" in caught.value.message
    assert "Errno" not in caught.value.render()
    make_key(tmp_path / "stranger")
    stranger = SshHost("127.0.0.1", host.port, USER, tmp_path / "stranger", trusted(host, tmp_path))
    with pytest.raises(SshError) as caught:
        SshProcessRunner(stranger, user_known_hosts=None).run(["true"])
    assert "refused the key" in caught.value.message
    assert "authorized_keys" in (caught.value.hint or "")


# Commands


@pytest.mark.docker
def test_run_streams_lines_as_they_arrive_and_returns_exit_codes(runner: SshProcessRunner) -> None:
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    result = runner.run(
        ["sh", "-c", "echo first; sleep 1.5; echo second; echo problem >&2; exit 3"],
        on_line=lambda line: seen.append((time.monotonic() - started, line)),
        warn=True,
    )
    assert result.exit_code == 3 and not result.ok
    assert result.stdout == "first\nsecond\n"
    assert result.stderr == "problem\n"
    assert seen[0][1] == "first"
    assert seen[0][0] < result.duration_s - 1.0  # the first line arrived before the command ended
    interleaved = "for i in 1 2 3 4 5 6 7 8; do echo out$i; echo err$i >&2; done"
    merged = runner.run(["sh", "-c", interleaved], merge_stderr=True)
    expected = [f"{kind}{i}" for i in range(1, 9) for kind in ("out", "err")]
    assert merged.stdout.splitlines() == expected and merged.stderr == ""
    with pytest.raises(ToolFailed) as no_dir:
        runner.run(["pwd"], cwd=Path("/no/such/dir"))
    assert any("/no/such/dir" in line for line in no_dir.value.tail)
    assert runner.run(["pwd"], cwd=Path("/tmp")).stdout == "/tmp\n"
    assert runner.run(["cat"], stdin="through stdin\n").stdout == "through stdin\n"
    assert (
        runner.run(["printf", "%s|", "two words", "it's", "$HOME", "*"]).stdout == "two words|it's|$HOME|*|\n"
    )


@pytest.mark.docker
def test_a_failing_command_raises_tool_failed_with_its_last_lines(runner: SshProcessRunner) -> None:
    with pytest.raises(ToolFailed) as caught:
        runner.run(["sh", "-c", "for i in $(seq 1 30); do echo line$i >&2; done; exit 4"])
    error = caught.value
    assert error.returncode == 4
    assert error.command == ["sh", "-c", "for i in $(seq 1 30); do echo line$i >&2; done; exit 4"]
    assert error.tail[-1] == "line30" and len(error.tail) == 20
    assert "127.0.0.1" in error.message
    with pytest.raises(ToolFailed) as missing:
        runner.run(["no-such-program-here"])
    assert missing.value.returncode == 127


@pytest.mark.docker
def test_a_command_a_signal_ended_reports_the_signal_as_a_local_process_does(
    runner: SshProcessRunner,
) -> None:
    """sshd says ``exit-signal ILL``: the runner reports -4, as Popen does, so the crash is named."""
    no_core = "ulimit -c 0; "
    assert runner.run(["sh", "-c", no_core + "kill -ILL $$"], warn=True).exit_code == -4
    with pytest.raises(ToolFailed) as caught:
        runner.run(["sh", "-c", no_core + "echo last words >&2; kill -SEGV $$"])
    assert caught.value.returncode == -11
    assert "exit: killed by SIGSEGV (segmentation fault)" in caught.value.render()
    handle = runner.start(["sh", "-c", no_core + "echo started; kill -ABRT $$"])
    assert handle.wait(timeout_s=10) == -6 and handle.tail() == ["started"]
    assert runner.run(["sh", "-c", "exit 3"], warn=True).exit_code == 3  # an exit status is read as before


@pytest.mark.docker
def test_timeout_kills_the_remote_process_group(runner: SshProcessRunner, host: TestHost) -> None:
    tag = f"lf-timeout-{os.getpid()}"
    with pytest.raises(ToolFailed) as caught:
        runner.run(["sh", "-c", f"sleep 300 & sleep 301; echo {tag}"], timeout_s=1.5)
    assert "did not finish within 1.5 s" in caught.value.message
    result = runner.run(["sleep", "300"], timeout_s=1, warn=True)
    assert result.timed_out and not result.ok
    time.sleep(0.5)
    assert not [line for line in remote_processes(host) if "sleep 30" in line]


@pytest.mark.docker
def test_cancel_kills_the_remote_process(runner: SshProcessRunner, host: TestHost) -> None:
    cancel = CancelToken()
    threading.Timer(1.0, cancel.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        runner.run(["sleep", "299"], cancel=cancel)
    assert time.monotonic() - started < 10
    time.sleep(0.5)
    assert not [line for line in remote_processes(host) if "sleep 299" in line]


@pytest.mark.docker
def test_env_values_never_reach_a_command_line(runner: SshProcessRunner, host: TestHost) -> None:
    secret = "hf_" + os.urandom(12).hex()
    tricky = "two words, 'quotes', \"double\", $HOME, `backticks`\nand a second line"
    snapshots: list[list[str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            snapshots.append(remote_processes(host))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = runner.run(
            [
                "sh",
                "-c",
                'sleep 2; printf %s "$HF_TOKEN" | sha256sum; printf %s "$TRICKY"; echo; echo "$HF_TOKEN"',
            ],
            env={"HF_TOKEN": secret, "TRICKY": tricky},
        )
    finally:
        done.set()
        watcher.join()
    lines = result.stdout.splitlines()
    assert lines[0].split()[0] == hashlib.sha256(secret.encode()).hexdigest()  # the command had the value
    assert "\n".join(lines[1:3]) == tricky
    assert lines[3] == "****"  # masked in what the runner keeps
    assert len(snapshots) >= 2
    assert any("sleep 2" in line for snapshot in snapshots for line in snapshot)
    assert not [
        line for snapshot in snapshots for line in snapshot if secret in line or "second line" in line
    ]
    _code, cmdlines = host.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert secret not in cmdlines
    with pytest.raises(InvalidOption):
        runner.run(["echo", secret], env={"HF_TOKEN": secret})


@pytest.mark.docker
def test_start_streams_and_terminate_stops_the_process_group(
    runner: SshProcessRunner, host: TestHost
) -> None:
    handle = runner.start(["sh", "-c", "echo ready; sleep 298; echo never"])
    assert next(iter(handle.lines(timeout_s=10))) == "ready"
    assert handle.poll() is None and handle.pid > 1
    assert handle.wait(timeout_s=0.2) is None
    handle.terminate(grace_s=2)
    assert handle.poll() is not None
    assert handle.tail() == ["ready"]
    assert not [line for line in remote_processes(host) if "sleep 298" in line]


@pytest.mark.docker
def test_a_lost_connection_is_named_and_the_next_command_reconnects(
    runner: SshProcessRunner, host: TestHost
) -> None:
    errors: list[LlamaforgeError] = []

    def sleeper() -> None:
        try:
            runner.run(["sleep", "297"])
        except LlamaforgeError as error:
            errors.append(error)

    def matching(text: str) -> list[str]:
        return [line.split()[0] for line in remote_processes(host) if text in line]

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not matching("sleep 297") and time.monotonic() < deadline:
            time.sleep(0.1)
        sessions = matching(f"sshd: {USER}@notty")
        assert sessions and matching("sleep 297")
        host.exec(["kill", *sessions])
        thread.join(timeout=20)
        assert not thread.is_alive()
    finally:
        if matching("sleep 297"):
            host.exec(["kill", *matching("sleep 297")])
    assert len(errors) == 1 and isinstance(errors[0], SshError), errors
    assert "was lost while sleep ran" in str(errors[0])
    assert runner.run(["echo", "again"]).stdout == "again\n"


@pytest.mark.docker
def test_a_hardened_transient_unit_runs_under_systemd(runner: SshProcessRunner) -> None:
    assert runner.run(["cat", "/proc/1/comm"]).stdout == "systemd\n"
    probe = "id -un; grep NoNewPrivs /proc/self/status; touch /usr/lf-probe 2>/dev/null || echo read-only"
    result = runner.run(
        [
            "sudo",
            "-n",
            "systemd-run",
            "--wait",
            "--pipe",
            "--quiet",
            "-p",
            f"User={USER}",
            "-p",
            "NoNewPrivileges=yes",
            "-p",
            "ProtectSystem=strict",
            "-p",
            "PrivateTmp=yes",
            "-p",
            "ProtectHome=yes",
            "sh",
            "-c",
            probe,
        ],
    )
    assert result.stdout.splitlines() == [USER, "NoNewPrivs:\t1", "read-only"]


# File transfer


class CancelAfter(CancelToken):
    """Cancels itself on the ``checks``-th check: a transfer interrupted after some chunks."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.left = checks

    def raise_if_cancelled(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.cancel()
        super().raise_if_cancelled()


@pytest.mark.docker
def test_put_get_round_trip_verified_and_skipped_when_identical(
    runner: SshProcessRunner, tmp_path: Path
) -> None:
    local = tmp_path / "llama-server"
    local.write_bytes(os.urandom(3_000_000))
    local.chmod(0o755)
    remote = f"/home/{USER}/put-{os.getpid()}/bin/llama-server"
    sent = runner.put(local, remote)
    assert not sent.skipped and sent.sent_bytes == 3_000_000 and sent.resumed_from == 0
    assert runner.sha256(remote) == sent.sha256 == hashlib.sha256(local.read_bytes()).hexdigest()
    assert runner.run(["stat", "-c", "%a", remote]).stdout == "755\n"
    assert runner.run(["test", "-e", remote + ".part"], warn=True).exit_code == 1
    again = runner.put(local, remote)
    assert again.skipped and again.sent_bytes == 0
    back = tmp_path / "back" / "llama-server"
    fetched = runner.get(remote, back)
    assert back.read_bytes() == local.read_bytes() and fetched.sha256 == sent.sha256
    assert stat.S_IMODE(back.stat().st_mode) == 0o755
    assert runner.get(remote, back).skipped
    with pytest.raises(SshError):
        runner.get(remote + ".missing", tmp_path / "missing")


@pytest.mark.docker
def test_get_drops_setuid_setgid_and_sticky_bits(runner: SshProcessRunner, tmp_path: Path) -> None:
    local = tmp_path / "tool"
    local.write_bytes(b"#!/bin/sh\necho hi\n")
    remote = f"/home/{USER}/setid-{os.getpid()}/tool"
    runner.put(local, remote)
    runner.run(["chmod", "7755", remote])
    assert runner.run(["stat", "-c", "%a", remote]).stdout == "7755\n"
    back = tmp_path / "back" / "tool"
    runner.get(remote, back)
    assert stat.S_IMODE(back.stat().st_mode) == 0o755


@pytest.mark.docker
def test_an_interrupted_put_resumes_from_its_part(
    runner: SshProcessRunner, host: TestHost, tmp_path: Path
) -> None:
    local = tmp_path / "model.gguf"
    local.write_bytes(os.urandom(4_000_000))
    remote = f"/home/{USER}/resume-{os.getpid()}/model.gguf"
    with pytest.raises(Cancelled):
        runner.put(local, remote, cancel=CancelAfter(4))
    assert runner.sha256(remote) is None
    kept = int(runner.run(["stat", "-c", "%s", remote + ".part"]).stdout)
    assert 0 < kept < 4_000_000
    resumed = runner.put(local, remote)
    assert resumed.resumed_from == kept and resumed.sent_bytes == 4_000_000 - kept
    assert runner.sha256(remote) == hashlib.sha256(local.read_bytes()).hexdigest()
    # a .part that is not this file's prefix: the sha256 check catches it and the file is sent again whole
    junk = tmp_path / "junk"
    junk.write_bytes(b"j" * 1000)
    runner.put(junk, remote + ".part")
    runner.run(["rm", remote])
    again = runner.put(local, remote)
    assert again.resumed_from == 0 and again.sent_bytes == (4_000_000 - 1000) + 4_000_000
    assert runner.sha256(remote) == hashlib.sha256(local.read_bytes()).hexdigest()


@pytest.mark.docker
def test_an_interrupted_get_resumes_from_its_part(runner: SshProcessRunner, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(2_000_000))
    remote = f"/home/{USER}/get-{os.getpid()}.bin"
    runner.put(source, remote)
    local = tmp_path / "fetched.bin"
    with pytest.raises(Cancelled):
        runner.get(remote, local, cancel=CancelAfter(3))
    kept = (tmp_path / "fetched.bin.part").stat().st_size
    assert 0 < kept < 2_000_000 and not local.exists()
    resumed = runner.get(remote, local)
    assert resumed.resumed_from == kept and resumed.sent_bytes == 2_000_000 - kept
    assert local.read_bytes() == source.read_bytes()
