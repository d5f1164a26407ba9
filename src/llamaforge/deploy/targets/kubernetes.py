"""The kubernetes target: a Service and a Deployment for teams that run the release on Kubernetes; render-only
(``deploy.render --target kubernetes``, see :mod:`llamaforge.deploy.manifests.files`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.deploy.manifests.files import render_kubernetes
from llamaforge.deploy.targets.base import Target

if TYPE_CHECKING:
    from llamaforge.deploy.manifests.files import ManifestInputs
    from llamaforge.deploy.release import Layout, ReleaseSpec


class KubernetesTarget(Target):
    """Kubernetes: manifests only."""

    name = "kubernetes"
    on_hosts = False
    deploys = False
    renders = True

    def manifests(self, spec: ReleaseSpec, inputs: ManifestInputs, layout: Layout) -> dict[str, str]:
        """``llamaforge-NAME.yaml``: the Service and the Deployment."""
        return {f"llamaforge-{inputs.name}.yaml": render_kubernetes(spec, inputs)}
