"""The compose target: a ``compose.yaml`` for teams that run the release with Docker Compose; render-only
(``deploy.render --target compose``, see :mod:`llamaforge.deploy.manifests.files`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.deploy.manifests.files import render_compose
from llamaforge.deploy.targets.base import Target

if TYPE_CHECKING:
    from llamaforge.deploy.manifests.files import ManifestInputs
    from llamaforge.deploy.release import Layout, ReleaseSpec


class ComposeTarget(Target):
    """Docker Compose: manifests only."""

    name = "compose"
    on_hosts = False
    deploys = False
    renders = True

    def manifests(self, spec: ReleaseSpec, inputs: ManifestInputs, layout: Layout) -> dict[str, str]:
        """``compose.yaml``."""
        return {"compose.yaml": render_compose(spec, inputs)}
