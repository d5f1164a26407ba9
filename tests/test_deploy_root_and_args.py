"""Deploy as root on a host without sudo, and ``--server-args`` (deploy, deploy.plan, deploy.render, smoke).

The flags are checked against the real ``llama-server --help`` of the suite's shared patched CPU build
(the `patched_build` fixture). On the session's systemd + sshd test hosts (tests/testhosts.py)
sudo is hidden for the test, root is given the session's key, and a deploy as ``root@host`` installs, starts and
gates the release there with the extra flags reaching llama-server (``--alias``, read back from ``/v1/models``),
while a deploy user without sudo, or whose sudo asks for a password, is refused before anything changes.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamaforge.core.errors import InvalidOption, LlamaforgeError, OperationFailed
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.manifests.files import render_compose, render_kubernetes
from llamaforge.deploy.release import OWNED_FLAGS, Layout
from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.deploy.targets.container import ContainerImage, render_container
from llamaforge.deploy.targets.systemd import render_unit
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.connection import SshHost
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.serve.launcher import LlamaFlags, request_json
from llamaforge.serve.server_args import (
    check_server_args,
    precheck_server_args,
    server_help,
    server_options,
    split_server_args,
)
from llamaforge.smoke.ops import SMOKE_FLAGS
from test_hostile_renders import IDS, INPUTS, PAYLOADS, SPEC, run_script, unescaped
from testhosts import USER, TestHost, write_known_hosts

pytestmark = pytest.mark.quick


def run(operation: str, **arguments: Any) -> Any:
    op = operations()[operation]
    return op.run(op.params(**arguments), OperationContext())


@pytest.fixture(scope="module")
def store_build(patched_build: Path, build_env: dict[str, str]) -> tuple[str, str]:
    """(LLAMAFORGE_HOME, key) of the suite's patched default CPU build: the one every deploy test shares (made
    once per session, or reused from LLAMAFORGE_TEST_HOME)."""
    return build_env["LLAMAFORGE_HOME"], patched_build.name


@pytest.fixture
def in_store(store_build: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The build's key, with LLAMAFORGE_HOME on its store."""
    monkeypatch.setenv("LLAMAFORGE_HOME", store_build[0])
    return store_build[1]


def binary(key: str) -> Path:
    from llamaforge.build.store import build_dir

    return build_dir(key) / "bin" / "llama-server"


# The checks, against the build's own help


