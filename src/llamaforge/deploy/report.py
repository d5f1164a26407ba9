"""The typed results of the deploy operations: one shape for the CLI, the MCP server and the notebook."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamaforge.core.errors import ExitCode, LlamaforgeError
from llamaforge.core.registry import Result, absent

HostStatus = Literal[
    "updated", "unchanged", "rolled back", "failed", "untouched", "unreachable", "interrupted"
]


class DeployFailed(LlamaforgeError):
    """A rollout or rollback left a host failed, rolled back or unreachable."""

    exit_code = ExitCode.DEPLOY


def release_words(release: str | None) -> str:
    """A host's release in a sentence: its id, or "no previous release" for a host that had none (never
    "None")."""
    return release if release is not None else "no previous release"


def still_on(release: str | None) -> str:
    """Where a host that was not switched stays: ``still on R``, or ``still without a release (no previous
    release)``."""
    return f"still on {release}" if release is not None else "still without a release (no previous release)"


class HostReport(Result):
    """What a rollout (or a rollback) did on one host and where it left it."""

    host: str
    status: HostStatus = Field(
        description="updated (new release, gate passed), unchanged (it was already current), rolled back "
        "(gate failed, previous release restored), failed (left as the detail says), untouched (not reached), "
        "unreachable (SSH refused or the connection was lost), interrupted (Ctrl-C or SIGTERM: left on the "
        "whole release named in `release`)"
    )
    release: str | None = Field(
        description="The release current on the host afterwards (None: unknown, the host did not answer)"
    )
    previous: str | None = Field(description="The release current before")
    sent_bytes: int = 0
    model_bytes: int = Field(0, description="Of sent_bytes, the model's (0 when the host already had it)")
    image_bytes: int = Field(
        0, description="Of sent_bytes, the runtime image's (--target docker; 0 when the host's engine had it)"
    )
    health_s: float | None = Field(None, description="Seconds until /health answered 200")
    completion: str | None = None
    detail: str = ""
    logs: list[str] = Field(
        default_factory=list, description="The service's last log lines when a gate failed"
    )
    api_key_file: str | None = Field(
        None,
        description="Where the host keeps the API key of a server listening beyond loopback (read it "
        "there with sudo; the key itself is never reported)",
    )
    probe: str | None = Field(
        None,
        description="What the release's llama-bench did on the host before the switch, as the service "
        "user on the Q4_0 probe model: its figures and CPU module, or the crash that refused the host",
    )
    probe_s: float | None = Field(
        None, description="Seconds the probe took on the host (its command, end to end)"
    )


class DeployResult(Result):
    """A rollout over hosts: the release, every host's outcome, and whether all of them are healthy."""

    release: str | None
    target: str
    name: str
    passed: bool
    interrupted: bool = Field(False, description="Ctrl-C or SIGTERM stopped it (see each host's release)")
    hosts: list[HostReport]
    wall_s: float
    swarm: SwarmReport | None = absent(
        "--target swarm: the service, Swarm's update verdict and every replica"
    )


class HostPlan(Result):
    """What a deploy would change on one host."""

    host: str
    reachable: bool
    current: str | None
    release: str
    action: Literal["none", "switch", "upload"] = Field(
        description="none (already current), switch (the release is on the host), upload (it is not)"
    )
    model_upload: bool = Field(description="Whether the model would be sent (the host lacks its sha256)")
    model_bytes: int
    restart: bool
    flags_before: list[str] | None
    flags_after: list[str]
    listen: str = Field("127.0.0.1", description="The address llama-server binds")
    api_key: bool = Field(False, description="Whether the release carries an API key (beyond loopback)")
    delivery: str = Field(
        "",
        description="What the target would send besides the release (the docker target's image; empty: "
        "nothing, the host has it)",
    )
    fit: list[str] = Field(
        default_factory=list, description="The fit plan for the host's GPU, when it has one"
    )
    probe: str = Field(
        "",
        description="A release already on the host is probed while planning: what its llama-bench did "
        "(empty: it is probed after its upload, before the switch)",
    )
    detail: str = ""


class DeployPlanResult(Result):
    """``deploy.plan``: the release and each host's changes; nothing ran."""

    release: str
    target: str
    name: str
    record: dict[str, Any] = Field(description="The release.json the release would carry (time: now)")
    hosts: list[HostPlan]


class HostStatusReport(Result):
    """``deploy.status`` for one host."""

    host: str
    reachable: bool
    current: str | None = None
    releases: list[str] = Field(default_factory=list)
    active: str | None = Field(None, description="The service manager's state (active, failed, …)")
    crash: str | None = Field(
        None,
        description="The signal that ended the server last, while the service manager still says so "
        "(killed by SIGILL (illegal instruction))",
    )
    healthy: bool | None = Field(None, description="/health answered 200 on the host's loopback")
    build_key: str | None = None
    model_sha256: str | None = None
    flags: list[str] | None = None
    detail: str = ""


class DeployStatusResult(Result):
    """``deploy.status``: every host."""

    target: str
    name: str
    hosts: list[HostStatusReport]
    swarm: SwarmReport | None = absent("--target swarm: the service and every replica")


class SwarmTask(Result):
    """One replica slot of a Swarm service: its newest task, and what it answered."""

    slot: int
    task: str = Field(description="The newest task's id (short)")
    node: str
    state: str = Field(description="Swarm's task state: running, starting, failed, shutdown, …")
    desired: str = Field(description="The state Swarm wants for the task (running, shutdown)")
    release: str | None = Field(description="The release the task runs")
    failed_tasks: int = Field(0, description="Tasks of this slot Swarm keeps in state failed or rejected")
    last_failure: str = Field(
        "", description="Why the slot's newest failed or rejected task ended (Swarm's words)"
    )
    healthy: bool | None = Field(
        None, description="/health and a completion answered inside the task's container (None: not asked)"
    )
    completion: str | None = None
    detail: str = ""


class SwarmProbe(Result):
    """The release's llama-bench on one node of the swarm, before the service was updated (a Swarm job)."""

    node: str
    passed: bool
    detail: str = Field(description="Its figures and CPU module, or why the release cannot run on the node")
    logs: list[str] = Field(default_factory=list, description="Its last log lines when it failed")


class SwarmReport(Result):
    """A Swarm service after a deploy, a rollback or for ``deploy.status``: Swarm's update verdict and every
    replica."""

    service: str
    exists: bool = True
    service_id: str | None = None
    release: str | None = Field(None, description="The release the service's spec runs now")
    requested: str | None = Field(None, description="The release that was asked for")
    previous: str | None = Field(None, description="The release before")
    replicas: int = 0
    healthy: int = Field(0, description="Replicas on the service's release that answered")
    update_state: str | None = Field(
        None,
        description="Swarm's UpdateStatus.State: completed, rollback_completed (Swarm rolled back by "
        "itself), paused, …; None for a service never updated",
    )
    update_message: str | None = None
    rolled_back: bool = False
    passed: bool = False
    tasks: list[SwarmTask] = Field(default_factory=list)
    probes: list[SwarmProbe] = Field(
        default_factory=list,
        description="The release's llama-bench on every node before the update (empty: not probed, e.g. the "
        "service already ran it, or --no-probe)",
    )
    probe_s: float | None = Field(None, description="Seconds the probe job took, end to end")
    wall_s: float = 0.0
