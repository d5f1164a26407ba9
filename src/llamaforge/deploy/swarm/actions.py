"""Deploy, status and rollback of the swarm target (:mod:`llamaforge.deploy.targets.swarm_service`): the
request becomes a runtime image and a service definition, and the :class:`SwarmReport` is wrapped in the deploy
operations' one result shape."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llamaforge.backends import backend_devices
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.events import CancelToken, Event, Reporter
from llamaforge.deploy.inputs import release_probe, release_spec
from llamaforge.deploy.report import DeployFailed, DeployResult, DeployStatusResult, SwarmReport
from llamaforge.deploy.swarm.service import (
    LABEL_RELEASE,
    SwarmRelease,
    api_key_secret,
    deploy_service,
    probe_nodes,
    report,
    rollback_service,
    service_name,
    swarm_release,
)
from llamaforge.runners import swarm as swarm_api

if TYPE_CHECKING:
    from llamaforge.deploy.release import ReleaseRequest, ReleaseSpec
    from llamaforge.deploy.targets.base import Deployment, RolloutSettings

TARGET = "swarm"


def _no_hosts(deployment: Deployment) -> None:
    if deployment.hosts:
        raise InvalidOption(
            "--target swarm deploys to this engine's swarm, not to hosts",
            hint="leave out --hosts (DOCKER_HOST chooses the engine)",
        )


def _rollout(deployment: Deployment, swarm: SwarmReport) -> DeployResult:
    return DeployResult(
        release=swarm.release,
        target=TARGET,
        name=deployment.name,
        passed=swarm.passed,
        hosts=[],
        wall_s=swarm.wall_s,
        swarm=swarm,
    )


def _failed(what: str, result: DeployResult) -> OperationFailed:
    swarm = result.swarm
    assert swarm is not None
    verdict = (
        "Swarm rolled the update back by itself" if swarm.rolled_back else f"update {swarm.update_state}"
    )
    return OperationFailed(
        f"{what}: {verdict}"
        + (f" ({swarm.update_message})" if swarm.update_message else "")
        + f"; the service runs {swarm.release}, {swarm.healthy} of {swarm.replicas} replicas answering"
        + "".join(f"; slot {task.slot}: {task.last_failure}" for task in swarm.tasks if task.last_failure),
        result=result,
        exit_code=DeployFailed.exit_code,
        hint="the report lists every replica's task; `docker service ps "
        + swarm.service
        + "` shows the history",
    )


def _proven(
    deployment: Deployment,
    spec: ReleaseSpec,
    release: SwarmRelease,
    reporter: Reporter,
    cancel: CancelToken,
) -> SwarmReport | None:
    """Every node runs the release's llama-bench before the service moves to it (:func:`probe_nodes`): the
    probe's report, None when the service already runs the release. A node that cannot run it refuses the
    deploy, and the service is left as it is."""
    started = time.monotonic()
    current = swarm_api.find_service(service_name(deployment.name))
    previous = None if current is None else (current["Spec"].get("Labels") or {}).get(LABEL_RELEASE)
    if previous == release.id:
        return None
    probes, seconds = probe_nodes(
        release, spec.flags, release_probe(spec, reporter, cancel), reporter=reporter, cancel=cancel
    )
    if all(probe.passed for probe in probes):
        return SwarmReport(service=release.definition.name, probes=probes, probe_s=seconds)
    now = report(deployment.name, release.id, previous, started).model_copy(
        update={"probes": probes, "probe_s": seconds, "passed": False}
    )
    failed = next(probe for probe in probes if not probe.passed)
    said, _, hint = failed.detail.partition("\n  hint: ")
    where = "the service still runs " + str(previous) if current is not None else "no service was created"
    raise OperationFailed(
        f"deploy of {release.id} to Swarm refused before any task moved: {said}; {where}",
        result=_rollout(deployment, now),
        exit_code=DeployFailed.exit_code,
        hint=(hint or "the report holds each node's log tail")
        + "; every node's verdict is in the report (swarm.probes); --no-probe deploys without the probe",
    )


def swarm_deploy(
    deployment: Deployment,
    request: ReleaseRequest,
    settings: RolloutSettings,
    reporter: Reporter,
    cancel: CancelToken,
) -> DeployResult:
    """Deploy to Swarm: the build's runtime image (made when missing), then the service created or updated."""
    from llamaforge.build.runtime_image import ensure_runtime_image

    _no_hosts(deployment)
    spec, _checks = release_spec(request, reporter, cancel)
    image = ensure_runtime_image(spec.build_key, reporter=reporter)
    gpus = backend_devices(image.labels.get("org.llamaforge.build.backend")).gpus
    secret = None
    if settings.publish:  # every interface of every node: never without a key
        ident, name, path = api_key_secret(deployment.name)
        secret = (ident, name)
        reporter(
            Event(
                "stage",
                f"published on port {settings.publish} of every node; API key in {path} "
                f"(the Swarm secret {name})",
                stage="swarm",
            )
        )
    release = swarm_release(
        spec,
        deployment.name,
        image.image_id,
        tag=image.tag,
        replicas=settings.replicas,
        parallelism=settings.batch,
        gpus=gpus,
        publish=settings.publish,
        start_period_s=deployment.gate_timeout_s,
        api_key_secret=secret,
    )
    proven = _proven(deployment, spec, release, reporter, cancel) if settings.probe else None
    swarm = deploy_service(release, deployment.name, reporter=reporter, cancel=cancel)
    if proven is not None:
        swarm = swarm.model_copy(update={"probes": proven.probes, "probe_s": proven.probe_s})
    result = _rollout(deployment, swarm)
    if not result.passed:
        raise _failed(f"deploy of {release.id} to Swarm", result)
    return result


def swarm_status(deployment: Deployment) -> DeployStatusResult:
    """The service's release, Swarm's last update state and every replica, each asked for /health."""
    _no_hosts(deployment)
    return DeployStatusResult(
        target=TARGET,
        name=deployment.name,
        hosts=[],
        swarm=report(deployment.name, None, None, time.monotonic()),
    )


def swarm_rollback(
    deployment: Deployment, release: str | None, reporter: Reporter, cancel: CancelToken
) -> DeployResult:
    """Swarm's own rollback to the service's previous spec."""
    _no_hosts(deployment)
    if release is not None:
        raise InvalidOption(
            "--target swarm rolls back to the previous spec only",
            hint="leave out --release, or deploy the release you want",
        )
    result = _rollout(deployment, rollback_service(deployment.name, reporter=reporter, cancel=cancel))
    if not result.passed:
        raise _failed("Swarm rollback", result)
    return result
