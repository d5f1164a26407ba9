"""Plan, roll out, roll back and inspect a release over hosts, with its own per-host loop.

Before any host changes, every host is reached and read (the plan): an unreachable host or a refused host key
stops the rollout with nothing changed anywhere. Then the canary hosts go first, then batches (the hosts of a
batch in parallel, one runner each); a host whose gate fails is put back on its previous release (``current``
switched back, the service restarted and gated again), the rollout stops, and hosts not reached stay
untouched. Fabric's groups are not used: they run every host even after one failed.

``max_fail_percent`` works like Ansible's ``max_fail_percentage``: the rollout goes on after a batch unless
the share of its hosts that failed (rolled back, failed, unreachable) EXCEEDS it (0: any failure stops it).
A host whose connection is lost mid-rollout (noticed within seconds: the runner's SSH keepalive) is reported
unreachable and counts as failed: the switch of ``current`` (one rename) and the service's restart are one
command on the host, which either never arrived or ran to its end there, so it runs one whole release; one
new connection then reads which (the report names both candidates when the host does not answer).
Ctrl-C or SIGTERM (the cancel token) stops the rollout: a host still uploading
stays on its release, a host already switched is put back on its previous one and gated again, and every host
not reached stays untouched; each one's report says which release it was left on (status ``interrupted``).
Each host's steps are reported as events (``deploy`` stage) for the fronts' job views.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from llamaforge.core.errors import Cancelled, LlamaforgeError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.deploy.hosts.access import check_root_access
from llamaforge.deploy.hosts.health import GateOutcome, gate_service
from llamaforge.deploy.hosts.prepared import Release
from llamaforge.deploy.hosts.probe import ProbeOutcome, has_probe_model, prove
from llamaforge.deploy.hosts.remote import (
    HostState,
    busy_port,
    host_state,
    prune_releases,
    read_api_key,
    switch_and_activate,
    upload_release,
)
from llamaforge.deploy.release import (
    KEEP_RELEASES,
    LOOPBACK,
    Layout,
    ReleaseCannotRun,
)
from llamaforge.deploy.report import DeployResult, HostPlan, HostReport, still_on
from llamaforge.deploy.targets.base import Target
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.connection import HostKeyChanged, HostKeyUnknown, SshError


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout proceeds: canary hosts, batch size, releases kept, the gate's time limit."""

    canary: int = 1
    batch: int = 1
    max_fail_percent: float = 0.0
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
        return HostPlan(
            host=runner.host.address,
            reachable=False,
            current=None,
            release=release.id,
            action="upload",
            model_upload=True,
            model_bytes=spec.model_size,
            restart=True,
            flags_before=None,
            flags_after=flags_after,
            detail=error.render(),
        ), None
    refused = other_target(state, release.target, runner.host.address, layout)
    delivery = ""
    try:
        check_root_access(runner)  # a deploy user who is not root needs sudo without a password
        release.target.check(runner)  # e.g. no Docker engine there: refused before any host changes
        delivery = release.target.pending(runner)
    except LlamaforgeError as error:
        refused = refused or error.render()
    before = state.record.get("flags") if state.record else None
    action = "none" if state.current == release.id else "switch" if release.id in state.releases else "upload"
    # a release already on the host (with what the target delivers) is proven while planning, before anything
    # changes anywhere
    ready = action == "switch" and not refused and not delivery
    proven = prove(runner, release) if ready and has_probe_model(runner, release) else None
    if proven is not None and not proven.passed:
        refused = f"{proven.detail}\n  (nothing was changed)"
    bound = release.target.listens(spec) if action != "none" and not refused else None
    clash = busy_port(runner, state, bound) if bound else None
    if bound and clash:
        refused = (
            f"{runner.host.address}: port {bound[1]} is in use there ({clash} listens, not this deployment's "
            f"current release), so llama-server could not bind {bound[0]}:{bound[1]}; choose another --port or "
            "stop what listens there (nothing was changed)"
        )
    return HostPlan(
        host=runner.host.address,
        reachable=True,
        current=state.current,
        release=release.id,
        action=action,
        model_upload=not has_model,
        model_bytes=0 if has_model else spec.model_size,
        restart=action != "none",
        flags_before=before,
        flags_after=flags_after,
        listen=spec.listen,
        api_key=spec.api_key,
        delivery=delivery,
        fit=list(release.fit),
        probe=proven.detail if proven else "",
        detail=refused,
    ), None if refused else state


