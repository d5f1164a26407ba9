"""The deploy targets' plug-in shape: one registry, the ``--target`` choices read from it, defaults a target
leaves alone, and operation discovery that reaches the ops modules nested in deploy's sub-packages."""

from __future__ import annotations

import signal
import typing

import pytest

from llamaforge.core.errors import InvalidOption
from llamaforge.core.registry import _operation_modules, operations
from llamaforge.deploy.hosts.ops import DeployParams, HostsParams
from llamaforge.deploy.manifests.ops import DeployRenderParams
from llamaforge.deploy.release import Layout
from llamaforge.deploy.targets import (
    TARGETS,
    DeployTargetName,
    RenderTargetName,
    deploy_target_names,
    get_target,
    render_target_names,
    topology_head,
)
from llamaforge.deploy.targets.base import ServiceState, Target

pytestmark = pytest.mark.quick


def test_every_registered_target_is_a_target_under_its_own_name() -> None:
    assert set(TARGETS) == {"systemd", "docker", "swarm", "rpc-server", "compose", "kubernetes"}
    for name, target in TARGETS.items():
        assert issubclass(target, Target) and target.name == name
    assert deploy_target_names() == ["systemd", "docker", "swarm"]
    assert render_target_names() == ["compose", "kubernetes", "systemd"]
    assert topology_head().name == "systemd"


def test_the_target_parameters_list_the_registrys_choices() -> None:
    assert typing.get_args(DeployTargetName) == tuple(deploy_target_names())
    assert typing.get_args(RenderTargetName) == tuple(render_target_names())
    # what the MCP tools' schemas and the CLI help show
    assert HostsParams.model_json_schema()["properties"]["target"]["enum"] == deploy_target_names()
    assert DeployRenderParams.model_json_schema()["properties"]["target"]["enum"] == render_target_names()
    for name in deploy_target_names():
        assert name in str(HostsParams.model_fields["target"].description)


def test_a_target_no_deploy_takes_is_refused_with_did_you_mean() -> None:
    with pytest.raises(ValueError, match="did you mean 'kubernetes'"):
        DeployRenderParams(target="kubernets", build="k", model="tiny")
    with pytest.raises(ValueError, match="unknown deploy target 'compose'"):
        DeployParams(target="compose", build="k", model="tiny")  # render-only
    with pytest.raises(ValueError, match="unknown deploy target 'rpc-server'"):
        HostsParams(target="rpc-server")  # a topology's worker only


def test_the_base_hooks_default_to_a_service_that_needs_nothing_but_its_files() -> None:
    class Bare(Target):
        name = "bare"

    bare = Bare()
    layout = Layout("lab")
    assert bare.service_files.__func__ is Target.service_files  # type: ignore[attr-defined]
    assert bare.listens.__func__ is Target.listens  # type: ignore[attr-defined]
    assert bare.probe_signal(132, []) is signal.SIGILL and bare.probe_signal(1, []) is None
    assert bare.pending.__func__ is Target.pending  # type: ignore[attr-defined]
    with pytest.raises(InvalidOption, match="no service on SSH hosts"):
        bare.activation(layout)
    with pytest.raises(InvalidOption, match="runs on SSH hosts"):
        get_target("systemd").service_status(None)  # type: ignore[arg-type]
    assert ServiceState("unknown", 0) == ServiceState("unknown", 0)


def test_swarm_runs_elsewhere_and_the_render_only_targets_render() -> None:
    assert not get_target("swarm").on_hosts and get_target("swarm").deploys
    for name in ("compose", "kubernetes"):
        assert TARGETS[name].renders and not TARGETS[name].deploys and not TARGETS[name].on_hosts


def test_discovery_reaches_the_ops_modules_of_nested_packages() -> None:
    modules = _operation_modules()
    assert {
        "llamaforge.deploy.hosts.ops",
        "llamaforge.deploy.topology.ops",
        "llamaforge.deploy.manifests.ops",
    } <= set(modules)
    assert modules == sorted(set(modules))
    names = set(operations())
    assert {"deploy", "deploy.plan", "deploy.render", "deploy.rollback", "deploy.status"} <= names
    assert {
        "topology.deploy",
        "topology.plan",
        "topology.rollback",
        "topology.smoke",
        "topology.status",
    } <= names
