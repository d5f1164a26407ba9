"""Docker Swarm through the engine's API: services from a :class:`ServiceDefinition`, their tasks, a rollback,
and a command run inside a task's container. The only place llamaforge talks to Swarm.

The docker SDK's ``UpdateConfig`` and ``RollbackConfig`` default to what the CLI does not (parallelism 0 — all
tasks at once —, failure_action ``continue``, no monitor window) and take durations in nanoseconds, so every
field is set here from the definition's seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamaforge.core.errors import ExitCode, LlamaforgeError
from llamaforge.runners.engine import EngineConfig, docker_client


class SwarmError(LlamaforgeError):
    """The engine refused a Swarm request, or is not part of a swarm."""

    exit_code = ExitCode.SWARM


@dataclass(frozen=True)
class UpdatePolicy:
    """How Swarm replaces tasks (an update, or a rollback): every field of the engine's UpdateConfig."""

    parallelism: int
    delay_s: float
    failure_action: str  # update: rollback | pause | continue; rollback: pause | continue
    monitor_s: float
    max_failure_ratio: float
    order: str  # stop-first | start-first


@dataclass(frozen=True)
class HealthProbe:
    """The service's health check (a shell command in the container)."""

    command: str
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float


@dataclass(frozen=True)
class ServiceDefinition:
    """A replicated Swarm service, in plain values."""

    name: str
    image: str
    args: tuple[str, ...]
    env: dict[str, str]
    labels: dict[str, str]  # on the service and on each task's container
    replicas: int
    mounts: tuple[tuple[str, str], ...]  # (source on the node, target in the container), bind, read-only
    health: HealthProbe
    update: UpdatePolicy
    rollback: UpdatePolicy
    generic_resources: dict[str, int] = field(default_factory=dict)  # e.g. {"NVIDIA-GPU": 1} per task
    publish: tuple[tuple[int, int], ...] = ()  # (published, target) through the ingress routing mesh
    network: str = ""  # the service's own overlay network (default: named like the service)
    restart_delay_s: float = 5.0
    # (secret id, secret name, file name under /run/secrets, uid that reads it): mode 0400
    secrets: tuple[tuple[str, str, str, int], ...] = ()


@dataclass(frozen=True)
class JobDefinition:
    """A one-shot Swarm job (mode ``global-job``): one task on every node that can take it, never restarted, in
    the service's container restrictions (the image's user, read-only root, no capabilities, tmpfs ``/tmp``)."""

    name: str
    image: str
    command: tuple[str, ...]  # the entrypoint and its arguments
    env: dict[str, str]
    labels: dict[str, str]
    mounts: tuple[tuple[str, str], ...]  # (source on the node, target in the container), bind, read-only
    generic_resources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JobTask:
    """One node's task of a job: Swarm's end state, the container's exit code and its output."""

    node: str  # the node's hostname, else its id
    state: str  # complete, failed, rejected; pending or running when the job ran past its limit
    exit_code: int | None
    message: str  # Swarm's Err, else its Message
    stdout: str
    stderr: tuple[str, ...]
    seconds: float


# Task states after which a task never runs again.
_TASK_ENDED = frozenset({"complete", "failed", "rejected", "shutdown", "orphaned", "remove"})


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _policy(kind: Any, policy: UpdatePolicy) -> Any:
    return kind(
        parallelism=policy.parallelism,
        delay=_ns(policy.delay_s),
        failure_action=policy.failure_action,
        monitor=_ns(policy.monitor_s),
        max_failure_ratio=policy.max_failure_ratio,
        order=policy.order,
    )


def _restricted(
    image: str,
    labels: dict[str, str],
    env: dict[str, str],
    mounts: tuple[tuple[str, str], ...],
    **more: Any,
) -> Any:
    """A task's container: the image's user with a read-only root and no capabilities (it needs none and writes
    only the tmpfs ``/tmp``), the ``mounts`` bound read-only; ``more`` for the SDK's ``ContainerSpec``."""
    from docker import types

    return types.ContainerSpec(
        image=image,
        labels=dict(labels),
        env=[f"{key}={value}" for key, value in sorted(env.items())],
        mounts=[
            *(types.Mount(target, source, type="bind", read_only=True) for source, target in mounts),
            types.Mount("/tmp", None, type="tmpfs"),
        ],
        read_only=True,
        cap_drop=["ALL"],
        **more,
    )