def other_target(state: HostState, target: Target, address: str, layout: Layout) -> str:
    """Why ``target`` cannot take over the deployment on the host when its current release runs with another
    target (each target restarts and restores only its own releases); empty when it can."""
    recorded = (state.record or {}).get("target")
    if not recorded or recorded == target.name:
        return ""
    return (
        f"{address}: the deployment {layout.name!r} runs with --target {recorded} there, not {target.name}; use "
        f"--target {recorded}, or another --name for a {target.name} deployment (nothing was changed)"
    )


def _gate(
    runner: SshProcessRunner,
    release: Release,
    options: RolloutOptions,
    rid: str,
    record: dict[str, Any],
    size: int,
    cancel: CancelToken | None = None,
) -> GateOutcome:
    """Gate release ``rid`` (``record``: its release.json), with the key it carries when it has one."""
    key = read_api_key(runner, release.layout, rid) if record.get("api_key_file") else None
    return gate_service(
        runner,
        release.target,
        release.layout,
        int(record["port"]),
        model_size=size,
        checks=release.checks,
        timeout_s=options.gate_timeout_s,
        cancel=cancel or options.cancel,
        api_key=key,
        listen=str(record.get("listen", LOOPBACK)),
    )


def _lost(runner: SshProcessRunner, error: BaseException) -> bool:
    """True when ``error`` is the SSH connection failing (a refused host key is no lost connection); an error
    from elsewhere (SFTP's, paramiko's) counts when the host no longer answers a command."""
    if isinstance(error, HostKeyUnknown | HostKeyChanged | Cancelled):
        return False
    if isinstance(error, SshError):
        return True
    if isinstance(error, LlamaforgeError):
        return False
    try:
        runner.run(["true"], timeout_s=15)
    except Exception:  # noqa: BLE001 - any failure to run a command means the host is gone
        return True
    return False


PLAN_THREADS = 16  # hosts connected to and read at once before a rollout
RECHECK_TIMEOUT_S = 10.0  # how long a host that lost its connection gets to answer once more


def where_after_loss(
    runner: SshProcessRunner, layout: Layout, target: Target, releases: tuple[str | None, str], switched: bool
) -> tuple[str | None, str]:
    """Where a host that lost its connection while going from ``releases[0]`` to ``releases[1]`` was left:
    the release it is on (None when it does not answer again) and a sentence that says so; one new
    connection, given :data:`RECHECK_TIMEOUT_S`, reads ``current`` and the service."""
    before, after = releases
    if not switched:
        return before, f"{still_on(before)} (nothing was switched)"
    runner.close()
    again = SshProcessRunner(
        runner.host,
        accept_new_host_keys=False,
        user_known_hosts=runner.user_known_hosts,
        connect_timeout_s=RECHECK_TIMEOUT_S,
    )
    try:
        with again:
            now = host_state(again, layout)
            service = target.state(again, layout)
    except Exception:  # noqa: BLE001 - whatever the reason, the host is not answering
        either = f"{after} or {before}" if before else f"{after} or none (no previous release)"
        return None, (
            f"it runs one whole release, {either} (switch and restart are one command on "
            "the host); it did not answer again, `invoke deploy.status` says which"
        )
    return now.current, f"it answered again: on {now.current}, service {service.active}, not gated"


def _restore(
    runner: SshProcessRunner,
    release: Release,
    state: HostState,
    failed: GateOutcome,
    options: RolloutOptions,
    report: dict[str, Any],
) -> HostReport:
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
    switch_and_activate(runner, layout, target, state.current, history)
    record = state.record or {"port": release.spec.port}
    # gated to its end even after Ctrl-C: the report must say whether the host it leaves is healthy
    again = _gate(runner, release, options, state.current, record, release.spec.model_size, CancelToken())
    status = "rolled back" if again.passed else "failed"
    detail = f"{failed.detail}; back on {state.current}: " + (
        "healthy" if again.passed else f"NOT healthy: {again.detail}"
    )
    return HostReport(
        **report,
        status=status,
        release=state.current,
        logs=failed.logs,
        health_s=again.health_s,
        completion=again.completion or None,
        detail=detail,
    )


