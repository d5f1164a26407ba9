"""Plan, roll out, roll back and inspect a release over hosts, with its own per-host loop.

Before any host changes, every host is reached and read (the plan): an unreachable host or a refused host key
stops the rollout with nothing changed anywhere. Then the canary hosts go first, then batches (the hosts of a
batch in parallel, one runner each); a host whose gate fails is put back on its previous release (``current``
switched back, the service restarted and gated again), the rollout stops, and hosts not reached stay
untouched. Fabric's groups are not used: they run every host even after one failed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.deploy.health import GateOutcome, gate_service
from llamaforge.deploy.release import (
    KEEP_RELEASES,
    Layout,
    ReleaseSpec,
    release_files,
    release_id,
    release_record,
)
from llamaforge.deploy.remote import HostState, host_state, prune_releases, switch_current, upload_release
from llamaforge.deploy.report import HostPlan, HostReport, RolloutReport
from llamaforge.deploy.targets import Target
from llamaforge.models.recipes import AnswerCheck
from llamaforge.runners.ssh import SshProcessRunner


@dataclass(frozen=True)
class Release:
    """A release ready to ship: its inputs, where it goes, how it runs, its id and rendered files."""

    spec: ReleaseSpec
    layout: Layout
    target: Target
    id: str
    service_files: dict[str, str]
    record: dict[str, Any]
    checks: tuple[AnswerCheck, ...] = ()


def prepare_release(
    spec: ReleaseSpec, layout: Layout, target: Target, checks: Sequence[AnswerCheck] = ()
) -> Release:
    """Render the release's service files and derive its id (no host needed)."""
    files = target.service_files(spec, layout)
    rid = release_id(spec, files)
    return Release(spec, layout, target, rid, files, release_record(spec, rid, target.name), tuple(checks))


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout proceeds: canary hosts, batch size, releases kept, the gate's time limit."""

    canary: int = 1
    batch: int = 1
    keep: int = KEEP_RELEASES
    gate_timeout_s: float | None = None
    reporter: Reporter = null_reporter
    cancel: CancelToken = field(default_factory=CancelToken)


def batches(count: int, canary: int, batch: int) -> list[list[int]]:
    """Host indexes in rollout order: the first ``canary`` hosts, then groups of ``batch``."""
    first = list(range(min(max(canary, 0), count)))
    rest = list(range(len(first), count))
    step = max(batch, 1)
    return ([first] if first else []) + [rest[start : start + step] for start in range(0, len(rest), step)]


def plan_host(runner: SshProcessRunner, release: Release) -> tuple[HostPlan, HostState | None]:
    """What deploying ``release`` would change on the host (it only reads); unreachable hosts say why."""
    layout, spec = release.layout, release.spec
    flags_after = spec.flags.args()
    try:
        state = host_state(runner, layout)
        has_model = (
            not spec.model_sha256 or runner.run(["test", "-e", layout.model(spec.model_sha256)], warn=True).ok
        )
    except LlamaforgeError as error:
        return HostPlan(host=runner.host.address, reachable=False, current=None, release=release.id,
                        action="upload", model_upload=True, model_bytes=spec.model_size, restart=True,
                        flags_before=None, flags_after=flags_after, detail=error.render()), None  # fmt: skip
    before = state.record.get("flags") if state.record else None
    action = "none" if state.current == release.id else "switch" if release.id in state.releases else "upload"
    return HostPlan(
        host=runner.host.address, reachable=True, current=state.current, release=release.id, action=action,
        model_upload=not has_model, model_bytes=0 if has_model else spec.model_size, restart=action != "none",
        flags_before=before, flags_after=flags_after,
    ), state  # fmt: skip


def _gate(
    runner: SshProcessRunner, release: Release, options: RolloutOptions, port: int, size: int
) -> GateOutcome:
    return gate_service(runner, release.target, release.layout, port, model_size=size, checks=release.checks,
                       timeout_s=options.gate_timeout_s, cancel=options.cancel)  # fmt: skip


