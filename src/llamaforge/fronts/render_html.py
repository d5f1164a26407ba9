"""HTML renderings of operation results for notebooks: the lookup of an operation's own HTML renderer (named in its
registration, beside the operation, e.g. :mod:`llamaforge.build.render`), and a generic table/JSON view for
operations without one. The building blocks they share are :mod:`llamaforge.core.views.html`.

The notebook twin of :mod:`llamaforge.fronts.render_cli`.
"""

from __future__ import annotations

import io
from typing import Any

from llamaforge.core.views.html import badge, details, escape, json_view, kv_table, section, table
from llamaforge.fronts.render_cli import typed_result


def _generic_html(operation: str, data: dict[str, Any]) -> str:
    """Scalars as a key/value table, lists of flat records as tables, everything else as JSON."""
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict | list)]
    body = kv_table(scalars) if scalars else ""
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            headers = list(dict.fromkeys(k for item in value for k in item))
            if all(not isinstance(item.get(h), dict | list) for item in value for h in headers):
                body += f"<p><b>{escape(key)}</b></p>" + table(
                    headers, [[item.get(h) for h in headers] for item in value]
                )
                continue
        if isinstance(value, dict | list):
            body += details(key, json_view(value), open_=len(data) == 1)
    return section(operation, body or json_view(data))


def render_html(operation: str, data: dict[str, Any], *, seconds: float | None = None) -> str:
    """``data`` (the JSON of a result of ``operation``, as a job keeps it) as HTML: its renderer's view of the typed
    result; a generic table/JSON view when there is no renderer or the data does not fit the result model."""
    from llamaforge.core.registry import operations

    op = operations().get(operation)
    renderer = op.render_html if op is not None else None
    typed = typed_result(op, data) if renderer is not None else None
    try:
        body = (
            renderer(typed) if renderer is not None and typed is not None else _generic_html(operation, data)
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        # A result whose untyped parts (a plan, a model's header) moved on from its renderer still shows, as data.
        body = _generic_html(operation, data)
    code = int(data.get("exit_code", 0) or 0)
    warning = f"<p>{badge('fail')} exit code {code}</p>" if code else ""
    took = f"<div style='color:#888;font-size:80%'>{seconds:.2f} s</div>" if seconds is not None else ""
    return warning + body + took


def render_text(operation: str, data: dict[str, Any]) -> str:
    """``data`` as the CLI prints it (rich tables, plain text), for terminals and text/plain."""
    from rich.console import Console

    from llamaforge.fronts.render_cli import render_human

    buffer = io.StringIO()
    console = Console(file=buffer, width=110, color_system=None, force_terminal=False, force_jupyter=False)
    render_human(operation, data, console)
    return buffer.getvalue().rstrip()
