"""``deploy``, ``deploy.status`` and ``deploy.rollback`` with ``--target swarm`` (called from
:mod:`llamaforge.deploy.ops`): the parameters become a runtime image and a service definition, and the
:class:`SwarmReport` is wrapped in the operations' one result shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.backends import backend_devices
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.deploy.report import DeployStatus, RolloutReport, SwarmReport

if TYPE_CHECKING:
    from llamaforge.core.registry import OperationContext
    from llamaforge.deploy.ops import DeployParams, HostsParams, RollbackParams

TARGET = "swarm"


def _no_hosts(params: HostsParams) -> None:
    if params.hosts:
        raise InvalidOption(
            "--target swarm deploys to this engine's swarm, not to hosts",
            hint="leave out --hosts (DOCKER_HOST chooses the engine)",
        )


def _rollout(params: HostsParams, swarm: SwarmReport) -> RolloutReport:
    return RolloutReport(
        release=swarm.release,
        target=TARGET,
        name=params.name,
        passed=swarm.passed,
        hosts=[],
        wall_s=swarm.wall_s,
        swarm=swarm,
    )


def _failed(what: str, report: RolloutReport) -> OperationFailed:
    from llamaforge.deploy.ops import DeployFailed

    swarm = report.swarm
    assert swarm is not None
    verdict = (
        "Swarm rolled the update back by itself" if swarm.rolled_back else f"update {swarm.update_state}"
    )
    return OperationFailed(
        f"{what}: {verdict}"
        + (f" ({swarm.update_message})" if swarm.update_message else "")
        + f"; the service runs {swarm.release}, {swarm.healthy} of {swarm.replicas} replicas answering"
        + "".join(f"; slot {task.slot}: {task.last_failure}" for task in swarm.tasks if task.last_failure),
        result=report,
        exit_code=DeployFailed.exit_code,
        hint="the report lists every replica's task; `docker service ps "
        + swarm.service
        + "` shows the history",
    )


def swarm_deploy(params: DeployParams, ctx: OperationContext) -> RolloutReport:
    """Deploy to Swarm: the build's runtime image (made when missing), then the service created or updated."""
    from llamaforge.build.runtime_image import ensure_runtime_image
    from llamaforge.core.events import Event
    from llamaforge.deploy.ops import release_spec
    from llamaforge.deploy.swarm import api_key_secret, deploy_service, swarm_release

    _no_hosts(params)
    spec, _checks = release_spec(params, ctx)
    image = ensure_runtime_image(spec.build_key, reporter=ctx.reporter)
    gpus = backend_devices(image.labels.get("org.llamaforge.build.backend")).gpus
    secret = None
    if params.publish:  # every interface of every node: never without a key
        ident, name, path = api_key_secret(params.name)
        secret = (ident, name)
        ctx.reporter(
            Event(
                "stage",
                f"published on port {params.publish} of every node; API key in {path} "
                f"(the Swarm secret {name})",
                stage="swarm",
            )
        )
    release = swarm_release(
        spec,
        params.name,
        image.tag,
        replicas=params.replicas,
        parallelism=params.batch,
        gpus=gpus,
        publish=params.publish,
        start_period_s=params.gate_timeout_s,
        api_key_secret=secret,
    )
    report = _rollout(params, deploy_service(release, params.name, reporter=ctx.reporter, cancel=ctx.cancel))
    if not report.passed:
        raise _failed(f"deploy of {release.id} to Swarm", report)
    return report


def swarm_status(params: HostsParams) -> DeployStatus:
    """The service's release, Swarm's last update state and every replica, each asked for /health."""
    import time

    from llamaforge.deploy.swarm import report

    _no_hosts(params)
    return DeployStatus(
        target=TARGET, name=params.name, hosts=[], swarm=report(params.name, None, None, time.monotonic())
    )


def swarm_rollback(params: RollbackParams, ctx: OperationContext) -> RolloutReport:
    """Swarm's own rollback to the service's previous spec."""
    from llamaforge.deploy.swarm import rollback_service

    _no_hosts(params)
    if params.release is not None:
        raise InvalidOption(
            "--target swarm rolls back to the previous spec only",
            hint="leave out --release, or deploy the release you want",
        )
    report = _rollout(params, rollback_service(params.name, reporter=ctx.reporter, cancel=ctx.cancel))
    if not report.passed:
        raise _failed("Swarm rollback", report)
    return report