def service_arguments(definition: ServiceDefinition) -> dict[str, Any]:
    """The keyword arguments of the SDK's ``create_service``/``update_service`` for ``definition``."""
    from docker import types

    probe = definition.health
    container = _restricted(
        definition.image,
        definition.labels,
        definition.env,
        definition.mounts,
        args=list(definition.args),
        secrets=[
            types.SecretReference(ident, name, filename=target, uid=str(uid), gid=str(uid), mode=0o400)
            for ident, name, target, uid in definition.secrets
        ]
        or None,
        healthcheck=types.Healthcheck(
            test=["CMD-SHELL", probe.command],
            interval=_ns(probe.interval_s),
            timeout=_ns(probe.timeout_s),
            retries=probe.retries,
            start_period=_ns(probe.start_period_s),
        ),
    )
    resources = types.Resources(generic_resources=definition.generic_resources or None)
    restart = types.RestartPolicy(
        condition="any", delay=_ns(definition.restart_delay_s), max_attempts=0, window=0
    )
    ports = {published: (target, "tcp", "ingress") for published, target in definition.publish}
    return {
        "task_template": types.TaskTemplate(
            container, resources=resources, restart_policy=restart, networks=[network_name(definition)]
        ),
        "name": definition.name,
        "labels": dict(definition.labels),
        "mode": types.ServiceMode("replicated", replicas=definition.replicas),
        "update_config": _policy(types.UpdateConfig, definition.update),
        "rollback_config": _policy(types.RollbackConfig, definition.rollback),
        "endpoint_spec": types.EndpointSpec(mode="vip", ports=ports),
    }


def network_name(definition: ServiceDefinition) -> str:
    """The overlay network the service's tasks are on: theirs alone, not the engine's default bridge."""
    return definition.network or definition.name


def _ensure_network(client: Any, name: str) -> None:
    if not client.networks.list(names=[name]):
        _api(
            client.networks.create,
            f"creating network {name}",
            name,
            driver="overlay",
            attachable=False,
            labels={"org.llamaforge.service": name},
        )


def _client(config: EngineConfig | None) -> Any:
    client = docker_client(config)
    state = client.info().get("Swarm", {}).get("LocalNodeState")
    if state != "active":
        raise SwarmError(
            f"the Docker engine is not part of a swarm (its state: {state})",
            hint="`docker swarm init --advertise-addr 127.0.0.1` makes a single-node swarm",
        )
    return client


def _api(call: Any, what: str, *args: Any, **kwargs: Any) -> Any:
    import docker.errors

    try:
        return call(*args, **kwargs)
    except docker.errors.APIError as error:
        raise SwarmError(f"{what}: {error.explanation or error}") from None


def ensure_secret(name: str, data: str, labels: dict[str, str], config: EngineConfig | None = None) -> str:
    """The id of the Swarm secret ``name``, made from ``data`` when there is none (a secret never changes: a new
    value needs a new name)."""
    client = _client(config)
    found = [item for item in client.api.secrets(filters={"name": name}) if item["Spec"]["Name"] == name]
    if found:
        return str(found[0]["ID"])
    created = _api(client.api.create_secret, f"creating secret {name}", name, data.encode(), labels=labels)
    return str(created["ID"])


def find_service(name: str, config: EngineConfig | None = None) -> dict[str, Any] | None:
    """The service ``name``'s attributes (Spec, PreviousSpec, UpdateStatus, Version, …), or None."""
    client = _client(config)
    found = [item for item in client.api.services(filters={"name": name}) if item["Spec"]["Name"] == name]
    return found[0] if found else None


def create_service(definition: ServiceDefinition, config: EngineConfig | None = None) -> str:
    """Create the service; returns its id."""
    client = _client(config)
    _ensure_network(client, network_name(definition))
    created = _api(
        client.api.create_service, f"creating service {definition.name}", **service_arguments(definition)
    )
    return str(created["ID"])


def update_service(
    definition: ServiceDefinition, current: dict[str, Any], config: EngineConfig | None = None
) -> None:
    """Replace the service's spec with ``definition``'s (Swarm rolls the tasks by its update policy)."""
    client = _client(config)
    _ensure_network(client, network_name(definition))
    _api(
        client.api.update_service,
        f"updating service {definition.name}",
        current["ID"],
        current["Version"]["Index"],
        **service_arguments(definition),
    )


def rollback_service(current: dict[str, Any], config: EngineConfig | None = None) -> None:
    """Swarm's own rollback to the service's previous spec (``docker service rollback``)."""
    client = _client(config)
    api = client.api
    # The SDK has no call for it: the CLI sends the current spec with rollback=previous, and so does this.
    url = api._url("/services/{0}/update", current["ID"])
    params = {"version": current["Version"]["Index"], "rollback": "previous"}
    response = _api(api._post_json, "rolling the service back", url, data=current["Spec"], params=params)
    _api(api._raise_for_status, "rolling the service back", response)


def remove_service(name: str, config: EngineConfig | None = None, *, wait_s: float = 30.0) -> bool:
    """Remove the service ``name`` and its network (once its tasks have left it); False when there was none."""
    import contextlib
    import time

    import docker.errors

    current = find_service(name, config)
    client = docker_client(config)
    if current is not None:
        _api(client.api.remove_service, f"removing service {name}", current["ID"])
    # A removed service's tasks leave its network within seconds; until then the engine keeps (or still lists) it.
    deadline = time.monotonic() + wait_s

    def listed() -> list[Any]:  # the name filter matches parts of names: keep the exact one
        found = client.networks.list(names=[name], filters={"label": "org.llamaforge.service"})
        return [network for network in found if network.name == name]

    while networks := listed():
        for network in networks:
            with contextlib.suppress(docker.errors.APIError):
                network.remove()
        if time.monotonic() > deadline:
            raise SwarmError(f"network {name} is still in use", hint=f"docker network rm {name}")
        time.sleep(1.0)
    return current is not None