@pytest.mark.llamacpp
def test_the_builds_help_is_parsed_and_kept_per_build(
    store_build: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, key = store_build
    server = Path(home) / "builds" / key / "bin" / "llama-server"
    monkeypatch.setenv("LLAMAFORGE_HOME", str(tmp_path))  # a cache of its own
    options = server_options(server, key)
    assert options["-c"].names == ("-c", "--ctx-size") and options["-c"].values == 1
    assert options["--jinja"].names == ("--jinja", "--no-jinja") and options["--jinja"].values == 0
    assert options["--control-vector-layer-range"].values == 2  # START END
    assert options["-ot"].values == 1  # a placeholder with spaces is one value
    assert "--no-repack" in options["--repack"].names and "--no-webui" in options["--ui"].names
    assert "mlock" in options["--load-mode"].help
    assert len({option.names for option in options.values()}) > 200
    cached = tmp_path / "cache" / "server-help" / f"{key}.txt"
    assert cached.is_file() and "--ctx-size" in cached.read_text(encoding="utf-8")
    # read from the cache from now on: the binary is not run again (here it does not even exist)
    assert server_help(tmp_path / "gone" / "llama-server", key) == server_help(server, key)


ACCEPTED = [
    ("--jinja --alias 'my model'", ("--jinja", "--alias", "my model")),
    ("--chat_template_file /srv/t.jinja -lm mlock", ("--chat-template-file", "/srv/t.jinja", "-lm", "mlock")),
    (
        "--control-vector-layer-range 1 2 --seed -1",
        ("--control-vector-layer-range", "1", "2", "--seed", "-1"),
    ),
    ("  ", ()),
    # values the help pins down, in every form llama.cpp reads them
    (
        "--temp 0.7 --top-k 40 --rope-freq-base 1e6 -sps .5",
        ("--temp", "0.7", "--top-k", "40", "--rope-freq-base", "1e6", "-sps", ".5"),
    ),
    ("--poll 50 --cpu-strict 1 -ngld auto", ("--poll", "50", "--cpu-strict", "1", "-ngld", "auto")),
    (
        "--reasoning off --log-colors true --rope-scaling yarn -ctkd q8_0",
        ("--reasoning", "off", "--log-colors", "true", "--rope-scaling", "yarn", "-ctkd", "q8_0"),
    ),
]
REFUSED = [  # text, words of the message and hint
    ("--mlock", "not a flag of this build's llama-server", "did you mean '--load-mode'"),
    ("--jnja", "not a flag", "'--jinja'"),
    ("--ctx-size 4096", "-c, --ctx-size", "llamaforge sets it: --ctx"),
    ("-m /etc/passwd", "-m, --model", "--model"),
    ("--host 0.0.0.0", "--host", "--listen"),
    ("--webui", "--no-webui", "without the web UI"),
    ("--no-repack", "cannot be given", "--no-repack"),
    ("--api-key s3cret", "--api-key", "no secret"),
    ("--api-key=s3cret", "--api-key cannot be given", "no secret"),  # the value is not repeated
    ("--alias=x", "--alias=… is not how llama-server takes a value", "write --alias VALUE"),
    ("-hft hf_abc", "-hft, --hf-token", "no secret"),
    ("--hf-repo a/b", "--hf-repo", "sets the model"),
    ("--fim-qwen-7b-default", "cannot be given", "downloads"),
    ("-mu https://example.invalid/m.gguf", "--model-url", "sets the model"),
    ("-mmu https://example.invalid/p.gguf", "--mmproj-url", "downloads"),
    ("--tools all", "--tools", "run tools"),
    ("--path /", "--path", "files"),
    ("--version", "--version", "exit"),
    ("--alias", "needs a value (STRING)", "--alias STRING"),
    ("--control-vector-layer-range 1", "needs 2 values (START END)", ""),
    ("--jinja 1", "'1' is no flag, and --jinja before it takes no value", ""),
    ("jinja", "'jinja' is no flag", ""),
    ("--alias 'x", "cannot be split", "quote"),
    ("--alias a\nb", "control character", "one line"),
    ("--temp hot", "--temp takes a number, not 'hot'", "--temp N: temperature"),
    ("--top-k 4O", "--top-k takes a number, not '4O'", ""),
    ("--seed 0x10", "--seed takes a number", "RNG seed"),
    ("-ngld most", "-ngld takes a number, 'auto' or 'all', not 'most'", ""),
    ("--reasoning maybe", "--reasoning takes on, off or auto, not 'maybe'", "[on|off|auto]"),
    ("--rope-scaling quadratic", "takes one of none, linear, yarn, not 'quadratic'", ""),
    ("-ctkd q3_k", "-ctkd takes one of f32, f16, bf16, q8_0", "allowed values"),
]


@pytest.mark.llamacpp
def test_server_args_are_read_against_the_builds_flags(in_store: str) -> None:
    options = server_options(binary(in_store), in_store)
    for text, expected in ACCEPTED:
        assert check_server_args(split_server_args(text), options, OWNED_FLAGS) == expected
    for text, message, hint in REFUSED:
        with pytest.raises(InvalidOption) as refused:
            check_server_args(split_server_args(text), options, OWNED_FLAGS)
        assert message in refused.value.message and hint in (refused.value.hint or ""), (text, refused.value)
        assert "\n" not in refused.value.message and "s3cret" not in refused.value.render()
    # smoke sets other flags than a deployment: --no-repack is free there, the slots' context is not
    assert check_server_args(("--no-repack",), options, SMOKE_FLAGS) == ("--no-repack",)
    for text in ("-c 512", "--threads 2", "-tb 2", "--log-verbosity 1", "-np 4"):
        with pytest.raises(InvalidOption, match="cannot be given"):
            check_server_args(split_server_args(text), options, SMOKE_FLAGS)


def test_what_is_refused_whatever_the_build_is_refused_before_one_exists() -> None:
    for text in ("--api-key x", "-c 4096", "--alias 'x", "--tools all", "--help", "--api-key=s3cret"):
        with pytest.raises(InvalidOption) as refused:
            precheck_server_args(text, SMOKE_FLAGS)
        assert "s3cret" not in refused.value.render()
    assert precheck_server_args("--jinja --alias x", SMOKE_FLAGS) == ("--jinja", "--alias", "x")


def test_a_kept_help_that_was_cut_or_damaged_is_asked_again(lf_home: Path, tmp_path: Path) -> None:
    """A kept help cut short (or emptied) since made every flag after the cut "not a flag of this build's
    llama-server"; one that is no UTF-8 raised UnicodeDecodeError."""
    server = tmp_path / "llama-server"
    server.write_text(
        '#!/bin/sh\necho run >> "$0.runs"\nprintf -- "--port N   port\\n--jinja    templates\\n"\n',
        encoding="utf-8",
    )
    server.chmod(0o755)
    key = "e" * 32
    first = server_help(server, key)
    assert "--jinja" in first and server_help(server, key) == first  # kept: asked once
    cached = lf_home / "cache" / "server-help" / f"{key}.txt"
    whole = cached.read_bytes()
    for damage in (b"", whole[: whole.index(b"--jinja")], b"\xff\xfe", first.encode()):
        cached.write_bytes(damage)
        assert server_help(server, key) == first
        assert cached.read_bytes() == whole  # kept again, whole
    assert len(Path(f"{server}.runs").read_text(encoding="utf-8").split()) == 5


# Every rendered file hands llama-server exactly the extra flags


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_extra_flags_reach_every_file_exactly(payload: str, tmp_path: Path) -> None:
    spec = replace(SPEC, flags=LlamaFlags(extra=("--alias", payload, "--jinja")))
    script = render_container(spec, Layout("lab"), ContainerImage(f"sha256:{'e' * 64}", "tag"))
    docker = [
        args
        for name, args in run_script(script, tmp_path, ("docker", "id", "readlink"), "sh")
        if name == "docker"
    ]
    assert docker[-1][-4:] == ["--no-webui", "--alias", payload, "--jinja"], docker
    compose = yaml.safe_load(render_compose(spec, INPUTS))["services"]["llama-server"]
    assert unescaped(compose["command"])[-3:] == ["--alias", payload, "--jinja"]
    _service, deployment = yaml.safe_load_all(render_kubernetes(spec, INPUTS))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert unescaped(container["args"])[-3:] == ["--alias", payload, "--jinja"]
    try:
        unit = render_unit(spec, Layout("lab"))
    except LlamaforgeError:  # a % (a specifier) or a newline (--server-args never holds one)
        assert "%" in payload or "\n" in payload
        return
    assert len(unit.splitlines()) == len(render_unit(SPEC, Layout("lab")).splitlines())
    assert "--jinja" in next(line for line in unit.splitlines() if line.startswith("ExecStart="))


@pytest.mark.llamacpp
def test_deploy_render_passes_server_args_and_refuses_unknown_ones(in_store: str, tiny_qwen3: Path) -> None:
    base = {"build": in_store, "model": str(tiny_qwen3), "name": "lab"}
    for target in ("systemd", "compose", "kubernetes"):
        files = run("deploy.render", **base, target=target, server_args="--jinja --alias 'lab model'").files
        (text,) = files.values()
        assert "--jinja" in text and "lab model" in text, (target, text)
    with pytest.raises(InvalidOption, match="--jnja is not a flag"):
        run("deploy.render", **base, target="systemd", server_args="--jnja")


@pytest.mark.llamacpp
def test_an_unknown_server_flag_is_refused_before_any_host_is_reached(
    in_store: str, tiny_qwen3: Path
) -> None:
    with socket.socket() as probe:  # a host that would be unreachable: reaching it would fail differently
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    for operation in ("deploy.plan", "deploy"):
        with pytest.raises(InvalidOption, match="--mlock is not a flag") as refused:
            run(
                operation,
                hosts=f"{USER}@127.0.0.1:{closed}",
                build=in_store,
                model=str(tiny_qwen3),
                server_args="--jinja --mlock",
            )
        assert "--load-mode" in (refused.value.hint or "")


# Smoke


@pytest.mark.llamacpp
def test_smoke_passes_server_args_to_llama_server(in_store: str) -> None:
    report = run(
        "smoke",
        build=in_store,
        skip_bench=True,
        concurrency=[1],
        requests=1,
        max_tokens=4,
        server_args="--jinja --alias smoke-alias",
    )
    assert report.verdict.passed
    assert report.server["command"][-3:] == ["--jinja", "--alias", "smoke-alias"]
    with pytest.raises(InvalidOption, match="cannot be given"):
        run("smoke", build=in_store, skip_bench=True, server_args="--parallel 8")
    with pytest.raises(InvalidOption, match="--skip-server"):
        run("smoke", build=in_store, skip_server=True, server_args="--jinja")


# On a test host: root without sudo, and a deploy user without it


@pytest.fixture
def sudoless(
    test_hosts: list[TestHost], in_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """The first test host with sudo hidden and root given the session's key; a deployment name and port of
    this test's own. Everything is put back afterwards and the deployment removed."""
    host = test_hosts[0]
    monkeypatch.setenv("HOME", str(tmp_path))  # never this machine's ~/.ssh/known_hosts
    known = write_known_hosts(tmp_path / "known_hosts", [host])
    name = f"root{os.getpid() % 10000}"
    port = 20000 + os.getpid() % 2000
    setup = (
        "install -d -m 0700 /root/.ssh && install -m 0600 /home/lf/.ssh/authorized_keys /root/.ssh/"
        "authorized_keys && mv /usr/bin/sudo /usr/bin/sudo.hidden"
    )
    code, output = host.exec(["sh", "-c", setup])
    assert code == 0, output
    try:
        yield {
            "host": host,
            "known": known,
            "name": name,
            "port": port,
            "build": in_store,
            "access": {"ssh_key": str(host.key_file), "known_hosts": str(known), "name": name},
        }
    finally:
        host.exec(
            [
                "sh",
                "-c",
                f"mv /usr/bin/sudo.hidden /usr/bin/sudo; rm -f /root/.ssh/authorized_keys; "
                f"systemctl disable --now llamaforge-{name}.service; rm -f /etc/systemd/system/llamaforge-{name}"
                f".service; systemctl daemon-reload; rm -rf /opt/llamaforge/{name}",
            ]
        )


def nothing_there(host: TestHost, name: str) -> None:
    assert host.exec(["test", "-e", f"/opt/llamaforge/{name}"])[0] != 0
    assert host.exec(["test", "-e", f"/etc/systemd/system/llamaforge-{name}.service"])[0] != 0


@pytest.mark.docker
@pytest.mark.llamacpp
def test_root_deploys_without_sudo_and_another_user_is_refused_first(
    sudoless: dict[str, Any], tiny_qwen3: Path
) -> None:
    host, name, port, access = sudoless["host"], sudoless["name"], sudoless["port"], sudoless["access"]
    base = {
        **access,
        "build": sudoless["build"],
        "model": str(tiny_qwen3),
        "port": port,
        "gate_timeout_s": 120,
    }
    assert host.exec(["sh", "-c", "command -v sudo"])[0] != 0

    # the deploy user lf, with no sudo on the host: refused while planning, nothing changed
    as_user = {**base, "hosts": f"{USER}@127.0.0.1:{host.port}"}
    plan = run("deploy.plan", **as_user)
    assert isinstance(plan, DeployPlanResult)
    assert "there is no sudo there" in plan.hosts[0].detail and "root@127.0.0.1" in plan.hosts[0].detail
    with pytest.raises(OperationFailed) as refused:
        run("deploy", **as_user)
    report = refused.value.result
    assert isinstance(report, DeployResult) and report.hosts[0].status == "failed"
    assert "passwordless sudo" in report.hosts[0].detail and refused.value.exit_code == 15
    nothing_there(host, name)
    # sudo there, but it asks lf for a password
    code, output = host.exec(
        ["sh", "-c", "mv /usr/bin/sudo.hidden /usr/bin/sudo && mv /etc/sudoers.d/lf /root/lf.sudoers"]
    )
    assert code == 0, output
    try:
        with pytest.raises(OperationFailed) as refused:
            run("deploy", **as_user)
        assert "password is required" in refused.value.result.hosts[0].detail
    finally:
        host.exec(
            ["sh", "-c", "mv /root/lf.sudoers /etc/sudoers.d/lf && mv /usr/bin/sudo /usr/bin/sudo.hidden"]
        )
    nothing_there(host, name)

    # root, on the same host without sudo: installed, started, gated, and the extra flags reach llama-server
    as_root = {**base, "hosts": f"root@127.0.0.1:{host.port}", "server_args": "--jinja --alias lf-root-alias"}
    started = time.monotonic()
    deployed = run("deploy", **as_root)
    assert isinstance(deployed, DeployResult) and deployed.passed, deployed
    (item,) = deployed.hosts
    assert item.status == "updated" and item.health_s is not None
    root = f"/opt/llamaforge/{name}"
    assert host.exec(["readlink", f"{root}/current"])[1].strip() == f"releases/{deployed.release}"
    _code, shown = host.exec(
        ["systemctl", "show", "-p", "ActiveState", "-p", "User", f"llamaforge-{name}.service"]
    )
    assert sorted(shown.split()) == ["ActiveState=active", "User=llamaforge"]
    _code, unit = host.exec(["cat", f"/etc/systemd/system/llamaforge-{name}.service"])
    assert "--jinja --alias lf-root-alias" in unit
    ssh = SshHost("127.0.0.1", host.port, "root", host.key_file, sudoless["known"])
    with SshProcessRunner(ssh, user_known_hosts=None) as opened, forward_local(opened, port) as local:
        status, models = request_json(local, "GET", "/v1/models", timeout=10)
    assert status == 200 and [entry["id"] for entry in models["data"]] == ["lf-root-alias"], models
    status_report = run("deploy.status", **access, hosts=f"root@127.0.0.1:{host.port}")
    assert isinstance(status_report, DeployStatusResult)
    (state,) = status_report.hosts
    assert (state.current, state.active, state.healthy) == (deployed.release, "active", True)
    assert state.flags[-3:] == ["--jinja", "--alias", "lf-root-alias"]
    again = run("deploy.plan", **as_root)
    assert again.hosts[0].action == "none" and again.hosts[0].flags_after[-3:] == [
        "--jinja",
        "--alias",
        "lf-root-alias",
    ]
    print(f"\ndeploy as root without sudo: {time.monotonic() - started:.1f} s")
