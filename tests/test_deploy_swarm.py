"""``deploy --target swarm``: the service definition and the SDK arguments it becomes (no engine), then a real
single-node swarm on this engine: two replicas of the suite's CPU build queried, a good update, Swarm's
rollback on request, and an update whose model does not load, which Swarm rolls back by itself."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import unloadable_model
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.release import DEFAULT_PORT, ReleaseSpec
from llamaforge.deploy.report import DeployResult, DeployStatusResult, SwarmReport
from llamaforge.deploy.swarm.service import (
    LABEL_RELEASE,
    monitor_window_s,
    service_name,
    slot_tasks,
    swarm_release,
)
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.runners.swarm import remove_service, service_arguments
from llamaforge.serve.launcher import LlamaFlags


def spec(**changes: Any) -> ReleaseSpec:
    base = ReleaseSpec(
        build_key="k" * 32,
        build_dir=Path("/nowhere"),
        manifest_sha256="a" * 64,
        model=Path("/m.gguf"),
        model_sha256="b" * 64,
        model_size=3 * 2**30,
    )
    return replace(base, **changes)


def run(operation: str, **arguments: Any) -> Any:
    op = operations()[operation]
    return op.run(op.params(**arguments), OperationContext())


# No engine needed


def test_the_service_sets_every_update_and_rollback_field_and_a_health_check_sized_to_the_model() -> None:
    release = swarm_release(spec(), "web", "llamaforge/llama-server:" + "k" * 32, replicas=3, parallelism=2)
    definition = release.definition
    probe = definition.health
    assert probe.start_period_s == 30 + 30 * 3  # the gate's wait for a 3 GiB model
    assert definition.update.monitor_s >= probe.start_period_s + probe.interval_s * probe.retries
    arguments = service_arguments(definition)
    assert dict(arguments["update_config"]) == {
        "Parallelism": 2,
        "Delay": 2_000_000_000,
        "FailureAction": "rollback",
        "Monitor": int(monitor_window_s(probe) * 1e9),
        "MaxFailureRatio": 0.0,
        "Order": "start-first",
    }
    assert dict(arguments["rollback_config"]) == {
        **dict(arguments["update_config"]),
        "FailureAction": "pause",
    }
    container = arguments["task_template"]["ContainerSpec"]
    assert (
        container["Healthcheck"]["StartPeriod"] == 120 * 10**9
        and "/health" in container["Healthcheck"]["Test"][1]
    )
    assert container["Mounts"] == [
        {"Target": "/models/model.gguf", "Source": "/m.gguf", "Type": "bind", "ReadOnly": True},
        {"Target": "/tmp", "Source": None, "Type": "tmpfs", "ReadOnly": False},
    ]
    assert container["ReadOnly"] is True and container["CapabilityDrop"] == ["ALL"]
    assert (
        container["Labels"][LABEL_RELEASE] == release.id and arguments["mode"]["replicated"]["Replicas"] == 3
    )
    assert arguments["endpoint_spec"].get("Ports") in (None, [])  # nothing published unless asked
    assert arguments["task_template"]["Networks"] == [{"Target": "llamaforge-web"}]  # its own overlay network
    assert "Resources" not in arguments["task_template"] or not arguments["task_template"]["Resources"]

    with pytest.raises(InvalidOption, match="API key"):  # every interface of every node: never keyless
        swarm_release(spec(), "web", "img", replicas=2, publish=9000)
    secret = ("s3cr3tid", "llamaforge-web-api-key-0123456789ab")
    gpu = swarm_release(
        spec(), "web", "img", replicas=2, gpus=1, publish=9000, api_key_secret=secret
    ).definition
    gpu_arguments = service_arguments(gpu)
    assert gpu.args[-2:] == ("--api-key-file", "/run/secrets/api-key")
    assert gpu_arguments["task_template"]["ContainerSpec"]["Secrets"] == [
        {
            "SecretID": "s3cr3tid",
            "SecretName": secret[1],
            "File": {"Name": "api-key", "UID": "10001", "GID": "10001", "Mode": 0o400},
        }
    ]
    assert gpu.update.order == gpu.rollback.order == "stop-first"  # a whole GPU cannot host old and new
    assert gpu_arguments["task_template"]["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}
    ]
    assert gpu_arguments["endpoint_spec"]["Ports"] == [
        {"Protocol": "tcp", "PublishedPort": 9000, "TargetPort": 8080, "PublishMode": "ingress"}
    ]

    assert swarm_release(spec(flags=LlamaFlags(ctx=512)), "web", "img", replicas=1).id != release.id
    with pytest.raises(InvalidOption):
        swarm_release(spec(), "web", "img", replicas=0)


def test_each_slot_is_the_task_swarm_wants_running_even_when_a_failed_one_is_newer() -> None:
    def task(ident: str, slot: int, created: str, desired: str, state: str) -> dict[str, Any]:
        return {
            "ID": ident,
            "Slot": slot,
            "CreatedAt": created,
            "DesiredState": desired,
            "Status": {"State": state},
        }

    old = task("old", 2, "2026-12-01T10:00:00Z", "running", "running")
    failed = task("new", 2, "2026-12-01T10:05:00Z", "shutdown", "failed")  # a start-first update's task
    chosen = slot_tasks([failed, task("one", 1, "2026-12-01T10:00:00Z", "running", "running"), old])
    assert list(chosen) == [1, 2] and chosen[2] == (old, [old, failed])
    gone = task("gone", 3, "2026-12-01T10:06:00Z", "shutdown", "shutdown")
    assert slot_tasks([failed, gone])[3][0] is gone and slot_tasks([failed])[2][0] is failed


def test_swarm_takes_no_hosts_and_rolls_back_to_the_previous_spec_only() -> None:
    with pytest.raises(InvalidOption, match="not to hosts"):
        run("deploy.status", target="swarm", hosts="lf@127.0.0.1:2201")
    with pytest.raises(InvalidOption, match="Swarm plans and rolls its own"):
        run("deploy.plan", target="swarm", build="x", model="tiny")
    with pytest.raises(InvalidOption, match="previous spec only"):
        run("deploy.rollback", target="swarm", release="abc")


# On a real single-node swarm


@pytest.fixture(scope="session")
def swarm(docker_engine: Any) -> Iterator[Any]:
    """This engine as a swarm: initialised on 127.0.0.1 only when it is in none, and left only then (with the
    docker_gwbridge network the init made)."""
    state = docker_engine.info()["Swarm"]["LocalNodeState"]
    initialised = state == "inactive"
    bridge_before = bool(docker_engine.networks.list(names=["docker_gwbridge"]))
    if initialised:
        docker_engine.swarm.init(advertise_addr="127.0.0.1", listen_addr="127.0.0.1:2377")
    elif state != "active":
        pytest.skip(f"the engine's swarm state is {state}")
    yield docker_engine
    if initialised:
        docker_engine.swarm.leave(force=True)
        if not bridge_before:
            for network in docker_engine.networks.list(names=["docker_gwbridge"]):
                network.remove()


@pytest.fixture
def deployment(
    swarm: Any,
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """A deployment name of this test's own, a tiny model and a model that does not load; the service is
    removed afterwards."""
    vocab = os.environ.get("LLAMAFORGE_TEST_VOCAB", "")
    if not Path(vocab).is_file():
        pytest.skip("set LLAMAFORGE_TEST_VOCAB to llama.cpp's models/ggml-vocab-qwen2.gguf")
    monkeypatch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
    model = write_tiny_model(tmp_path / "tiny.gguf", TinyModelSpec(arch="qwen3"), Path(vocab)).path
    broken = unloadable_model(tmp_path / "unknown-arch.gguf")
    name = f"sw{os.getpid() % 100000}"
    yield {"name": name, "build": patched_build.name, "model": str(model), "broken": str(broken)}
    remove_service(service_name(name))
    assert service_name(name) not in [network.name for network in swarm.networks.list()]
    for secret in swarm.secrets.list(filters={"label": f"org.llamaforge.deployment={name}"}):
        secret.remove()  # a published service's API key
    (Path(build_env["LLAMAFORGE_HOME"]) / "keys" / f"swarm-{name}.api-key").unlink(missing_ok=True)


def answering(report: SwarmReport, release: str, replicas: int) -> None:
    assert [(task.state, task.release, task.healthy) for task in report.tasks] == [
        ("running", release, True)
    ] * replicas, report
    assert all(task.completion for task in report.tasks)


@pytest.mark.docker
@pytest.mark.llamacpp
def test_two_replicas_a_rollback_and_a_failed_update_that_swarm_rolls_back(
    deployment: dict[str, Any], swarm: Any
) -> None:
    common = {
        "target": "swarm",
        "name": deployment["name"],
        "build": deployment["build"],
        "replicas": 2,
        "gate_timeout_s": 30,
    }
    # gate_timeout_s is the health check's start period (and so most of each update's monitor window): the tiny
    # model loads in 1-15 s on a loaded 2-core machine
    first = run("deploy", **common, model=deployment["model"])
    assert isinstance(first, DeployResult) and first.passed and first.swarm is not None
    assert first.swarm.update_state is None and first.swarm.previous is None
    answering(first.swarm, str(first.release), 2)

    service = swarm.services.get(service_name(deployment["name"]))
    spec = service.attrs["Spec"]
    assert spec["UpdateConfig"]["FailureAction"] == "rollback" and spec["UpdateConfig"]["Parallelism"] == 1
    health = spec["TaskTemplate"]["ContainerSpec"]["Healthcheck"]
    assert spec["UpdateConfig"]["Monitor"] >= health["StartPeriod"] + health["Interval"] * health["Retries"]
    assert spec["TaskTemplate"]["ContainerSpec"]["Mounts"][0]["ReadOnly"] is True
    assert not service.attrs.get("Endpoint", {}).get("Ports")  # nothing published on the network

    again = run("deploy", **common, model=deployment["model"])
    assert again.release == first.release and again.swarm.update_state is None  # already current: no update

    second = run("deploy", **common, model=deployment["model"], ctx=1024)
    assert (
        second.passed and second.swarm.update_state == "completed" and second.swarm.previous == first.release
    )
    answering(second.swarm, str(second.release), 2)

    back = run("deploy.rollback", target="swarm", name=deployment["name"])
    assert back.passed and back.release == first.release
    assert back.swarm.update_state == "rollback_completed"
    answering(back.swarm, str(first.release), 2)

    started = time.monotonic()
    with pytest.raises(OperationFailed, match="Swarm rolled the update back by itself") as failed:
        run("deploy", **common, model=deployment["broken"])
    report = failed.value.result
    assert isinstance(report, DeployResult) and not report.passed and report.swarm is not None
    assert report.swarm.rolled_back and report.swarm.update_state == "rollback_completed"
    assert report.swarm.requested != first.release and report.swarm.release == first.release
    assert sum(task.failed_tasks for task in report.swarm.tasks) >= 1  # the new task did fail, and says why
    assert any(task.last_failure for task in report.swarm.tasks), report.swarm.tasks
    answering(report.swarm, str(first.release), 2)

    status = run("deploy.status", target="swarm", name=deployment["name"])
    assert isinstance(status, DeployStatusResult) and status.swarm is not None
    assert status.swarm.release == first.release and status.swarm.healthy == 2
    failed_s = time.monotonic() - started
    print(
        f"\nswarm: 2 replicas {first.swarm.wall_s:.1f} s; update {second.swarm.wall_s:.1f} s; rollback "
        f"{back.swarm.wall_s:.1f} s; failed update rolled back by Swarm {failed_s:.1f} s"
    )


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_published_service_asks_for_the_key_from_its_swarm_secret(
    deployment: dict[str, Any], swarm: Any
) -> None:
    import json

    from llamaforge.core.paths import home

    publish = 19000 + os.getpid() % 500
    report = run(
        "deploy",
        target="swarm",
        name=deployment["name"],
        build=deployment["build"],
        replicas=1,
        gate_timeout_s=30,
        model=deployment["model"],
        publish=publish,
    )
    assert report.passed and report.swarm is not None
    answering(report.swarm, str(report.release), 1)  # the completion check sent the key from inside
    key_file = home() / "keys" / f"swarm-{deployment['name']}.api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text(encoding="utf-8").strip()
    container = swarm.services.get(service_name(deployment["name"])).attrs["Spec"]["TaskTemplate"][
        "ContainerSpec"
    ]
    assert container["Args"][-2:] == ["--api-key-file", "/run/secrets/api-key"]
    assert key not in json.dumps(container)  # by reference only
    # Asked inside the task (the routing mesh of this engine need not reach 127.0.0.1 here): what any client on
    # the published port gets.
    (task,) = swarm.containers.list(
        filters={"label": f"com.docker.swarm.service.name={service_name(deployment['name'])}"}
    )
    body = json.dumps({"prompt": "a", "n_predict": 1})

    def ask(*header: str) -> str:
        argv = [
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-d",
            body,
            *header,
            f"http://127.0.0.1:{DEFAULT_PORT}/completion",
        ]
        return bytes(task.exec_run(argv).output).decode()

    assert ask() == "401" and ask("-H", "Authorization: Bearer wrong") == "401"
    assert ask("-H", f"Authorization: Bearer {key}") == "200"
