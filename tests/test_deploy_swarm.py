"""``deploy --target swarm``: the service definition and the SDK arguments it becomes (no engine), then a real
single-node swarm on this engine: two replicas of the suite's CPU build queried, a good update, Swarm's
rollback on request, and an update whose model does not load, which Swarm rolls back by itself."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import sigill_copy, unloadable_model
from llamaforge.core.errors import CacheError, InvalidOption, OperationFailed
from llamaforge.core.registry import OperationContext, operations
from llamaforge.deploy.hosts.prepared import ProbeModel
from llamaforge.deploy.hosts.probe import probe_args
from llamaforge.deploy.release import DEFAULT_PORT, ReleaseSpec
from llamaforge.deploy.report import DeployResult, DeployStatusResult, SwarmReport
from llamaforge.deploy.swarm.service import (
    LABEL_IMAGE,
    LABEL_PROBE,
    LABEL_RELEASE,
    PROBE_MOUNT,
    _node_probe,
    local_api_key,
    monitor_window_s,
    probe_job,
    service_name,
    slot_tasks,
    swarm_release,
)
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.runners.swarm import JobTask, job_arguments, remove_service, service_arguments
from llamaforge.serve.launcher import LlamaFlags

pytestmark = pytest.mark.quick


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
    tag = "llamaforge/llama-server:" + "k" * 32
    release = swarm_release(spec(), "web", "sha256:" + "a" * 64, tag=tag, replicas=3, parallelism=2)
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
    assert container["Image"] == "sha256:" + "a" * 64 and arguments["labels"][LABEL_IMAGE] == tag
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


_ROW = {
    "build_commit": "0c1e570",
    "build_number": 11312,
    "backends": "CPU",
    "model_type": "qwen3 ?B Q4_0",
    "model_size": 1000,
    "model_n_params": 2000,
    "stddev_ts": 0.0,
    "avg_ns": 1,
    "stddev_ns": 0,
}
BENCH_JSON = json.dumps(
    [
        {**_ROW, "n_prompt": 16, "n_gen": 0, "avg_ts": 812.5},
        {**_ROW, "n_prompt": 0, "n_gen": 4, "avg_ts": 95.0},
    ]
)  # the fields llama-bench -o json prints that the parser reads
LOADED = "load_backend: loaded CPU backend from /opt/llamaforge/bin/libggml-cpu-sapphirerapids.so"


def test_the_probe_job_runs_the_images_llama_bench_once_per_node_in_the_services_restrictions() -> None:
    release = swarm_release(
        spec(flags=LlamaFlags(threads=2, repack=False)), "lab", "img:1", replicas=3, gpus=1
    )
    flags = LlamaFlags(threads=2, repack=False)
    job = probe_job(release, flags, ProbeModel(Path("/m/p.gguf"), "c" * 64, 1000))
    assert job.command == ("/opt/llamaforge/bin/llama-bench", *probe_args(PROBE_MOUNT, flags))
    assert job.command[job.command.index("-t") + 1] == "2"
    assert "--repack" in job.command and job.mounts == (("/m/p.gguf", PROBE_MOUNT),)
    assert job.generic_resources == {"NVIDIA-GPU": 1} and job.env == release.definition.env
    arguments = job_arguments(job)
    assert arguments["mode"] == {"GlobalJob": {}}  # one task on every node, run once
    template = arguments["task_template"]
    assert template["RestartPolicy"]["Condition"] == "none"  # a crash is a verdict, never retried
    container = template["ContainerSpec"]
    assert container["ReadOnly"] is True and container["CapabilityDrop"] == ["ALL"]
    assert "User" not in container  # the image's user, as the service's tasks run
    assert container["Command"][0] == "/opt/llamaforge/bin/llama-bench"


def node_task(
    state: str, exit_code: int | None, stderr: tuple[str, ...] = (), stdout: str = "", message: str = ""
) -> JobTask:
    return JobTask("node-a", state, exit_code, message, stdout, stderr, 3.5)


def test_each_nodes_probe_is_judged_like_a_hosts_crashes_named_with_the_cpu_module() -> None:
    ran = _node_probe("r1", node_task("complete", 0, (LOADED,), BENCH_JSON))
    assert ran.passed and ran.detail == (
        "llama-bench ran as the image's user 10001: pp16 812 t/s, tg4 95 t/s (CPU, "
        "libggml-cpu-sapphirerapids.so) in 3.5 s"
    )
    crashed = _node_probe(
        "r1", node_task("failed", 132, (LOADED, "Illegal instruction"), message="task: non-zero exit (132)")
    )
    assert not crashed.passed
    assert crashed.detail.startswith(
        "node node-a: release r1 cannot run there: llama-bench was killed by SIGILL (illegal instruction)"
    ), crashed.detail
    assert "libggml-cpu-sapphirerapids.so" in crashed.detail and crashed.logs[-1] == "Illegal instruction"
    missing = _node_probe(
        "r1",
        node_task(
            "failed", 127, ("llama-bench: error while loading shared libraries: libgomp.so.1: cannot open",)
        ),
    )
    assert not missing.passed and "ended with exit code 127" in missing.detail
    assert "error while loading shared libraries: libgomp.so.1" in missing.detail
    rejected = _node_probe(
        "r1", node_task("rejected", None, message="No such image: llamaforge/llama-server:k")
    )
    assert not rejected.passed
    assert "its task was rejected: No such image: llamaforge/llama-server:k" in rejected.detail
    assert "docker image load" in rejected.detail  # the hint: no registry, so every node needs the image
    stuck = _node_probe(
        "r1", node_task("pending", None, message="no suitable node (insufficient resources on 1 node)")
    )
    assert not stuck.passed and "its task was pending: no suitable node" in stuck.detail


def test_a_damaged_or_readable_api_key_file_is_refused_with_the_way_to_a_new_key(lf_home: Path) -> None:
    """An empty key file (a crash between its creation and its write) published the service with an empty API
    key; a key file others can read was used as is; a directory there raised FileExistsError."""
    key, path = local_api_key("web")
    assert (
        len(key) == 64
        and path == lf_home / "keys" / "swarm-web.api-key"
        and path.stat().st_mode & 0o777 == 0o600
    )
    assert local_api_key("web") == (key, path)  # made once
    renew = f"remove {path} to make a new key"
    for damage, problem in (
        ("empty", "holds no key"),
        ("two words", "holds no key"),
        ("binary", "cannot read the API key file"),
        ("readable", r"can be read or written by other users \(mode 644\)"),
        ("directory", "is not a regular file"),
        ("symlink", "is not a regular file"),
    ):
        if path.is_dir():
            path.rmdir()
        path.unlink(missing_ok=True)
        if damage == "directory":
            path.mkdir()
        elif damage == "symlink":
            path.symlink_to(lf_home / "elsewhere")
        else:
            text = {"empty": b"", "two words": b"a b", "binary": b"\xff\xfe", "readable": key.encode()}[
                damage
            ]
            path.write_bytes(text)
            path.chmod(0o644 if damage == "readable" else 0o600)
        with pytest.raises(CacheError, match=problem) as refused:
            local_api_key("web")
        assert renew in (refused.value.hint or ""), damage
    assert not (lf_home / "elsewhere").exists()


def test_swarm_takes_no_hosts_and_rolls_back_to_the_previous_spec_only() -> None:
    with pytest.raises(InvalidOption, match="not to hosts"):
        run("deploy.status", target="swarm", hosts="lf@127.0.0.1:2201")
    with pytest.raises(InvalidOption, match="Swarm plans and rolls its own"):
        run("deploy.plan", target="swarm", build="x", model="tiny")
    with pytest.raises(InvalidOption, match="previous spec only"):
        run("deploy.rollback", target="swarm", release="0123456789abcdef")


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
    yield {
        "name": name,
        "build": patched_build.name,
        "build_dir": patched_build,
        "model": str(model),
        "broken": str(broken),
    }
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


@pytest.mark.docker
@pytest.mark.llamacpp
def test_every_node_proves_a_release_before_the_service_moves_and_a_crashing_one_moves_nothing(
    deployment: dict[str, Any], swarm: Any, build_env: dict[str, str]
) -> None:
    from llamaforge.build.runtime_image import ensure_runtime_image

    events: list[str] = []

    def deploy(build: str) -> Any:
        op = operations()["deploy"]
        params = op.params(
            target="swarm",
            name=deployment["name"],
            build=build,
            model=deployment["model"],
            replicas=1,
            gate_timeout_s=30,
        )
        return op.run(params, OperationContext(reporter=lambda event: events.append(event.message)))

    started = time.monotonic()
    first = deploy(deployment["build"])
    first_s = time.monotonic() - started
    assert isinstance(first, DeployResult) and first.passed and first.swarm is not None
    (probe,) = first.swarm.probes  # one node
    assert probe.passed and probe.detail.startswith("llama-bench ran as the image's user 10001: pp16 "), probe
    assert "libggml-cpu-" in probe.detail  # the CPU module the loader picked on the node
    probing = events.index(f"probing release {first.release} on every node (a Swarm job)")
    assert probing < next(index for index, text in enumerate(events) if text.startswith("creating service"))
    assert first.swarm.probe_s is not None

    spec = swarm.services.get(service_name(deployment["name"])).attrs["Spec"]
    image = spec["TaskTemplate"]["ContainerSpec"]["Image"]
    made = ensure_runtime_image(deployment["build"])
    # By id: no node asks a registry for it.
    assert image == made.image_id and spec["Labels"][LABEL_IMAGE] == made.tag
    # The job's exited container is gone with the job (Swarm itself leaves it).
    assert not swarm.containers.list(all=True, filters={"label": LABEL_PROBE})

    again = deploy(deployment["build"])  # the service runs it already: nothing to prove
    assert again.passed and again.swarm is not None and not again.swarm.probes

    # The same build with a CPU module that raises SIGILL on the first graph, in a runtime image of its own.
    key, directory = sigill_copy(deployment["build_dir"], Path(build_env["LLAMAFORGE_HOME"]))
    tag = ensure_runtime_image(key).tag
    try:
        before = swarm.services.get(service_name(deployment["name"])).attrs
        events.clear()
        with pytest.raises(OperationFailed) as caught:
            deploy(key)
        message = caught.value.message
        assert caught.value.exit_code == 15
        assert "refused before any task moved: node " in message, message
        assert "llama-bench was killed by SIGILL (illegal instruction)" in message, message
        assert message.endswith(f"the service still runs {first.release}"), message
        result = caught.value.result
        assert isinstance(result, DeployResult) and not result.passed and result.swarm is not None
        (refused,) = result.swarm.probes
        assert not refused.passed and "with libggml-cpu-" in refused.detail, refused
        assert any("load_backend: loaded CPU backend" in line for line in refused.logs), refused.logs
        after = swarm.services.get(service_name(deployment["name"])).attrs
        assert after["Version"] == before["Version"] and after["Spec"] == before["Spec"]  # never updated
        assert result.swarm.release == first.release and result.swarm.healthy == 1
        assert not any(text.startswith("updating service") for text in events), events
        assert not [service.name for service in swarm.services.list() if "-probe-" in service.name]
        assert not swarm.containers.list(all=True, filters={"label": LABEL_PROBE})
    finally:
        swarm.images.remove(tag)
        shutil.rmtree(directory)
    print(
        f"\nswarm probe: {first.swarm.probe_s:.1f} s of a {first_s:.1f} s first deploy (1 node); "
        f"{probe.detail.rsplit(' in ', 1)[-1]} for llama-bench"
    )
