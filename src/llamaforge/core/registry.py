"""The registry of operations: written once here, read by every front (Invoke, the MCP server, Jupyter).

An operation takes a typed parameter model, reports progress through ``OperationContext.reporter``, honours
``OperationContext.cancel`` and returns JSON-able data. Fronts only parse arguments and present results.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from llamaforge.core.events import CancelToken, Reporter, null_reporter


@dataclass
class OperationContext:
    """What a front hands to an operation: where progress goes and how to cancel."""

    reporter: Reporter = null_reporter
    cancel: CancelToken = field(default_factory=CancelToken)


class Params(BaseModel):
    """Base of operation parameter models."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Operation:
    """One capability, as every front sees it."""

    name: str
    summary: str
    params: type[Params]
    run: Callable[[Any, OperationContext], dict[str, Any]]
    read_only: bool
    destructive: bool = False
    long_running: bool = False
    positional: tuple[str, ...] = ()


def result_json(result: Any) -> dict[str, Any]:
    """An operation's result as JSON data: what ``--json`` prints, a job keeps and MCP returns."""
    return dict(result)


REGISTRY: dict[str, Operation] = {}
_discovered = False


def operations() -> dict[str, Operation]:
    """Every registered operation by name. The first call imports each domain's operation modules: any module
    named ``ops`` or ``ops_*`` in a subpackage of llamaforge registers its operations when imported."""
    global _discovered  # noqa: PLW0603 - discovery runs once per process
    if not _discovered:
        _discovered = True
        for module in _operation_modules():
            importlib.import_module(module)
    return REGISTRY


def _operation_modules() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    found = []
    for package in sorted(path for path in root.iterdir() if (path / "__init__.py").is_file()):
        for module in pkgutil.iter_modules([str(package)]):
            if module.name == "ops" or module.name.startswith("ops_"):
                found.append(f"llamaforge.{package.name}.{module.name}")
    return found


def operation(
    name: str,
    params: type[Params],
    *,
    read_only: bool,
    destructive: bool = False,
    long_running: bool = False,
    positional: tuple[str, ...] = (),
) -> Callable[
    [Callable[[Any, OperationContext], dict[str, Any]]], Callable[[Any, OperationContext], dict[str, Any]]
]:
    """Register the decorated function as operation ``name`` (its docstring's first line is the summary)."""

    def register(
        function: Callable[[Any, OperationContext], dict[str, Any]],
    ) -> Callable[[Any, OperationContext], dict[str, Any]]:
        summary = (function.__doc__ or name).strip().splitlines()[0]
        REGISTRY[name] = Operation(
            name, summary, params, function, read_only, destructive, long_running, positional
        )
        return function

    return register
