"""Build executors: where a BuildPlan's script runs on prepared source. One module per executor, each a
subclass of :class:`~llamaforge.build.executors.base.Executor`: ``docker`` (a fresh container of the plan's
builder image), ``local`` (this host) and ``ssh`` (a build host).

Every executor is registered in :data:`EXECUTORS` by the name users pick with ``--executor``; the executor
parameter's type :data:`ExecutorName` is derived from it, so the CLI help and the MCP enum list the same
choices. A new executor (a cloud builder) is a module with a subclass and one line here. The modules are
imported when an executor is made, not with this registry: the ops modules that name the parameter stay cheap
to import.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from llamaforge.core.errors import InvalidOption

if TYPE_CHECKING:
    from llamaforge.build.executors.base import Executor

EXECUTORS: dict[str, str] = {
    "docker": "llamaforge.build.executors.docker:DockerExecutor",
    "local": "llamaforge.build.executors.local:LocalExecutor",
    "ssh": "llamaforge.build.executors.ssh:SshBuildExecutor",
}
"""Every executor by name: the class that implements it, as ``module:Class``."""

if TYPE_CHECKING:
    ExecutorName = str
else:
    ExecutorName = Literal[tuple(EXECUTORS)]
"""The ``--executor`` parameter's type: one of the names in :data:`EXECUTORS`."""


def executor_class(name: str) -> type[Executor]:
    """The class registered as executor ``name``; InvalidOption naming the known ones for any other name."""
    if name not in EXECUTORS:
        choices = " or ".join(f"--executor {known}" for known in EXECUTORS)
        raise InvalidOption(f"unknown executor {name!r}", hint=f"use {choices}")
    module, _, attribute = EXECUTORS[name].partition(":")
    found: type[Executor] = getattr(importlib.import_module(module), attribute)
    return found


def make_executor(name: str, settings: Mapping[str, str] | None = None) -> Executor:
    """The executor ``name`` configured with ``settings`` (the strings its class's ``settings`` names, e.g.
    ``{"url": "ssh://builder@host"}`` for docker); connects to nothing yet."""
    return executor_class(name).from_settings(dict(settings or {}))
