"""Deploy targets: how a release runs. One module per target, each a :class:`~.base.Target` subclass, and this
one registry; the ``--target`` choices of ``deploy`` and ``deploy.render`` are read from it.

* ``systemd`` (:mod:`.systemd`) and ``docker`` (:mod:`.container`): a service on each SSH host;
* ``rpc-server`` (:mod:`.rpc_server`): a topology's RPC worker (``topology.*``, not ``--target``);
* ``swarm`` (:mod:`.swarm_service`): a service on this engine's Docker Swarm, no hosts;
* ``compose`` and ``kubernetes`` (:mod:`.compose`, :mod:`.kubernetes`): manifests only (``deploy.render``), as
  is the systemd unit.

Add a target: a module here with a ``Target`` subclass (override the hooks it does differently), listed in
``TARGETS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from llamaforge.core.errors import InvalidOption
from llamaforge.core.validation import suggest
from llamaforge.deploy.targets.base import Deployment, RolloutSettings, ServiceState, Target
from llamaforge.deploy.targets.compose import ComposeTarget
from llamaforge.deploy.targets.container import DockerTarget
from llamaforge.deploy.targets.kubernetes import KubernetesTarget
from llamaforge.deploy.targets.rpc_server import RpcServerTarget
from llamaforge.deploy.targets.swarm_service import SwarmTarget
from llamaforge.deploy.targets.systemd import SystemdTarget

__all__ = [
    "TARGETS",
    "DeployTargetName",
    "Deployment",
    "RenderTargetName",
    "RolloutSettings",
    "ServiceState",
    "Target",
    "deploy_target_names",
    "get_target",
    "render_target_names",
    "topology_head",
]

TARGETS: dict[str, type[Target]] = {
    target.name: target
    for target in (SystemdTarget, DockerTarget, SwarmTarget, RpcServerTarget, ComposeTarget, KubernetesTarget)
}


def deploy_target_names() -> list[str]:
    """The values of ``deploy --target``, in the registry's order."""
    return [name for name, target in TARGETS.items() if target.deploys]


def render_target_names() -> list[str]:
    """The values of ``deploy.render --target``, by name."""
    return sorted(name for name, target in TARGETS.items() if target.renders)


if TYPE_CHECKING:
    DeployTargetName = str
    RenderTargetName = str
else:  # pydantic reads the choices: the CLI's help, the MCP tools' enum and the notebooks' argparse list them
    DeployTargetName = Literal[tuple(deploy_target_names())]
    RenderTargetName = Literal[tuple(render_target_names())]


def get_target(name: str) -> Target:
    """The target called ``name`` (made without options); InvalidOption with "did you mean" otherwise."""
    if name not in TARGETS:
        known = deploy_target_names()
        raise InvalidOption(
            f"unknown deploy target {name!r}",
            hint=suggest(name, known, end=" ") + "known: " + ", ".join(known),
        )
    return TARGETS[name]()


def topology_head() -> Target:
    """The target a topology's head runs llama-server with (the one marked ``heads_topology``)."""
    return next(target() for target in TARGETS.values() if target.heads_topology)
