"""The swarm target: the release as a service on this engine's Docker Swarm, no SSH hosts (see
:mod:`llamaforge.deploy.swarm`); Swarm rolls the update, gates it on the image's health check and rolls it
back by itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.deploy.swarm import actions
from llamaforge.deploy.targets.base import Target

if TYPE_CHECKING:
    from llamaforge.core.events import CancelToken, Reporter
    from llamaforge.deploy.release import ReleaseRequest
    from llamaforge.deploy.report import DeployResult, DeployStatusResult
    from llamaforge.deploy.targets.base import Deployment, RolloutSettings


class SwarmTarget(Target):
    """A Docker Swarm service."""

    name = "swarm"
    title = "Swarm"
    summary = "a service on this engine's Docker Swarm, no hosts"
    on_hosts = False

    def deploy_service(
        self,
        deployment: Deployment,
        request: ReleaseRequest,
        settings: RolloutSettings,
        reporter: Reporter,
        cancel: CancelToken,
    ) -> DeployResult:
        """The build's runtime image (made when missing), then the service created or updated."""
        return actions.swarm_deploy(deployment, request, settings, reporter, cancel)

    def service_status(self, deployment: Deployment) -> DeployStatusResult:
        """The service's release, Swarm's last update state and every replica, each asked for /health."""
        return actions.swarm_status(deployment)

    def rollback_service(
        self, deployment: Deployment, release: str | None, reporter: Reporter, cancel: CancelToken
    ) -> DeployResult:
        """Swarm's own rollback to the service's previous spec."""
        return actions.swarm_rollback(deployment, release, reporter, cancel)
