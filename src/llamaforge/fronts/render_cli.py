"""Human renderings of operation results: each operation's registration names its rich renderer (beside the
operation, e.g. :mod:`llamaforge.build.render`); one without prints pretty JSON. ``--json`` bypasses them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from llamaforge.core.registry import Operation


def render_human(name: str, result: dict[str, Any], console: Console) -> None:
    """Print ``result`` of operation ``name`` for a person (pretty JSON when it has no renderer)."""
    from llamaforge.core.registry import operations

    render_result(operations().get(name), result, console)


def render_result(op: Operation | None, result: dict[str, Any], console: Console) -> None:
    """Print ``result`` of ``op`` for a person (pretty JSON when it has no renderer). The CLI holds the
    operation it ran: looking it up by name would import every other operation's module."""
    if op is not None and op.render_cli is not None:
        op.render_cli(result, console)
    else:
        console.print_json(json.dumps(result, default=str))
