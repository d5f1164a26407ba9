"""What the deploy commands say, through real ``invoke`` processes: an unknown ``--target`` gets "did you mean"
and every target of the registry (swarm included), ``--model`` must be named (``--model tiny`` for the smoke
model; ``/etc/passwd`` is refused), ``deploy.status`` and ``deploy.plan`` fail with exit 14 naming each host that
did not answer (a closed port on 127.0.0.1, a test host that refuses the key), SSH failures in words (never
paramiko's ``[Errno None]``), hints that name ``--hosts`` or the inventory the address came from, no
"Secsh channel N open FAILED" lines while a forward is refused, and no "None" where a host had no release."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from helpers import REPO, stub_gguf, unloadable_model
from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.deploy.hosts.ops import DeployFailed, target_names
from llamaforge.runners.ssh.connection import SshError, connect_failure
from testhosts import USER, TestHost, make_key, write_known_hosts

pytestmark = pytest.mark.quick

FAKE_BUILD = "f" * 32


def invoke(
    args: Sequence[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def clean(done: subprocess.CompletedProcess[str]) -> str:
    """stderr, checked for what must never show: a traceback, paramiko's errno text, a release called None."""
    text = done.stdout + done.stderr
    assert "Traceback" not in text, done.stderr
    assert "[Errno" not in text, text
    assert not re.search(r"\bNone\b", text), text
    return done.stderr


def first_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert lines, done
    return lines[0]


@pytest.fixture
def closed_ports() -> Iterator[list[int]]:
    """Two ports on 127.0.0.1 that refuse connections: bound (so nothing else takes them), never listening."""
    with socket.socket() as one, socket.socket() as two:
        one.bind(("127.0.0.1", 0))
        two.bind(("127.0.0.1", 0))
        yield [int(one.getsockname()[1]), int(two.getsockname()[1])]