def deploy_host(
    runner: SshProcessRunner,
    release: Release,
    state: HostState,
    files: Sequence[tuple[Path, str]],
    options: RolloutOptions,
) -> HostReport:
    """Ship, switch, restart and gate one host; a failed gate restores its previous release."""
    base: dict[str, Any] = {"host": runner.host.address, "previous": state.current}
    if state.current == release.id:
        return HostReport(**base, status="unchanged", release=release.id, detail="already current")
    layout, target = release.layout, release.target
    address = runner.host.address

    def step(what: str) -> None:
        options.reporter(Event("stage", f"{address}: {what}", stage="deploy"))

    step(f"deploying {release.id}")
    switched, sent, model, image = False, 0, 0, 0
    proven: ProbeOutcome | None = None
    try:
        options.cancel.raise_if_cancelled()
        target.prepare(runner, layout)
        step("uploading" if release.id not in state.releases else "release already on the host")
        upload = upload_release(
            runner,
            layout,
            release.spec,
            release.id,
            files,
            release.service_files,
            release.record,
            api_key=release.api_key,
            probe=release.probe,
            cancel=options.cancel,
        )
        sent, model = upload.sent_bytes, upload.model_bytes
        options.cancel.raise_if_cancelled()
        image = target.deliver(runner, layout, options.cancel)
        sent += image
        options.cancel.raise_if_cancelled()
        proven = prove(runner, release, options.reporter, options.cancel)
        options.cancel.raise_if_cancelled()
        if proven is not None and proven.refusal is not None:
            raise proven.refusal  # nothing was switched: the host stays on its release
        step(f"switching to {release.id} and restarting")
        switched = True  # from here the host may run either release until it says which
        switch_and_activate(runner, layout, target, release.id, [*state.history, release.id])
        step(f"switched to {release.id}; gating")
        gate = _gate(runner, release, options, release.id, release.record, release.spec.model_size)
    except Exception as error:  # noqa: BLE001 - whatever went wrong on this host ends in its report
        message = error.render() if isinstance(error, LlamaforgeError) else f"{type(error).__name__}: {error}"
        moved = {"sent_bytes": sent, "model_bytes": model, "image_bytes": image}
        if _lost(runner, error):
            on, where = where_after_loss(runner, layout, target, (state.current, release.id), switched)
            step(f"unreachable: {message}; {where}")
            return HostReport(
                **base,
                **moved,
                status="unreachable",
                release=on,
                detail=f"connection lost: {message}; {where}",
            )
        if isinstance(error, Cancelled) and not switched:
            step(f"interrupted; {still_on(state.current)}")
            return HostReport(
                **base,
                **moved,
                status="interrupted",
                release=state.current,
                detail=f"interrupted before the switch; {still_on(state.current)}",
            )
        if not switched:
            step(f"failed: {message}")
            logs = list(error.logs) if isinstance(error, ReleaseCannotRun) else []
            return HostReport(
                **base,
                **moved,
                **_probed(proven),
                status="failed",
                release=state.current,
                logs=logs,
                detail=f"{message}; {still_on(state.current)}",
            )
        gate = GateOutcome(False, "interrupted" if isinstance(error, Cancelled) else message)
    report = {**base, "sent_bytes": sent, "model_bytes": model, "image_bytes": image}
    if not gate.passed:
        back = f"restoring {state.current}" if state.current else "no previous release to restore"
        step(f"gate failed ({gate.detail}); {back}")
        restored = _restore(runner, release, state, gate, options, report)
        if options.cancel.cancelled and restored.status == "rolled back":
            restored = restored.model_copy(update={"status": "interrupted"})
        step(f"{restored.status}: on {restored.release}")
        return restored
    prune_releases(runner, layout, target, host_state(runner, layout), options.keep)
    step(f"updated: {release.id} healthy")
    return HostReport(
        **report,
        status="updated",
        release=release.id,
        health_s=gate.health_s,
        completion=gate.completion,
        detail=gate.detail,
        api_key_file=_key_path(release),
        **_probed(proven),
    )


def _probed(proven: ProbeOutcome | None) -> dict[str, Any]:
    """The report's fields of the probe (none ran: None)."""
    return {"probe": proven.detail, "probe_s": round(proven.seconds, 3)} if proven else {}


