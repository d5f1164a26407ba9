"""Deploy, inspect and roll back a topology: RPC workers first, then the head, with the release machinery of
:mod:`~llamaforge.deploy.hosts.rollout` (each worker's ``ggml-rpc-server`` is a release of its own, with the
:class:`~llamaforge.deploy.targets.rpc_server.RpcServerTarget`; the head's llama-server is a release whose flags carry
``--rpc``, ``-ts`` and ``-ngl`` from the split plan).

Order: every host is reached and read first (an unreachable one stops everything); the workers are deployed and
gated (RPC HELLO on their private address); the build each worker now runs is read back and must be the head's;
then the head is deployed and gated (``/health`` and a real completion, which runs through every worker). A
failure leaves no half topology: the hosts already switched go back to their previous releases. The head is
restarted whenever a worker was (its RPC connections do not survive a worker restart).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.registry import Result
from llamaforge.deploy.hosts.health import gate_service
from llamaforge.deploy.hosts.manage import host_status, rollback_host
from llamaforge.deploy.hosts.prepared import Release
from llamaforge.deploy.hosts.remote import host_state
from llamaforge.deploy.hosts.rollout import RolloutOptions, deploy_host, plan_host
from llamaforge.deploy.release import Layout, release_files
from llamaforge.deploy.report import HostReport, HostStatusReport
from llamaforge.deploy.targets.base import Target
from llamaforge.deploy.topology.workers import check_builds
from llamaforge.runners.ssh import SshProcessRunner


class TopologyDeployResult(Result):
    """A topology deploy or rollback: the head's and each worker's outcome, and whether the whole is healthy."""

    name: str
    head: HostReport
    workers: list[HostReport]
    flags: list[str] = Field(description="The head's llama-server flags (from the split plan)")
    split: list[dict[str, object]] = Field(default_factory=list, description="Blocks and memory per device")
    passed: bool
    wall_s: float


class WorkerStatus(Result):
    """One worker in ``topology.status``."""

    host: str
    endpoint: str
    reachable: bool = Field(description="Its SSH answered")
    active: str | None = Field(None, description="The RPC server unit's state on the worker")
    crash: str | None = Field(
        None, description="The signal that ended the RPC server last, while the service manager still says so"
    )
    current: str | None = None
    build_key: str | None = None
    from_head: bool | None = Field(None, description="The head reaches the RPC port (through the head's SSH)")
    detail: str = ""


class TopologyStatusResult(Result):
    """``topology.status``: the head, every worker, and which worker (if any) breaks the topology."""

    name: str
    head: HostStatusReport
    workers: list[WorkerStatus]
    healthy: bool
    detail: str


@dataclass(frozen=True)
class Member:
    """A host of the topology with its release (for the head: its llama-server; for a worker: its RPC server)."""

    runner: SshProcessRunner
    layout: Layout
    target: Target
    endpoint: str | None = None  # a worker's address:port
    release: Release | None = (
        None  # the release a deploy ships (status and rollback read what is on the host)
    )

    def ready(self) -> Release:
        """The release this member is deployed with (a deploy prepared one for every member)."""
        if self.release is None:
            raise ValueError(f"{self.runner.host.address} has no release prepared")
        return self.release


def _ok(report: HostReport) -> bool:
    return report.status in ("updated", "unchanged")


def _untouched(member: Member, detail: str = "") -> HostReport:
    return HostReport(
        host=member.runner.host.address, status="untouched", release=None, previous=None, detail=detail
    )


def _undo(
    members: Sequence[Member], reports: Sequence[HostReport], options: RolloutOptions
) -> list[HostReport]:
    """Put every member this deploy switched back on its previous release (gated)."""
    undone = []
    for member, report in zip(members, reports, strict=True):
        if report.status == "updated" and report.previous is not None:
            back = rollback_host(member.runner, member.layout, member.target, report.previous, options)
            undone.append(back.model_copy(update={"detail": f"undone: {back.detail}"}))
        else:
            undone.append(report)
    return undone


def deploy_topology(
    head: Member, workers: Sequence[Member], options: RolloutOptions
) -> tuple[list[HostReport], HostReport]:
    """Deploy the workers, check their builds, then the head (see the module docstring)."""
    members = [*workers, head]
    plans = [plan_host(member.runner, member.ready()) for member in members]
    unreachable = [plan for plan, state in plans if state is None]
    if unreachable:
        reports = [
            HostReport(host=plan.host, status="unreachable", release=None, previous=None, detail=plan.detail)
            if state is None
            else _untouched(member, "another host of the topology is unreachable")
            for member, (plan, state) in zip(members, plans, strict=True)
        ]
        return reports[:-1], reports[-1]
    files = release_files(head.ready().spec)
    worker_reports: list[HostReport] = []
    for member, (_plan, state) in zip(workers, plans[:-1], strict=True):
        assert state is not None
        worker_reports.append(deploy_host(member.runner, member.ready(), state, files, options))
        if not _ok(worker_reports[-1]):
            break
    if len(worker_reports) < len(workers) or not all(_ok(report) for report in worker_reports):
        done = _undo(workers[: len(worker_reports)], worker_reports, options)
        rest = [_untouched(member) for member in workers[len(worker_reports) :]]
        return [*done, *rest], _untouched(head, "a worker failed, so the head was not changed")
    running = {member.runner.host.address: _running_build(member) for member in workers}
    try:
        check_builds(head.runner.host.address, head.ready().spec.build_key, running)
    except LlamaforgeError as error:
        return _undo(workers, worker_reports, options), _untouched(head, error.render())
    head_state = plans[-1][1]
    assert head_state is not None
    head_report = deploy_host(head.runner, head.ready(), head_state, files, options)
    if head_report.status == "unchanged" and any(report.status == "updated" for report in worker_reports):
        head_report = _restart_head(head, options)
    if not _ok(head_report):
        return _undo(workers, worker_reports, options), head_report
    return worker_reports, head_report


def _running_build(member: Member) -> str | None:
    record = host_state(member.runner, member.layout).record or {}
    key = record.get("build_key")
    return str(key) if key is not None else None


def _restart_head(head: Member, options: RolloutOptions) -> HostReport:
    """Restart the head on its current release (its workers restarted) and gate it."""
    release = head.ready()
    release.target.activate(head.runner, release.layout)
    gate = gate_service(
        head.runner,
        release.target,
        release.layout,
        release.spec.port,
        model_size=release.spec.model_size,
        checks=release.checks,
        timeout_s=options.gate_timeout_s,
        cancel=options.cancel,
    )
    base = {"host": head.runner.host.address, "release": release.id, "previous": release.id}
    if gate.passed:
        return HostReport(
            **base,
            status="unchanged",
            health_s=gate.health_s,
            completion=gate.completion,
            detail=f"restarted for its workers: {gate.detail}",
        )
    return HostReport(
        **base, status="failed", logs=gate.logs, detail=f"restarted for its workers: {gate.detail}"
    )


def paired_workers(head: Member, to: str | None) -> tuple[str | None, dict[str, str]]:
    """The head's release to go back to (``to``, default its previous one) and the worker releases it was
    deployed with (``release.json``'s ``rpc_workers``: endpoint -> release id)."""
    from llamaforge.deploy.hosts.remote import release_facts

    state = host_state(head.runner, head.layout)
    wanted = to or state.previous()
    if wanted is None or wanted not in state.releases:
        return wanted, {}
    record, _size = release_facts(head.runner, head.layout, wanted)
    pairs = record.get("rpc_workers") or []
    return wanted, {str(pair["endpoint"]): str(pair["release"]) for pair in pairs}


def rollback_topology(
    head: Member, workers: Sequence[Member], to: str | None, options: RolloutOptions
) -> tuple[list[HostReport], HostReport]:
    """The head's previous release (or ``to``) and, first, the worker releases it was deployed with; each is
    gated, and the first failure stops the rest."""
    try:
        wanted, pairs = paired_workers(head, to)
    except LlamaforgeError as error:
        return [_untouched(member) for member in workers], HostReport(
            host=head.runner.host.address,
            status="unreachable",
            release=None,
            previous=None,
            detail=error.render(),
        )
    if wanted is None:  # rollback_host says there is no earlier release
        untouched = [_untouched(member) for member in workers]
        return untouched, rollback_host(head.runner, head.layout, head.target, None, options)
    reports: list[HostReport] = []
    for member in workers:
        if reports and reports[-1].status not in ("rolled back", "unchanged"):
            reports.append(_untouched(member))
            continue
        target_release = pairs.get(member.endpoint or "")
        if target_release is None:
            detail = f"the head's release {wanted} names no release for {member.endpoint}"
            reports.append(
                HostReport(
                    host=member.runner.host.address,
                    status="failed",
                    release=None,
                    previous=None,
                    detail=detail,
                )
            )
            continue
        reports.append(rollback_host(member.runner, member.layout, member.target, target_release, options))
    if not all(report.status in ("rolled back", "unchanged") for report in reports):
        return reports, _untouched(head, "a worker did not roll back")
    head_report = rollback_host(head.runner, head.layout, head.target, wanted, options)
    if head_report.status == "unchanged" and any(report.status == "rolled back" for report in reports):
        head_report = _restart_head(head, options)
    return reports, head_report


def _reaches(runner: SshProcessRunner, endpoint: str) -> bool:
    """Whether ``endpoint`` accepts a TCP connection made by the head host (a direct-tcpip channel from its
    sshd). Nothing is sent: the RPC server serves one client at a time, and the head is that client."""
    host, _, port = endpoint.rpartition(":")
    try:
        channel = runner.connection.transport.open_channel(
            "direct-tcpip", (host.strip("[]"), int(port)), ("127.0.0.1", 0), timeout=5.0
        )
    except Exception:  # noqa: BLE001 - refused, unreachable or timed out: the head cannot reach it
        return False
    channel.close()
    return True


def worker_status(runner: SshProcessRunner, member: Member, head: SshProcessRunner | None) -> WorkerStatus:
    """The worker's unit state and release, and whether the head reaches its RPC port."""
    endpoint = member.endpoint or ""
    try:
        state = host_state(runner, member.layout)
        service = member.target.state(runner, member.layout)
    except LlamaforgeError as error:
        return WorkerStatus(
            host=runner.host.address, endpoint=endpoint, reachable=False, detail=error.render()
        )
    from_head = _reaches(head, endpoint) if head is not None else None
    return WorkerStatus(
        host=runner.host.address,
        endpoint=endpoint,
        reachable=True,
        active=service.active,
        crash=service.crash,
        current=state.current,
        build_key=(state.record or {}).get("build_key"),
        from_head=from_head,
    )


def topology_status(head: Member, workers: Sequence[Member]) -> TopologyStatusResult:
    """The head's status, each worker's, and the first thing that keeps the topology from serving."""
    head_report = host_status(head.runner, head.layout, head.target)
    reach = head.runner if head_report.reachable else None
    reports = [worker_status(member.runner, member, reach) for member in workers]
    problems = []
    if not head_report.reachable:
        problems.append(f"head {head_report.host}: unreachable")
    elif not head_report.healthy:
        crashed = f", {head_report.crash}" if head_report.crash else ""
        problems.append(f"head {head_report.host}: {head_report.active}{crashed}, /health not answering 200")
    for report in reports:
        if not report.reachable:
            problems.append(f"worker {report.host} ({report.endpoint}): SSH unreachable")
        elif report.active != "active":
            crashed = f", {report.crash}" if report.crash else ""
            problems.append(f"worker {report.host} ({report.endpoint}): RPC server {report.active}{crashed}")
        elif report.from_head is False:
            problems.append(f"worker {report.host} ({report.endpoint}): the head cannot reach its RPC port")
        if report.build_key and head_report.build_key and report.build_key != head_report.build_key:
            problems.append(
                f"worker {report.host} runs build {report.build_key}, the head {head_report.build_key}"
            )
    detail = "; ".join(problems) or "head and every worker serve"
    return TopologyStatusResult(
        name=head.layout.name, head=head_report, workers=reports, healthy=not problems, detail=detail
    )


def topology_passed(workers: Sequence[HostReport], head: HostReport, *, rollback: bool = False) -> bool:
    """Whether every host ended where the operation wanted it."""
    good = ("rolled back", "unchanged") if rollback else ("updated", "unchanged")
    return all(report.status in good for report in [*workers, head])


def elapsed(started: float) -> float:
    """Seconds since ``started`` (monotonic), rounded to milliseconds."""
    return round(time.monotonic() - started, 3)