def _restore(runner: SshProcessRunner, release: Release, state: HostState, failed: GateOutcome,
             options: RolloutOptions, report: dict[str, Any]) -> HostReport:  # fmt: skip
    """Put the host back on the release that was current before ``release`` and gate it again."""
    layout, target = release.layout, release.target
    if state.current is None:
        target.stop(runner, layout)
        return HostReport(
            **report,
            status="failed",
            release=release.id,
            logs=failed.logs,
            detail=f"{failed.detail}; no earlier release to go back to, so the service was stopped",
        )
    history = (
        list(state.history)
        if state.history and state.history[-1] == state.current
        else [*state.history, state.current]
    )
    switch_current(runner, layout, state.current, history)
    target.activate(runner, layout)
    record = state.record or {}
    again = _gate(
        runner, release, options, int(record.get("port", release.spec.port)), release.spec.model_size
    )
    status = "rolled back" if again.passed else "failed"
    detail = f"{failed.detail}; back on {state.current}: " + (
        "healthy" if again.passed else f"NOT healthy: {again.detail}"
    )
    return HostReport(**report, status=status, release=state.current, logs=failed.logs, health_s=again.health_s,
                      completion=again.completion or None, detail=detail)  # fmt: skip


def deploy_host(runner: SshProcessRunner, release: Release, state: HostState, files: Sequence[tuple[Path, str]],
                options: RolloutOptions) -> HostReport:  # fmt: skip
    """Ship, switch, restart and gate one host; a failed gate restores its previous release."""
    base: dict[str, Any] = {"host": runner.host.address, "previous": state.current}
    if state.current == release.id:
        return HostReport(**base, status="unchanged", release=release.id, detail="already current")
    layout, target = release.layout, release.target
    options.reporter(Event("stage", f"{runner.host.address}: deploying {release.id}", stage="deploy"))
    switched, sent, model = False, 0, 0
    try:
        target.prepare(runner, layout)
        upload = upload_release(runner, layout, release.spec, release.id, files, release.service_files,
                                release.record, cancel=options.cancel)  # fmt: skip
        sent, model = upload.sent_bytes, upload.model_bytes
        history = [*state.history, release.id]
        switch_current(runner, layout, release.id, history)
        switched = True
        target.activate(runner, layout)
        gate = _gate(runner, release, options, release.spec.port, release.spec.model_size)
    except Exception as error:  # noqa: BLE001 - whatever went wrong on this host ends in its report
        message = error.render() if isinstance(error, LlamaforgeError) else f"{type(error).__name__}: {error}"
        if not switched:
            return HostReport(**base, status="failed", release=state.current, sent_bytes=sent, model_bytes=model,
                              detail=f"{message}; still on {state.current}")  # fmt: skip
        gate = GateOutcome(False, message)
    report = {**base, "sent_bytes": sent, "model_bytes": model}
    if not gate.passed:
        return _restore(runner, release, state, gate, options, report)
    prune_releases(runner, layout, host_state(runner, layout), options.keep)
    return HostReport(**report, status="updated", release=release.id, health_s=gate.health_s,
                      completion=gate.completion, detail=gate.detail)  # fmt: skip


def _passed(report: HostReport) -> bool:
    return report.status in ("updated", "unchanged")


def rollout(runners: Sequence[SshProcessRunner], release: Release, options: RolloutOptions) -> RolloutReport:
    """Deploy ``release`` to every host in order (see the module docstring)."""
    started = time.monotonic()
    plans = [plan_host(runner, release) for runner in runners]
    reports: list[HostReport | None] = [None] * len(runners)
    if all(state is not None for _plan, state in plans):
        files = release_files(release.spec) if any(plan.action == "upload" for plan, _ in plans) else []
        for group in batches(len(runners), options.canary, options.batch):
            with ThreadPoolExecutor(max_workers=len(group)) as pool:
                done = pool.map(lambda index: deploy_host(runners[index], release, plans[index][1],  # type: ignore[arg-type]
                                                          files, options), group)  # fmt: skip
                for index, report in zip(group, done, strict=True):
                    reports[index] = report
            if not all(_passed(reports[index]) for index in group):  # type: ignore[arg-type]
                break
    final = [
        report if report is not None
        else HostReport(host=plan.host, status="unreachable", release=None, previous=None, detail=plan.detail)
        if not plan.reachable
        else HostReport(host=plan.host, status="untouched", release=plan.current, previous=plan.current)
        for report, (plan, _state) in zip(reports, plans, strict=True)
    ]  # fmt: skip
    return RolloutReport(release=release.id, target=release.target.name, name=release.layout.name,
                         passed=all(_passed(report) for report in final), hosts=final,
                         wall_s=round(time.monotonic() - started, 3))  # fmt: skip
