"""Managing what is deployed: ``rollback`` to an earlier release (health-gated) and ``status`` of every host."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

from llamaforge.core.errors import Cancelled, LlamaforgeError, OperationFailed
from llamaforge.core.events import Event
from llamaforge.deploy.hosts.health import gate_service
from llamaforge.deploy.hosts.remote import (
    HostState,
    host_state,
    read_api_key,
    release_facts,
    switch_and_activate,
)
from llamaforge.deploy.hosts.rollout import RolloutOptions, other_target, settle, where_after_loss
from llamaforge.deploy.release import LOOPBACK, Layout
from llamaforge.deploy.report import (
    DeployPlanResult,
    DeployResult,
    DeployStatusResult,
    HostReport,
    HostStatusReport,
    still_on,
)
from llamaforge.deploy.targets.base import Target
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.connection import SshError
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.serve.launcher import request_json


def _read(runner: SshProcessRunner, layout: Layout) -> HostState | HostReport:
    """The host's state, or its ``unreachable`` report."""
    try:
        return host_state(runner, layout)
    except LlamaforgeError as error:
        return HostReport(
            host=runner.host.address, status="unreachable", release=None, previous=None, detail=error.render()
        )


def _wanted(
    state: HostState, to: str | None, base: dict[str, str | None], refused: str = ""
) -> str | HostReport:
    """The release to go back to, or the report of a host that has none (or already runs it, or whose
    deployment runs with another target: ``refused`` says why)."""
    if refused:
        return HostReport(**base, status="failed", release=state.current, detail=refused)
    wanted = to or state.previous()
    if wanted is None or wanted not in state.releases:
        known = ", ".join(state.releases) or "none"
        what = f"release {wanted} is not on the host" if wanted else "there is no earlier release"
        return HostReport(
            **base, status="failed", release=state.current, detail=f"{what} (releases: {known})"
        )
    if wanted == state.current:
        return HostReport(**base, status="unchanged", release=wanted, detail="already current")
    return wanted


def rollback_host(
    runner: SshProcessRunner,
    layout: Layout,
    target: Target,
    to: str | None,
    options: RolloutOptions,
    state: HostState | None = None,
) -> HostReport:
    """Switch the host to release ``to`` (default: the previous one), restart and gate it; a failed gate
    switches it back to where it was. Ctrl-C or SIGTERM (``options.cancel``) before the switch leaves it on its
    release; after it, on the release it was rolled back to (a release it ran before, restarted, not gated);
    either way ``interrupted``. A lost connection is ``unreachable``, with the release when it is known."""
    read = state or _read(runner, layout)
    if isinstance(read, HostReport):
        return read
    state = read
    base = {"host": runner.host.address, "previous": state.current}
    wanted = _wanted(state, to, base, other_target(state, target, runner.host.address, layout))
    if isinstance(wanted, HostReport):
        return wanted
    history = list(state.history)
    while history and history[-1] != wanted:
        history.pop()
    history = history or [wanted]
    switched = False

    def step(what: str) -> None:
        options.reporter(Event("stage", f"{runner.host.address}: {what}", stage="deploy"))

    try:
        options.cancel.raise_if_cancelled()
        record, size = release_facts(runner, layout, wanted)
        options.cancel.raise_if_cancelled()
        step(f"switching back to {wanted} and restarting")
        switched = True
        switch_and_activate(runner, layout, target, wanted, history)  # not cancelled half-way: one command
        step(f"switched to {wanted}; gating")
        key = read_api_key(runner, layout, wanted) if record.get("api_key_file") else None
        gate = gate_service(
            runner,
            target,
            layout,
            int(record["port"]),
            model_size=size,
            timeout_s=options.gate_timeout_s,
            cancel=options.cancel,
            api_key=key,
            listen=str(record.get("listen", LOOPBACK)),
        )
    except Cancelled:
        on = wanted if switched else state.current
        what = f"on {wanted}, restarted, not gated" if switched else still_on(state.current)
        step(f"interrupted: {what}")
        return HostReport(**base, status="interrupted", release=on, detail=f"interrupted: {what}")
    except SshError as error:
        on, where = where_after_loss(runner, layout, target, (state.current, wanted), switched)
        return HostReport(
            **base, status="unreachable", release=on, detail=f"connection lost: {error.render()}; {where}"
        )
    if gate.passed:
        return HostReport(
            **base,
            status="rolled back",
            release=wanted,
            health_s=gate.health_s,
            completion=gate.completion,
            detail=gate.detail,
        )
    failed = HostReport(
        **base,
        status="failed",
        release=wanted,
        logs=gate.logs,
        detail=f"{wanted} failed its gate ({gate.detail})",
    )
    return _back(runner, layout, target, state, failed)