def _key_path(release: Release) -> str | None:
    from llamaforge.deploy.release import API_KEY_FILE

    return f"{release.layout.release(release.id)}/{API_KEY_FILE}" if release.spec.api_key else None


def _passed(report: HostReport) -> bool:
    return report.status in ("updated", "unchanged")


def too_many_failed(reports: Sequence[HostReport], max_fail_percent: float) -> bool:
    """Ansible's ``max_fail_percentage`` for one batch: True when the share of its hosts that did not pass
    EXCEEDS ``max_fail_percent`` (so 0 stops at the first failure and 100 never stops)."""
    failed = sum(not _passed(report) for report in reports)
    return bool(reports) and 100.0 * failed / len(reports) > max_fail_percent


def settle(calls: Mapping[int, Callable[[], HostReport]], cancel: CancelToken) -> dict[int, HostReport]:
    """Run ``calls`` in parallel, one thread each, to their reports; Ctrl-C here cancels them and waits for
    every one to settle (each stops on a whole release and reports it). The work runs beside the main thread
    so Ctrl-C's KeyboardInterrupt lands here and never inside a command on a host."""
    with ThreadPoolExecutor(max_workers=max(len(calls), 1)) as pool:
        futures: dict[int, Future[HostReport]] = {index: pool.submit(call) for index, call in calls.items()}
        try:
            wait(list(futures.values()))
        except KeyboardInterrupt:
            cancel.cancel()  # each host stops at a whole release; wait for them to get there
            wait(list(futures.values()))
    return {index: future.result() for index, future in futures.items()}


def _run_batch(
    runners: Sequence[SshProcessRunner],
    releases: Sequence[Release],
    plans: Sequence[tuple[HostPlan, HostState | None]],
    files: dict[str, list[tuple[Path, str]]],
    group: Sequence[int],
    options: RolloutOptions,
) -> dict[int, HostReport]:
    """Deploy one batch, its hosts in parallel (:func:`settle`)."""
    calls: dict[int, Callable[[], HostReport]] = {
        index: partial(
            deploy_host,
            runners[index],
            releases[index],
            plans[index][1],  # type: ignore[arg-type]
            files[releases[index].id],
            options,
        )
        for index in group
    }
    return settle(calls, options.cancel)


def rollout(
    runners: Sequence[SshProcessRunner], release: Release | Sequence[Release], options: RolloutOptions
) -> DeployResult:
    """Deploy ``release`` (or one release per host, e.g. flags fitted to each host's GPU) to every host in
    order (see the module docstring)."""
    started = time.monotonic()
    releases = [release] * len(runners) if isinstance(release, Release) else list(release)
    with ThreadPoolExecutor(max_workers=min(max(len(runners), 1), PLAN_THREADS)) as pool:  # connect and read
        plans = list(pool.map(plan_host, runners, releases))
    reports: list[HostReport | None] = [None] * len(runners)
    if all(state is not None for _plan, state in plans):
        uploads = {
            item.id for item, (plan, _state) in zip(releases, plans, strict=True) if plan.action == "upload"
        }
        files = {item.id: item.target.files(item.spec) if item.id in uploads else [] for item in releases}
        for group in batches(len(runners), options.canary, options.batch):
            done = _run_batch(runners, releases, plans, files, group, options)
            for index, report in done.items():
                reports[index] = report
            if options.cancel.cancelled or too_many_failed(list(done.values()), options.max_fail_percent):
                break
    final = [
        report
        if report is not None
        else HostReport(host=plan.host, status="unreachable", release=None, previous=None, detail=plan.detail)
        if not plan.reachable
        else HostReport(
            host=plan.host, status="failed", release=plan.current, previous=plan.current, detail=plan.detail
        )
        if state is None  # reached, but the target refused the host (Target.check)
        else HostReport(host=plan.host, status="untouched", release=plan.current, previous=plan.current)
        for report, (plan, state) in zip(reports, plans, strict=True)
    ]
    ids = {item.id for item in releases}
    return DeployResult(
        release=ids.pop() if len(ids) == 1 else None,
        target=releases[0].target.name,
        name=releases[0].layout.name,
        passed=all(_passed(report) for report in final),
        interrupted=options.cancel.cancelled,
        hosts=final,
        wall_s=round(time.monotonic() - started, 3),
    )
