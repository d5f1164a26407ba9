"""Managing what is deployed: ``rollback`` to an earlier release (health-gated) and ``status`` of every host."""

from __future__ import annotations

import time
from collections.abc import Sequence

from llamaforge.core.errors import LlamaforgeError
from llamaforge.deploy.health import gate_service
from llamaforge.deploy.release import LOOPBACK, Layout
from llamaforge.deploy.remote import host_state, read_api_key, release_facts, switch_and_activate
from llamaforge.deploy.report import DeployStatus, HostReport, HostStatusReport, RolloutReport
from llamaforge.deploy.rollout import RolloutOptions
from llamaforge.deploy.targets import Target
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh_forward import forward_local
from llamaforge.serve.launcher import request_json


def rollback_host(runner: SshProcessRunner, layout: Layout, target: Target, to: str | None,
                  options: RolloutOptions) -> HostReport:  # fmt: skip
    """Switch the host to release ``to`` (default: the previous one), restart and gate it; a failed gate
    switches it back to where it was."""
    try:
        state = host_state(runner, layout)
    except LlamaforgeError as error:
        return HostReport(host=runner.host.address, status="unreachable", release=None, previous=None,
                          detail=error.render())  # fmt: skip
    base = {"host": runner.host.address, "previous": state.current}
    wanted = to or state.previous()
    if wanted is None or wanted not in state.releases:
        known = ", ".join(state.releases) or "none"
        what = f"release {wanted} is not on the host" if wanted else "there is no earlier release"
        return HostReport(
            **base, status="failed", release=state.current, detail=f"{what} (releases: {known})"
        )
    if wanted == state.current:
        return HostReport(**base, status="unchanged", release=wanted, detail="already current")
    history = list(state.history)
    while history and history[-1] != wanted:
        history.pop()
    history = history or [wanted]
    record, size = release_facts(runner, layout, wanted)
    switch_and_activate(runner, layout, target, wanted, history)
    key = read_api_key(runner, layout, wanted) if record.get("api_key_file") else None
    gate = gate_service(runner, target, layout, int(record["port"]), model_size=size,
                        timeout_s=options.gate_timeout_s, cancel=options.cancel, api_key=key,
                        listen=str(record.get("listen", LOOPBACK)))  # fmt: skip
    if gate.passed:
        return HostReport(**base, status="rolled back", release=wanted, health_s=gate.health_s,
                          completion=gate.completion, detail=gate.detail)  # fmt: skip
    if state.current is not None:
        switch_and_activate(runner, layout, target, state.current, state.history)
    return HostReport(**base, status="failed", release=state.current, logs=gate.logs,
                      detail=f"{wanted} failed its gate ({gate.detail}); back on {state.current}")  # fmt: skip


def rollback(runners: Sequence[SshProcessRunner], layout: Layout, target: Target, to: str | None,
             options: RolloutOptions) -> RolloutReport:  # fmt: skip
    """Roll every host back, one at a time; the first failure stops it and the rest stay untouched."""
    started = time.monotonic()
    reports: list[HostReport] = []
    for runner in runners:
        if reports and reports[-1].status not in ("rolled back", "unchanged"):
            reports.append(
                HostReport(host=runner.host.address, status="untouched", release=None, previous=None)
            )
            continue
        reports.append(rollback_host(runner, layout, target, to, options))
    passed = all(report.status in ("rolled back", "unchanged") for report in reports)
    return RolloutReport(release=to, target=target.name, name=layout.name, passed=passed, hosts=reports,
                         wall_s=round(time.monotonic() - started, 3))  # fmt: skip


def host_status(runner: SshProcessRunner, layout: Layout, target: Target) -> HostStatusReport:
    """The host's current release, its service state, whether ``/health`` answers 200, and what it runs."""
    try:
        state = host_state(runner, layout)
        service = target.state(runner, layout)
    except LlamaforgeError as error:
        return HostStatusReport(host=runner.host.address, reachable=False, detail=error.render())
    record = state.record or {}
    healthy = None
    if state.current is not None and "port" in record:
        with forward_local(runner, int(record["port"])) as port:
            healthy = request_json(port, "GET", "/health", timeout=5.0)[0] == 200
    return HostStatusReport(
        host=runner.host.address, reachable=True, current=state.current, releases=list(state.releases),
        active=service.active, healthy=healthy, build_key=record.get("build_key"),
        model_sha256=record.get("model_sha256"), flags=record.get("flags"),
    )  # fmt: skip


def status(runners: Sequence[SshProcessRunner], layout: Layout, target: Target) -> DeployStatus:
    """``host_status`` of every host."""
    return DeployStatus(target=target.name, name=layout.name,
                        hosts=[host_status(runner, layout, target) for runner in runners])  # fmt: skip