def _back(
    runner: SshProcessRunner, layout: Layout, target: Target, state: HostState, failed: HostReport
) -> HostReport:
    """Put a host whose rollback failed its gate back where it was (``state``): its release, or, when it had
    none, the service stopped."""
    if state.current is None:
        target.stop(runner, layout)
        return failed.model_copy(
            update={
                "detail": f"{failed.detail}; no previous release to go back to, so the service was stopped"
            }
        )
    switch_and_activate(runner, layout, target, state.current, state.history)
    return failed.model_copy(
        update={"release": state.current, "detail": f"{failed.detail}; back on {state.current}"}
    )


def rollback(
    runners: Sequence[SshProcessRunner],
    layout: Layout,
    target: Target,
    to: str | None,
    options: RolloutOptions,
) -> DeployResult:
    """Roll every host back, one at a time (each host read first, so the report names every host's release);
    the first failure, or Ctrl-C / SIGTERM, stops it and the rest stay untouched."""
    started = time.monotonic()
    states = [_read(runner, layout) for runner in runners]
    reports: list[HostReport] = []
    for runner, state in zip(runners, states, strict=True):
        stopped = options.cancel.cancelled or (
            reports and reports[-1].status not in ("rolled back", "unchanged")
        )
        if stopped and isinstance(state, HostState):
            reports.append(
                HostReport(
                    host=runner.host.address,
                    status="untouched",
                    release=state.current,
                    previous=state.current,
                )
            )
        elif isinstance(state, HostReport):  # unreachable
            reports.append(state)
        else:
            call = partial(rollback_host, runner, layout, target, to, options, state)
            reports.append(settle({0: call}, options.cancel)[0])
    passed = all(report.status in ("rolled back", "unchanged") for report in reports)
    return DeployResult(
        release=to,
        target=target.name,
        name=layout.name,
        passed=passed,
        interrupted=options.cancel.cancelled,
        hosts=reports,
        wall_s=round(time.monotonic() - started, 3),
    )


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
        host=runner.host.address,
        reachable=True,
        current=state.current,
        releases=list(state.releases),
        active=service.active,
        crash=service.crash,
        healthy=healthy,
        build_key=record.get("build_key"),
        model_sha256=record.get("model_sha256"),
        flags=record.get("flags"),
    )


def status(runners: Sequence[SshProcessRunner], layout: Layout, target: Target) -> DeployStatusResult:
    """``host_status`` of every host."""
    return DeployStatusResult(
        target=target.name,
        name=layout.name,
        hosts=[host_status(runner, layout, target) for runner in runners],
    )


def unanswered(what: str, result: DeployStatusResult | DeployPlanResult) -> OperationFailed | None:
    """The failure of a status or plan in which a host did not answer (unreachable, its key refused, its host
    key unknown), naming each such host and why; None when every host answered. A status or plan that could not
    read a host cannot vouch for it, so one host is enough (exit code 14, SSH's)."""
    lost = [host for host in result.hosts if not host.reachable]
    if not lost:
        return None
    reasons = "; ".join(host.detail.split("\n", 1)[0] or f"{host.host} did not answer" for host in lost)
    hints = list(
        dict.fromkeys(
            line.split("hint: ", 1)[1]
            for host in lost
            for line in host.detail.splitlines()
            if "hint: " in line
        )
    )
    if len(lost) == len(result.hosts):
        message = f"{what}: no host answered: {reasons}"
    else:
        message = f"{what}: {len(lost)} of {len(result.hosts)} hosts did not answer: {reasons}"
    hint = hints[0] + ("; the report gives each host's own hint" if len(hints) > 1 else "") if hints else None
    return OperationFailed(message, result=result, exit_code=SshError.exit_code, hint=hint)