def service_tasks(service_id: str, config: EngineConfig | None = None) -> list[dict[str, Any]]:
    """Every task of the service Swarm still keeps (the running ones and recent history)."""
    tasks: list[dict[str, Any]] = _client(config).api.tasks(filters={"service": service_id})
    return tasks


def local_node_id(config: EngineConfig | None = None) -> str:
    """The swarm node id of the engine llamaforge talks to."""
    return str(_client(config).info()["Swarm"]["NodeID"])


def exec_in_container(
    container_id: str, argv: list[str], config: EngineConfig | None = None
) -> tuple[int, str]:
    """Run ``argv`` in a running container of this engine: (exit code, stdout and stderr)."""
    import docker.errors

    try:
        container = docker_client(config).containers.get(container_id)
        code, output = container.exec_run(argv)
    except docker.errors.APIError as error:
        return 1, str(error.explanation or error)
    return int(code), bytes(output).decode("utf-8", "replace")


def job_arguments(job: JobDefinition) -> dict[str, Any]:
    """The keyword arguments of the SDK's ``create_service`` for ``job``."""
    from docker import types

    return {
        "task_template": types.TaskTemplate(
            _restricted(job.image, job.labels, job.env, job.mounts, command=list(job.command)),
            resources=types.Resources(generic_resources=job.generic_resources or None),
            restart_policy=types.RestartPolicy(condition="none"),
        ),
        "name": job.name,
        "labels": dict(job.labels),
        "mode": types.ServiceMode("global-job"),
    }


def _job_logs(client: Any, service_id: str, *, stdout: bool) -> dict[str, list[str]]:
    """The job's stdout (or stderr) lines by task id, from the engine's service logs (with their details)."""
    raw = _api(
        client.api.service_logs,
        "reading the job's logs",
        service_id,
        details=True,
        stdout=stdout,
        stderr=not stdout,
        follow=False,
    )
    text = b"".join(raw if not isinstance(raw, bytes) else [raw]).decode("utf-8", "replace")
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():
        details, _, message = line.partition(" ")
        attributes = dict(item.split("=", 1) for item in details.split(",") if "=" in item)
        lines.setdefault(attributes.get("com.docker.swarm.task.id", ""), []).append(message)
    return lines


def run_global_job(
    job: JobDefinition, limit_s: float, cancel: Any, config: EngineConfig | None = None
) -> list[JobTask]:
    """Run ``job`` once on every node that takes it and wait (at most ``limit_s``) for every task to end; each
    node's task, then the job and its containers on this engine are removed. A task still pending or running at
    the limit is returned as it is."""
    import contextlib
    import time

    import docker.errors

    client = _client(config)
    started = time.monotonic()
    created = _api(client.api.create_service, f"creating job {job.name}", **job_arguments(job))
    service_id = str(created["ID"])
    try:
        tasks: list[dict[str, Any]] = []
        while True:
            tasks = client.api.tasks(filters={"service": service_id})
            if tasks and all(task.get("Status", {}).get("State") in _TASK_ENDED for task in tasks):
                break
            if time.monotonic() - started > limit_s:
                break
            cancel.raise_if_cancelled()
            time.sleep(0.5)
        seconds = time.monotonic() - started
        out = _job_logs(client, service_id, stdout=True)
        err = _job_logs(client, service_id, stdout=False)
        hostnames = {
            str(node["ID"]): str(node.get("Description", {}).get("Hostname") or node["ID"][:12])
            for node in client.api.nodes()
        }
        return [
            JobTask(
                node=hostnames.get(str(task.get("NodeID", "")), str(task.get("NodeID", ""))[:12] or "-"),
                state=str(task.get("Status", {}).get("State", "")),
                exit_code=task.get("Status", {}).get("ContainerStatus", {}).get("ExitCode"),
                message=str(task.get("Status", {}).get("Err") or task.get("Status", {}).get("Message") or ""),
                stdout="\n".join(out.get(str(task["ID"]), [])),
                stderr=tuple(err.get(str(task["ID"]), [])),
                seconds=seconds,
            )
            for task in sorted(tasks, key=lambda task: str(task.get("NodeID", "")))
        ]
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_service(service_id)
        # Swarm leaves an ended job's containers behind, even once the job is gone: remove this engine's (the
        # job's tasks, by the job's id), so their image can go too. Other nodes keep theirs (exited) until
        # `docker container prune` there.
        for container in client.api.containers(
            all=True, filters={"label": f"com.docker.swarm.service.id={service_id}"}
        ):
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_container(container["Id"], force=True)
