"""Human renderings of operation results: each operation's registration names its rich renderer (beside the
operation, e.g. :mod:`llamaforge.build.render`), which takes the typed result; one without prints pretty JSON.
``--json`` bypasses them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from rich.console import Console

from llamaforge.core.registry import result_json

if TYPE_CHECKING:
    from llamaforge.core.registry import Operation


def typed_result(op: Operation | None, data: dict[str, Any]) -> BaseModel | None:
    """``data`` (a result's JSON, as a job keeps it) as ``op``'s typed Result model again; None when there is no
    operation or the data no longer fits its model (a result from an older version), so the generic view shows
    it as data."""
    if op is None:
        return None
    try:
        return op.result.model_validate(data)
    except ValidationError:
        return None


def render_human(name: str, result: dict[str, Any], console: Console) -> None:
    """Print ``result`` (JSON data) of operation ``name`` for a person (pretty JSON when it has no renderer)."""
    from llamaforge.core.registry import operations

    op = operations().get(name)
    typed = typed_result(op, result) if op is not None and op.render_cli is not None else None
    if typed is None:
        console.print_json(json.dumps(result, default=str))
    else:
        render_result(op, typed, console)


def render_result(op: Operation | None, result: BaseModel, console: Console) -> None:
    """Print ``result`` (``op``'s typed Result) for a person (pretty JSON when it has no renderer). The CLI holds
    the operation it ran: looking it up by name would import every other operation's module."""
    if op is not None and op.render_cli is not None:
        op.render_cli(result, console)
    else:
        console.print_json(json.dumps(result_json(result), default=str))
