"""What the deploy operations call: deploy, plan, status and rollback of a deployment, on its SSH hosts or,
for a target that runs elsewhere (``on_hosts = False``: swarm), through the target's own hooks."""

from __future__ import annotations

import secrets
from dataclasses import replace

from llamaforge.core.errors import Cancelled, InvalidOption, OperationFailed
from llamaforge.core.events import CancelToken, Reporter
from llamaforge.deploy.hosts.access import DeployHost, open_runners
from llamaforge.deploy.hosts.fitplan import fit_for_gpu
from llamaforge.deploy.hosts.manage import rollback, status, unanswered
from llamaforge.deploy.hosts.prepared import Release, prepare_release
from llamaforge.deploy.hosts.rollout import RolloutOptions, plan_host, rollout
from llamaforge.deploy.inputs import release_probe, release_spec
from llamaforge.deploy.release import Layout, ReleaseRequest
from llamaforge.deploy.report import DeployFailed, DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.deploy.targets.base import Deployment, RolloutSettings, Target


def host_releases(
    request: ReleaseRequest,
    hosts: list[DeployHost],
    layout: Layout,
    target: Target,
    settings: RolloutSettings,
    reporter: Reporter,
    cancel: CancelToken,
) -> list[Release]:
    """One release per host: the same one unless the fit plan gives hosts with other GPUs other flags."""
    spec, checks = release_spec(request, reporter, cancel)
    key = secrets.token_urlsafe(32) if spec.api_key else None
    probe = release_probe(spec, reporter, cancel) if settings.probe else None
    bound = target.for_spec(spec, reporter)  # docker: the runtime image, made here
    by_gpu: dict[str | None, Release] = {}
    for host in hosts:
        if host.gpu not in by_gpu:
            fit = fit_for_gpu(spec.model, host.gpu, spec.flags, host=host.name, force=settings.force)
            by_gpu[host.gpu] = prepare_release(
                replace(spec, flags=fit.flags),
                layout,
                bound,
                checks,
                api_key=key,
                fit=fit.summary,
                probe=probe,
            )
    return [by_gpu[host.gpu] for host in hosts]


def rollout_options(
    deployment: Deployment, reporter: Reporter, cancel: CancelToken, settings: RolloutSettings | None = None
) -> RolloutOptions:
    """How the rolling loop runs: the settings' canary, batches and failures allowed, the gate's time limit."""
    if settings is None:
        return RolloutOptions(gate_timeout_s=deployment.gate_timeout_s, reporter=reporter, cancel=cancel)
    return RolloutOptions(
        canary=settings.canary,
        batch=settings.batch,
        max_fail_percent=settings.max_fail_percent,
        keep=settings.keep,
        gate_timeout_s=deployment.gate_timeout_s,
        reporter=reporter,
        cancel=cancel,
    )


def _failed(what: str, report: DeployResult) -> OperationFailed:
    if report.interrupted:
        where = ", ".join(
            f"{host.host} {host.status} on {host.release or 'unknown'}" for host in report.hosts
        )
        return OperationFailed(
            f"{what} was interrupted: {where}",
            result=report,
            exit_code=Cancelled.exit_code,
            hint="every host runs a whole release; deploy again to finish",
        )
    bad = [
        f"{host.host} {host.status}" for host in report.hosts if host.status not in ("updated", "unchanged")
    ]
    return OperationFailed(
        f"{what} did not finish on every host: " + ", ".join(bad),
        result=report,
        exit_code=DeployFailed.exit_code,
        hint="the report says where each host was left and why",
    )


def deploy(
    target: Target,
    deployment: Deployment,
    request: ReleaseRequest,
    settings: RolloutSettings,
    reporter: Reporter,
    cancel: CancelToken,
) -> DeployResult:
    """Deploy a release of ``request``: canary, batches, health gate, rollback on failure; OperationFailed with
    the report when a host is left anything but healthy."""
    if not target.on_hosts:
        return target.deploy_service(deployment, request, settings, reporter, cancel)
    hosts = deployment.host_list()
    releases = host_releases(request, hosts, deployment.layout, target, settings, reporter, cancel)
    with open_runners([host.ssh for host in hosts], deployment.access) as runners:
        report = rollout(runners, releases, rollout_options(deployment, reporter, cancel, settings))
    if not report.passed:
        raise _failed(f"deploy of {report.release or 'the releases'}", report)
    return report


def plan(
    target: Target,
    deployment: Deployment,
    request: ReleaseRequest,
    settings: RolloutSettings,
    reporter: Reporter,
    cancel: CancelToken,
) -> DeployPlanResult:
    """What a deploy would change on each host; OperationFailed (exit 14) when a host did not answer."""
    if not target.on_hosts:
        raise InvalidOption(
            f"deploy.plan covers SSH hosts; {target.title or target.name} plans and rolls its own updates",
            hint=f"`invoke deploy.status --target {target.name}` shows the service and replicas",
        )
    hosts = deployment.host_list()
    releases = host_releases(request, hosts, deployment.layout, target, settings, reporter, cancel)
    with open_runners([host.ssh for host in hosts], deployment.access) as runners:
        plans = [plan_host(runner, release)[0] for runner, release in zip(runners, releases, strict=True)]
    first = releases[0]
    result = DeployPlanResult(
        release=first.id, target=first.target.name, name=first.layout.name, record=first.record, hosts=plans
    )
    failure = unanswered("deploy.plan", result)
    if failure is not None:
        raise failure
    return result


def deploy_status(target: Target, deployment: Deployment) -> DeployStatusResult:
    """Per host: current release, service state, health, build key, model sha256 and flags."""
    if not target.on_hosts:
        return target.service_status(deployment)
    with open_runners([host.ssh for host in deployment.host_list()], deployment.access) as runners:
        result = status(runners, deployment.layout, target)
    failure = unanswered("deploy.status", result)
    if failure is not None:
        raise failure
    return result


def deploy_rollback(
    target: Target, deployment: Deployment, release: str | None, reporter: Reporter, cancel: CancelToken
) -> DeployResult:
    """Every host back on its previous release (or ``release``), health-gated, one host at a time."""
    if not target.on_hosts:
        return target.rollback_service(deployment, release, reporter, cancel)
    with open_runners([host.ssh for host in deployment.host_list()], deployment.access) as runners:
        report = rollback(
            runners, deployment.layout, target, release, rollout_options(deployment, reporter, cancel)
        )
    if not report.passed:
        raise _failed("rollback", report)
    return report