@pytest.fixture
def closed_port(closed_ports: list[int]) -> int:
    return closed_ports[0]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A home of its own with a stand-in build (a manifest and a llama-server that never runs: nothing here
    reaches a host's switch), no SSH agent and no ~/.ssh of this machine's."""
    home = tmp_path / "lf-home"
    build = home / "builds" / FAKE_BUILD
    (build / "bin").mkdir(parents=True)
    (build / "manifest.json").write_text(json.dumps({"key": FAKE_BUILD, "backend": "cpu"}), encoding="utf-8")
    (build / "bin" / "llama-server").write_text("#!/bin/sh\nexit 1\n", encoding="utf-8")
    environ = {key: value for key, value in os.environ.items() if key not in ("SSH_AUTH_SOCK", "COLUMNS")}
    return {**environ, "LLAMAFORGE_HOME": str(home), "HOME": str(tmp_path)}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return stub_gguf(tmp_path / "m.gguf")


# --- targets and --model ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (
            ["deploy", "--hosts", "lf@127.0.0.1:1", "--build", "x", "--model", "tiny", "--target", "systmd"],
            "systemd",
        ),
        (["deploy.status", "--target", "swarmm"], "swarm"),
        (["deploy.status", "--hosts", "lf@127.0.0.1:1", "--target", "swarmm"], "swarm"),
        (["deploy.rollback", "--hosts", "lf@127.0.0.1:1", "--target", "dokcer"], "docker"),
    ],
    ids=["deploy-systmd", "status-swarmm", "status-swarmm-hosts", "rollback-dokcer"],
)
def test_an_unknown_target_gets_did_you_mean_and_every_target(
    args: list[str], meant: str, env: dict[str, str]
) -> None:
    done = invoke(args, env)
    clean(done)
    assert done.returncode == InvalidOption.exit_code, done.stderr
    line = first_line(done)
    assert f"did you mean {meant!r}?" in line and "no hosts given" not in done.stderr, line
    assert line.endswith("known: " + ", ".join(target_names())), line
    assert "swarm" in target_names() and {"systemd", "docker"} <= set(target_names())


@pytest.mark.parametrize("operation", ["deploy", "deploy.plan", "deploy.render"])
def test_the_model_must_be_named(operation: str, env: dict[str, str]) -> None:
    where = ["--target", "compose"] if operation == "deploy.render" else ["--hosts", "lf@127.0.0.1:1"]
    done = invoke([operation, *where, "--build", FAKE_BUILD], env)
    clean(done)
    assert done.returncode == InvalidOption.exit_code, done.stderr
    assert "--model: Field required" in first_line(done)
    assert not (Path(env["LLAMAFORGE_HOME"]) / "models").exists()  # no tiny model was written in its place
    help_text = " ".join(invoke([operation, "--help"], env).stdout.split())
    assert "`tiny`" in help_text and "random-weight" in help_text


def test_a_file_that_is_no_model_is_refused_before_any_host(env: dict[str, str], closed_port: int) -> None:
    done = invoke(
        [
            "deploy.plan",
            "--hosts",
            f"{USER}@127.0.0.1:{closed_port}",
            "--build",
            FAKE_BUILD,
            "--model",
            "/etc/passwd",
            "--no-probe",
        ],
        env,
    )
    clean(done)
    assert done.returncode == ModelError.exit_code, done.stderr
    assert "/etc/passwd is not a GGUF model" in first_line(done)


# --- hosts that do not answer ----------------------------------------------------------------------------------


def test_status_of_a_closed_port_fails_naming_the_host_in_words(
    env: dict[str, str], closed_port: int
) -> None:
    address = f"{USER}@127.0.0.1:{closed_port}"
    done = invoke(["deploy.status", "--hosts", address, "--json"], env)
    stderr = clean(done)
    assert done.returncode == SshError.exit_code, stderr
    assert first_line(done) == (
        f"failed: deploy.status: no host answered: cannot reach {address}: connection refused (nothing listens "
        "on that port)"
    )
    hint = stderr.splitlines()[1]
    assert "--hosts" in hint and "inventory" not in hint and f"port {closed_port}" in hint, hint
    result = json.loads(done.stdout)  # the report still comes out, the verdict in it
    assert [(host["host"], host["reachable"]) for host in result["hosts"]] == [(address, False)]


def test_a_hint_names_the_inventory_the_address_came_from(
    env: dict[str, str], closed_port: int, tmp_path: Path
) -> None:
    inventory = tmp_path / "lab.toml"
    inventory.write_text(
        f'user = "{USER}"\n\n[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {closed_port}\n',
        encoding="utf-8",
    )
    done = invoke(["deploy.status", "--inventory", str(inventory)], env)
    stderr = clean(done)
    assert done.returncode == SshError.exit_code, stderr
    assert f"the address in the inventory {inventory}" in stderr and "--hosts" not in stderr, stderr


def test_a_plan_whose_hosts_do_not_answer_fails(
    env: dict[str, str], closed_ports: list[int], model: Path
) -> None:
    hosts = ",".join(f"{USER}@127.0.0.1:{port}" for port in closed_ports)
    done = invoke(
        ["deploy.plan", "--hosts", hosts, "--build", FAKE_BUILD, "--model", str(model), "--no-probe"], env
    )
    stderr = clean(done)
    assert done.returncode == SshError.exit_code, stderr
    line = first_line(done)
    assert (
        line.startswith("failed: deploy.plan: no host answered: ") and line.count("connection refused") == 2
    )


def test_connection_failures_are_words() -> None:
    import paramiko

    refused = paramiko.ssh_exception.NoValidConnectionsError(
        {
            ("127.0.0.1", 1): ConnectionRefusedError(111, "Connection refused"),
            ("::1", 1, 0, 0): ConnectionRefusedError(111, "Connection refused"),
        }
    )
    assert "Errno" in str(refused)  # paramiko's own text, which must not reach a message
    assert connect_failure(refused) == "connection refused (nothing listens on that port)"
    assert connect_failure(TimeoutError("timed out")) == "timed out (no answer from the host)"
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert connect_failure(unknown) == "name not known"
    assert connect_failure(EOFError()) == "the host closed the connection before SSH started"


# --- on a real test host ---------------------------------------------------------------------------------------


@pytest.fixture
def host_access(test_hosts: list[TestHost], tmp_path: Path) -> dict[str, str]:
    known = write_known_hosts(tmp_path / "known_hosts", test_hosts[:1])
    return {
        "address": f"{USER}@127.0.0.1:{test_hosts[0].port}",
        "known": str(known),
        "key": str(test_hosts[0].key_file),
    }


@pytest.mark.docker
def test_status_fails_when_the_host_refuses_the_key(
    env: dict[str, str], host_access: dict[str, str], tmp_path: Path
) -> None:
    stranger = make_key(tmp_path / "stranger")
    done = invoke(
        [
            "deploy.status",
            "--hosts",
            host_access["address"],
            "--ssh-key",
            str(stranger),
            "--known-hosts",
            host_access["known"],
        ],
        env,
    )
    stderr = clean(done)
    assert done.returncode == SshError.exit_code, stderr
    assert first_line(done).startswith(
        f"failed: deploy.status: no host answered: {host_access['address']} refused the key {stranger}"
    ), stderr
    assert "authorized_keys" in stderr.splitlines()[1]


@pytest.mark.docker
def test_status_fails_when_one_host_of_two_does_not_answer(
    env: dict[str, str], host_access: dict[str, str], closed_port: int
) -> None:
    lost = f"{USER}@127.0.0.1:{closed_port}"
    done = invoke(
        [
            "deploy.status",
            "--hosts",
            f"{host_access['address']},{lost}",
            "--ssh-key",
            host_access["key"],
            "--known-hosts",
            host_access["known"],
            "--json",
        ],
        env,
    )
    stderr = clean(done)
    assert done.returncode == SshError.exit_code, stderr
    assert first_line(done).startswith(
        f"failed: deploy.status: 1 of 2 hosts did not answer: cannot reach {lost}"
    )
    hosts = json.loads(done.stdout)["hosts"]
    assert [(host["host"], host["reachable"]) for host in hosts] == [
        (host_access["address"], True),
        (lost, False),
    ]
    alone = invoke(
        [
            "deploy.status",
            "--hosts",
            host_access["address"],
            "--ssh-key",
            host_access["key"],
            "--known-hosts",
            host_access["known"],
        ],
        env,
    )
    assert alone.returncode == 0, (
        alone.stderr
    )  # the host answers: no deployment there is a status, not a failure


FORWARD_SCRIPT = textwrap.dedent("""\
    import socket, sys
    from llamaforge.runners.ssh import SshProcessRunner
    from llamaforge.runners.ssh.connection import SshHost
    from llamaforge.runners.ssh.forward import forward_local
    from pathlib import Path

    port, key, known, closed = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    with SshProcessRunner(SshHost("127.0.0.1", port, "lf", key, known), user_known_hosts=None) as runner:
        transport = runner.connection.transport
        try:  # paramiko's own channel, refused: it logs the refusal
            transport.open_channel("direct-tcpip", ("127.0.0.1", closed), ("127.0.0.1", 0), timeout=10)
        except Exception:
            pass
        print("forwarding", file=sys.stderr, flush=True)
        with forward_local(runner, closed) as local:  # as the health gate polls a server that is starting
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", local), timeout=10) as conn:
                    conn.settimeout(10)
                    assert conn.recv(1) == b""  # refused on the host: this side's connection is closed
    print("done", file=sys.stderr, flush=True)
""")


@pytest.mark.docker
def test_a_refused_forward_prints_nothing_on_stderr(
    host_access: dict[str, str], test_hosts: list[TestHost], closed_port: int, env: dict[str, str]
) -> None:
    # the closed port is on this machine; on the host nothing listens on that number either
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FORWARD_SCRIPT,
            str(test_hosts[0].port),
            host_access["key"],
            host_access["known"],
            str(closed_port),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    before, _, after = done.stderr.partition("forwarding")
    assert "open FAILED: Connection refused" in before, done.stderr  # paramiko does log it, unfiltered
    assert after.strip() == "done", done.stderr  # five refused forwards, not one line about them


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_failed_gate_on_a_host_with_no_release_says_so(
    host_access: dict[str, str],
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    test_hosts: list[TestHost],
) -> None:
    """A first deploy whose gate fails (a model of an architecture llama.cpp does not know): no "restoring
    None" or "still on None", and no paramiko line while the gate polls."""
    broken = unloadable_model(tmp_path / "unknown-arch.gguf")
    name = f"msg{os.getpid() % 10000}"
    # A wide console: the table wraps the message inside its cell otherwise, how depends on the names' lengths.
    environ = {**build_env, "HOME": str(tmp_path), "COLUMNS": "400"}
    environ.pop("SSH_AUTH_SOCK", None)
    try:
        done = invoke(
            [
                "deploy",
                "--hosts",
                host_access["address"],
                "--ssh-key",
                host_access["key"],
                "--known-hosts",
                host_access["known"],
                "--build",
                patched_build.name,
                "--model",
                str(broken),
                "--name",
                name,
                "--port",
                str(21000 + os.getpid() % 2000),
                "--gate-timeout-s",
                "60",
                "--no-probe",
            ],
            environ,
            timeout=600,
        )
    finally:
        test_hosts[0].exec(["systemctl", "stop", f"llamaforge-{name}.service"])
    stderr = clean(done)
    assert done.returncode == DeployFailed.exit_code, stderr
    assert "no previous release to restore" in stderr, stderr
    assert "no earlier release to go back to, so the service was stopped" in " ".join(done.stdout.split())
    assert "Secsh channel" not in stderr, stderr
