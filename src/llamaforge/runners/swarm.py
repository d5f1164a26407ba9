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


def service_arguments(definition: ServiceDefinition) -> dict[str, Any]:
    """The keyword arguments of the SDK's ``create_service``/``update_service`` for ``definition``."""
    from docker import types

    probe = definition.health
    container = types.ContainerSpec(
        image=definition.image,
        args=list(definition.args),
        labels=dict(definition.labels),
        env=[f"{key}={value}" for key, value in sorted(definition.env.items())],
        mounts=[
            *(
                types.Mount(target, source, type="bind", read_only=True)
                for source, target in definition.mounts
            ),
            types.Mount("/tmp", None, type="tmpfs"),
        ],
        read_only=True,
        cap_drop=["ALL"],  # the image's user needs no capability and writes only /tmp
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
