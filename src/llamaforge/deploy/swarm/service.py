"""The Swarm target: a release as a replicated Docker Swarm service made from the build's runtime image.

Swarm does the rolling itself: tasks are replaced ``parallelism`` at a time, each watched for a monitor window
that covers the health check's start period plus ``interval * retries`` (a task that turns unhealthy after the
window would not count as a failed update), and a failed update rolls back on its own (failure_action
rollback). llamaforge then waits for the update's end state and reports it (``rollback_completed`` when Swarm
rolled back) with every task's state, and asks each running task on this engine for ``/health`` and a greedy
completion from inside its container, so nothing needs to listen beyond the container.

Swarm cannot publish a port on one address only (its published ports listen on every interface of every node),
so by default nothing is published; ``publish`` opts in, and then llama-server asks for an API key: the Swarm
secret ``llamaforge-<name>-api-key-<digest>`` mounted as ``/run/secrets/api-key`` (uid of the image's user, mode
0400) and read with ``--api-key-file``; the completion check sends it from inside the container, never on a
command line. The key is made once here and kept in ``$LLAMAFORGE_HOME/keys/swarm-<name>.api-key`` (mode 0600).
The model is a read-only bind mount of the file, which
must be at the same path on every node (one node here). CUDA builds ask for one ``NVIDIA-GPU`` generic
resource per task (nodes advertise theirs with dockerd's ``--node-generic-resource``) and replace tasks
stop-first, since each needs a whole GPU.

Before a service is created or updated, every node proves the release (:func:`probe_nodes`): a Swarm job
(mode ``global-job``, one task per node that could take the service's tasks, never restarted) runs the image's
llama-bench in the service's restrictions on the tiny Q4_0 probe model, bind-mounted like the model (so at the
same path on every node). A node where it crashes, lacks a library or cannot start it refuses the release,
named with the signal and the CPU module the loader picked there, and the service is not touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.build.runtime_image import HEALTHCHECK, MODEL_PATH, PREFIX, UID
from llamaforge.core.errors import CacheError, InvalidOption
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.exits import exit_signal
from llamaforge.deploy.hosts.probe import (
    PROBE_BINARY,
    PROBE_WAIT_S,
    TAIL_LINES,
    judge_probe,
    probe_args,
)
from llamaforge.deploy.release import ReleaseCannotRun, ReleaseSpec, gate_timeout_s, release_id
from llamaforge.deploy.report import SwarmProbe, SwarmReport, SwarmTask
from llamaforge.runners import swarm as swarm_api
from llamaforge.runners.swarm import HealthProbe, JobDefinition, JobTask, ServiceDefinition, UpdatePolicy
from llamaforge.smoke.answers import GoldenRequest

if TYPE_CHECKING:
    from llamaforge.deploy.hosts.prepared import ProbeModel
    from llamaforge.serve.launcher import LlamaFlags

API_KEY_TARGET = "api-key"
API_KEY_PATH = f"/run/secrets/{API_KEY_TARGET}"
# The completion check beyond the routing mesh: the header from the secret, through curl's stdin.
_AUTHORIZED = 'key=$1; shift; printf "Authorization: Bearer %s" "$(cat "$key")" | curl -H @- "$@"'
LABEL_RELEASE = "org.llamaforge.release"
LABEL_MODEL = "org.llamaforge.model.sha256"
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 5.0
PROBE_RETRIES = 3
UPDATE_DELAY_S = 2.0
COMPLETION_TOKENS = 8
_ENDED = ("completed", "rollback_completed", "paused", "rollback_paused")
PROBE_MOUNT = "/models/probe.gguf"
LABEL_PROBE = "org.llamaforge.probe"
LABEL_IMAGE = "org.llamaforge.image"  # the runtime image's tag; the service names the image by id


def service_name(name: str) -> str:
    """The Swarm service of deployment ``name``."""
    return f"llamaforge-{name}"


@dataclass(frozen=True)
class SwarmRelease:
    """A release for Swarm: its id, the service definition, and the model size (for the waits)."""

    id: str
    definition: ServiceDefinition


def monitor_window_s(probe: HealthProbe) -> float:
    """How long Swarm watches each new task: the start period plus ``interval * retries`` and one interval
    more, so a task that never turns healthy is a failed update and not a late surprise."""
    return probe.start_period_s + probe.interval_s * (probe.retries + 1)


def swarm_release(
    spec: ReleaseSpec,
    name: str,
    image: str,
    *,
    tag: str | None = None,
    replicas: int,
    parallelism: int = 1,
    gpus: int = 0,
    publish: int | None = None,
    start_period_s: float | None = None,
    api_key_secret: tuple[str, str] | None = None,
) -> SwarmRelease:
    """The service definition of ``spec`` as deployment ``name`` from the runtime image ``image``, its id
    (``sha256:…``: no node asks a registry for an image named by id, so a name taken on a public registry can
    never replace it), ``tag`` its name for people (a label); a published port needs ``api_key_secret`` (the
    secret's id and name), which llama-server reads with ``--api-key-file``."""
    if publish and api_key_secret is None:
        raise InvalidOption(
            "a published port listens on every interface of every node: it needs an API key",
            hint="deploy through `invoke deploy --target swarm --publish PORT`, which makes the key's secret",
        )
    if replicas < 1:
        raise InvalidOption("replicas must be at least 1", hint="--replicas 1 or more")
    probe = HealthProbe(
        HEALTHCHECK,
        PROBE_INTERVAL_S,
        PROBE_TIMEOUT_S,
        PROBE_RETRIES,
        start_period_s if start_period_s is not None else gate_timeout_s(spec.model_size),
    )
    monitor = monitor_window_s(probe)
    order = "stop-first" if gpus else "start-first"  # a whole-GPU task cannot start beside its old one
    update = UpdatePolicy(parallelism, UPDATE_DELAY_S, "rollback", monitor, 0.0, order)
    rollback = UpdatePolicy(parallelism, UPDATE_DELAY_S, "pause", monitor, 0.0, order)
    env = {"LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_PORT": str(spec.port), "LLAMA_ARG_MODEL": MODEL_PATH}  # noqa: S104 - inside the task's own network namespace
    args = ("--no-webui", *spec.flags.args())
    if publish and api_key_secret:
        args = (*args, "--api-key-file", API_KEY_PATH)
    secrets = ((*api_key_secret, API_KEY_TARGET, UID),) if publish and api_key_secret else ()
    identity = {
        "image": image,
        "args": args,
        "env": env,
        "gpus": gpus,
        "publish": publish,
        "secrets": [secret[1] for secret in secrets],
        "health": probe.__dict__,
        "update": update.__dict__,
    }
    rid = release_id(spec, {"swarm-service.json": json.dumps(identity, sort_keys=True)})
    labels = {LABEL_RELEASE: rid, LABEL_MODEL: spec.model_sha256, "org.llamaforge.build.key": spec.build_key}
    if tag:
        labels[LABEL_IMAGE] = tag
    definition = ServiceDefinition(
        name=service_name(name),
        image=image,
        args=args,
        env=env,
        labels=labels,
        replicas=replicas,
        mounts=((str(spec.model), MODEL_PATH),),
        health=probe,
        update=update,
        rollback=rollback,
        generic_resources={"NVIDIA-GPU": gpus} if gpus else {},
        publish=((publish, spec.port),) if publish else (),
        secrets=secrets,
    )
    return SwarmRelease(rid, definition)


def probe_job(release: SwarmRelease, flags: LlamaFlags, model: ProbeModel) -> JobDefinition:
    """The job that proves ``release`` on every node: the image's llama-bench on the probe ``model`` with the
    service's threads, GPU layers and repack choice, environment and generic resources."""
    definition = release.definition
    return JobDefinition(
        name=f"{definition.name[:40]}-probe-{release.id[:8]}",
        image=definition.image,
        command=(posixpath.join(PREFIX, "bin", PROBE_BINARY), *probe_args(PROBE_MOUNT, flags)),
        env=dict(definition.env),
        labels={LABEL_RELEASE: release.id, LABEL_PROBE: definition.name},
        mounts=((str(model.path), PROBE_MOUNT),),
        generic_resources=dict(definition.generic_resources),
    )


def _node_probe(rid: str, task: JobTask) -> SwarmProbe:
    where = f"node {task.node}: release {rid} cannot run there"
    if task.state in ("complete", "failed") or (task.state == "running" and task.exit_code is None):
        code = 0 if task.state == "complete" else task.exit_code if task.exit_code is not None else -1
        outcome = judge_probe(
            where,
            exit_signal(code, shell=True),  # noqa: S604 - nothing runs; a container killed by signal N exits 128 + N
            code,
            task.stdout,
            task.stderr,
            task.seconds,
            timed_out=task.state == "running",
            user=f"the image's user {UID}",
        )
        passed = outcome.passed
        detail = outcome.detail
        logs = list(outcome.logs) if not passed else []
    else:  # rejected, or never started within the limit
        refusal = ReleaseCannotRun(
            f"{where}: its task was {task.state}" + (f": {task.message}" if task.message else ""),
            hint="the runtime image and the probe model must be on every node (no registry: `docker image "
            "load` of the image, the model at the same path); a GPU build needs a node with a free NVIDIA-GPU",
        )
        passed, detail, logs = False, refusal.render(), list(task.stderr[-TAIL_LINES:])
    return SwarmProbe(node=task.node, passed=passed, detail=detail, logs=logs)


def probe_nodes(
    release: SwarmRelease,
    flags: LlamaFlags,
    model: ProbeModel,
    *,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> tuple[list[SwarmProbe], float]:
    """Run ``release``'s llama-bench on every node as its tasks would run it (a Swarm job, removed when it
    ends): one verdict per node, and the seconds the job took. No node at all is a failed probe too."""
    reporter(Event("stage", f"probing release {release.id} on every node (a Swarm job)", stage="swarm"))
    started = time.monotonic()
    tasks = swarm_api.run_global_job(probe_job(release, flags, model), PROBE_WAIT_S, cancel or CancelToken())
    seconds = time.monotonic() - started
    probes = [_node_probe(release.id, task) for task in tasks]
    if not probes:
        probes = [
            SwarmProbe(
                node="-",
                passed=False,
                detail=f"release {release.id}: no node of the swarm took the probe job within "
                f"{PROBE_WAIT_S:.0f} s (a GPU build needs a node that advertises NVIDIA-GPU)",
            )
        ]
    for probe in probes:
        reporter(Event("stage", f"node {probe.node}: {probe.detail.splitlines()[0]}", stage="swarm"))
    return probes, seconds


def api_key_secret(name: str) -> tuple[str, str, Path]:
    """The API key of deployment ``name``'s published service as a Swarm secret: (its id, its name, the local
    file that keeps the key, mode 0600). The key is made once; the secret's name carries a digest of it, so a
    new key (the file removed) is a new secret the service is updated to."""
    key, path = local_api_key(name)
    secret = f"{service_name(name)}-api-key-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    ident = swarm_api.ensure_secret(secret, key, {"org.llamaforge.deployment": name})
    return ident, secret, path


def local_api_key(name: str) -> tuple[str, Path]:
    """The API key of deployment ``name`` and the file under ``keys/`` that keeps it (made, mode 0600, when there
    is none). CacheError when the file is no longer a key only this user can read: an empty one (a crash before
    the key was written) would publish the service with an empty key, a readable one may have leaked."""
    from llamaforge.core.paths import home

    path = home() / "keys" / f"swarm-{name}.api-key"
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(secrets.token_hex(32))
    renew = f"remove {path} to make a new key (the service is updated to it)"
    if path.is_symlink() or not path.is_file():
        raise CacheError(f"the API key file {path} is not a regular file", hint=renew)
    if (mode := path.stat().st_mode & 0o777) & 0o077:
        raise CacheError(
            f"the API key file {path} can be read or written by other users (mode {mode:o}): the key may "
            "have leaked",
            hint=renew + f"; or, if no one else can have read it, `chmod 600 {path}`",
        )
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CacheError(f"cannot read the API key file {path}: {error}", hint=renew) from None
    if not key or any(character.isspace() for character in key):
        raise CacheError(f"the API key file {path} holds no key (it is empty or damaged)", hint=renew)
    return key, path


def _completion_in(container_id: str, port: int, *, keyed: bool = False) -> tuple[bool, str]:
    body = json.dumps(GoldenRequest(n_predict=COMPLETION_TOKENS, n_probs=1).body())
    curl = ["-fsS", "-m", "60", "-d", body, f"http://127.0.0.1:{port}/completion"]
    argv = ["sh", "-c", _AUTHORIZED, "sh", API_KEY_PATH, *curl] if keyed else ["curl", *curl]
    code, output = swarm_api.exec_in_container(container_id, argv)
    if code != 0:
        return False, f"completion failed: {output.strip()[-200:]}"
    try:
        answer = json.loads(output)
    except json.JSONDecodeError:
        return False, f"completion was not JSON: {output[:200]!r}"
    if answer.get("tokens_predicted") != COMPLETION_TOKENS:
        return (
            False,
            f"the completion returned {answer.get('tokens_predicted')} tokens, not {COMPLETION_TOKENS}",
        )
    return True, str(answer.get("content", ""))


def slot_tasks(tasks: list[dict[str, Any]]) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """By replica slot: the task that stands for it and the slot's whole history (oldest first).

    The task that stands for a slot is the newest one Swarm wants running, else the newest: a start-first update
    that failed leaves its new task newer than the old one that kept running.
    """
    by_slot: dict[int, list[dict[str, Any]]] = {}
    for task in tasks:
        by_slot.setdefault(int(task.get("Slot", 0)), []).append(task)
    chosen = {}
    for slot, history in sorted(by_slot.items()):
        history.sort(key=lambda task: str(task.get("CreatedAt", "")))
        wanted = [task for task in history if task.get("DesiredState") == "running"]
        chosen[slot] = ((wanted or history)[-1], history)
    return chosen


def _failure(task: dict[str, Any]) -> str:
    status = task.get("Status", {})
    container = status.get("ContainerStatus", {})
    exit_code = container.get("ExitCode")
    return " ".join(
        part
        for part in (
            str(status.get("Err") or status.get("Message") or ""),
            f"(exit {exit_code})" if exit_code else "",
        )
        if part
    )


def task_reports(service: dict[str, Any], *, query: bool = True) -> list[SwarmTask]:
    """One entry per replica slot: its newest task's state, and (``query``) /health and a completion asked
    inside its container when it runs on this engine's node."""
    tasks = swarm_api.service_tasks(service["ID"])
    node = swarm_api.local_node_id()
    port = int(
        dict(
            item.split("=", 1) for item in service["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env", [])
        ).get("LLAMA_ARG_PORT", "8080")
    )
    keyed = API_KEY_PATH in (service["Spec"]["TaskTemplate"]["ContainerSpec"].get("Args") or [])
    reports = []
    for slot, (newest, history) in slot_tasks(tasks).items():
        status = newest.get("Status", {})
        failures = [task for task in history if task.get("Status", {}).get("State") in ("failed", "rejected")]
        labels = newest["Spec"]["ContainerSpec"].get("Labels") or {}
        report = SwarmTask(
            slot=slot,
            task=str(newest["ID"])[:12],
            node=str(newest.get("NodeID", ""))[:12],
            state=str(status.get("State", "")),
            desired=str(newest.get("DesiredState", "")),
            release=labels.get(LABEL_RELEASE),
            detail=str(status.get("Err") or status.get("Message") or ""),
            failed_tasks=len(failures),
            last_failure=_failure(failures[-1]) if failures else "",
        )
        container = status.get("ContainerStatus", {}).get("ContainerID")
        if query and report.state == "running" and newest.get("NodeID") != node:
            report.detail = (
                "runs on another node: not asked (llamaforge reaches this engine's containers only)"
            )
        elif query and report.state == "running" and container:
            code, _ = swarm_api.exec_in_container(
                container, ["curl", "-fsS", "-m", "5", f"http://127.0.0.1:{port}/health"]
            )
            report.healthy = code == 0
            if report.healthy:
                passed, text = _completion_in(container, port, keyed=keyed)
                report.completion = text if passed else None
                report.detail = "" if passed else text
                report.healthy = passed
        reports.append(report)
    return reports


def _wait(condition: Callable[[], bool], limit_s: float, cancel: CancelToken) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition():
        cancel.raise_if_cancelled()
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def _running(service_id: str, replicas: int, release: str | None) -> bool:
    tasks = swarm_api.service_tasks(service_id)
    ready = [
        task
        for task in tasks
        if task.get("DesiredState") == "running"
        and task.get("Status", {}).get("State") == "running"
        and release in (None, (task["Spec"]["ContainerSpec"].get("Labels") or {}).get(LABEL_RELEASE))
    ]
    return len(ready) == replicas


def _update_status(name: str) -> dict[str, Any]:
    service = swarm_api.find_service(name) or {}
    return dict(service.get("UpdateStatus") or {})


def _settle(name: str, before: dict[str, Any], limit_s: float, cancel: CancelToken) -> dict[str, Any]:
    """Wait for the update (or rollback) that follows ``before`` to end; its UpdateStatus."""

    def ended() -> bool:
        status = _update_status(name)
        return status != before and status.get("State") in _ENDED

    _wait(ended, limit_s, cancel)
    return _update_status(name)


def _limit(definition: ServiceDefinition) -> float:
    """Seconds an update (then a rollback) may take: every batch's start period, monitor window and delay."""
    batches = -(-definition.replicas // max(1, definition.update.parallelism))
    per_batch = definition.health.start_period_s + definition.update.monitor_s + definition.update.delay_s
    return 2 * batches * per_batch + 60


def report(
    name: str,
    requested: str | None,
    previous: str | None,
    wall_start: float,
    update: dict[str, Any] | None = None,
) -> SwarmReport:
    """The service's state now: release, update state and every replica's task."""
    service = swarm_api.find_service(service_name(name))
    if service is None:
        return SwarmReport(
            service=service_name(name),
            exists=False,
            requested=requested,
            previous=previous,
            wall_s=time.monotonic() - wall_start,
        )
    update = update if update is not None else dict(service.get("UpdateStatus") or {})
    tasks = task_reports(service)
    replicas = int(service["Spec"].get("Mode", {}).get("Replicated", {}).get("Replicas", 0))
    current = (service["Spec"].get("Labels") or {}).get(LABEL_RELEASE)
    healthy = sum(1 for task in tasks if task.healthy and task.release == current)
    return SwarmReport(
        service=service_name(name),
        exists=True,
        service_id=str(service["ID"])[:12],
        release=current,
        requested=requested,
        previous=previous,
        replicas=replicas,
        healthy=healthy,
        update_state=update.get("State"),
        update_message=update.get("Message"),
        rolled_back=update.get("State") in ("rollback_completed", "rollback_paused"),
        passed=healthy == replicas and (requested is None or current == requested),
        tasks=tasks,
        wall_s=time.monotonic() - wall_start,
    )


def deploy_service(
    release: SwarmRelease,
    deployment: str,
    *,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> SwarmReport:
    """Create the service, or update it to ``release`` (nothing when it already runs it with as many replicas),
    wait for Swarm's verdict and report it."""
    cancel = cancel or CancelToken()
    started = time.monotonic()
    definition = release.definition
    current = swarm_api.find_service(definition.name)
    previous = None if current is None else (current["Spec"].get("Labels") or {}).get(LABEL_RELEASE)
    replicas = (
        None if current is None else current["Spec"].get("Mode", {}).get("Replicated", {}).get("Replicas")
    )
    if current is None:
        reporter(
            Event(
                "stage", f"creating service {definition.name} ({definition.replicas} replicas)", stage="swarm"
            )
        )
        service_id = swarm_api.create_service(definition)
    elif previous == release.id and replicas == definition.replicas:
        return report(deployment, release.id, previous, started)
    else:
        reporter(
            Event("stage", f"updating service {definition.name}: {previous} -> {release.id}", stage="swarm")
        )
        before = dict(current.get("UpdateStatus") or {})
        swarm_api.update_service(definition, current)
        service_id = str(current["ID"])
        update = _settle(definition.name, before, _limit(definition), cancel)
        reporter(Event("stage", f"update {update.get('State')}: {update.get('Message', '')}", stage="swarm"))
        if update.get("State") != "completed":
            _wait(lambda: _running(service_id, definition.replicas, previous), _limit(definition), cancel)
            return report(deployment, release.id, previous, started, update)
    _wait(lambda: _running(service_id, definition.replicas, release.id), _limit(definition), cancel)
    return report(deployment, release.id, previous, started)


def rollback_service(
    deployment: str, *, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> SwarmReport:
    """Swarm's rollback of the service to its previous spec; waits for it and reports."""
    from llamaforge.runners.swarm import SwarmError

    cancel = cancel or CancelToken()
    started = time.monotonic()
    name = service_name(deployment)
    current = swarm_api.find_service(name)
    if current is None:
        raise SwarmError(
            f"there is no service {name} on this swarm", hint="`invoke deploy --target swarm` makes it"
        )
    if not current.get("PreviousSpec"):
        raise SwarmError(f"service {name} has no previous spec to roll back to", hint="it was never updated")
    previous = (current["Spec"].get("Labels") or {}).get(LABEL_RELEASE)
    target = (current["PreviousSpec"].get("Labels") or {}).get(LABEL_RELEASE)
    reporter(Event("stage", f"rolling {name} back: {previous} -> {target}", stage="swarm"))
    before = dict(current.get("UpdateStatus") or {})
    swarm_api.rollback_service(current)
    replicas = int(current["PreviousSpec"].get("Mode", {}).get("Replicated", {}).get("Replicas", 1))
    probe = current["PreviousSpec"]["TaskTemplate"]["ContainerSpec"].get("Healthcheck", {})
    limit = 2 * replicas * (probe.get("StartPeriod", 0) / 1e9 + 60) + 60
    update = _settle(name, before, limit, cancel)
    _wait(lambda: _running(str(current["ID"]), replicas, target), limit, cancel)
    return report(deployment, target, previous, started, update)
