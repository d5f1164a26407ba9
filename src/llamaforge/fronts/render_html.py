"""HTML renderings of operation results for notebooks: the helpers (tables, badges, inline PNG charts) the
operations' own HTML renderers use, a generic table/JSON view for operations without one, and the lookup.

The notebook twin of :mod:`llamaforge.fronts.render_cli`: each operation's registration names its renderer, which
sits beside the operation (e.g. :mod:`llamaforge.build.render`). Charts are drawn on object-oriented matplotlib
figures (no pyplot state).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

MiB = float(1 << 20)


def escape(value: Any) -> str:
    """``value`` as text safe inside HTML (quotes too)."""
    return html.escape(str(value), quote=True)


class Raw(str):
    """A table cell that is already HTML."""


_STATUS_COLOURS = {
    "ok": "#2e7d32",
    "pass": "#2e7d32",
    "succeeded": "#2e7d32",
    "warn": "#ef6c00",
    "skipped": "#ef6c00",
    "running": "#1565c0",
    "fail": "#c62828",
    "failed": "#c62828",
    "cancelled": "#ef6c00",
}


def badge(status: Any) -> Raw:
    """A status word in its colour (ok, fail, running, …)."""
    colour = _STATUS_COLOURS.get(str(status), "#555")
    return Raw(f'<span style="color:{colour};font-weight:bold">{escape(status)}</span>')


def _cell(value: Any) -> str:
    return value if isinstance(value, Raw) else escape("-" if value is None or value == "" else value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table with a header row; cells are escaped unless they are :class:`Raw`."""
    head = "".join(f"<th style='text-align:left'>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'>{_cell(v)}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of names and values."""
    body = "".join(
        f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>{_cell(v)}</td></tr>"
        for k, v in rows
    )
    return f"<table><tbody>{body}</tbody></table>"


def section(title: str, body: str) -> str:
    """A titled block: what each operation's view is wrapped in."""
    return f'<div class="llamaforge"><h4 style="margin:4px 0">{escape(title)}</h4>{body}</div>'


def details(summary: str, body: str, *, open_: bool = False) -> str:
    """A collapsible block (closed unless ``open_``)."""
    return f"<details{' open' if open_ else ''}><summary>{escape(summary)}</summary>{body}</details>"


def pre(text: str) -> str:
    """Preformatted, scrollable text."""
    return f"<pre style='max-height:30em;overflow:auto'>{escape(text)}</pre>"


def json_view(data: Any) -> str:
    """``data`` as indented JSON."""
    return pre(json.dumps(data, indent=2, sort_keys=True, default=str))


def img_png(png: bytes, alt: str) -> str:
    """PNG bytes as an inline image."""
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'


def png_file(path: Any, alt: str) -> str:
    """An existing PNG file inline ('' when it is not there)."""
    file = Path(str(path)) if path else None
    if file is None or file.suffix != ".png" or not file.is_file():
        return ""
    return img_png(file.read_bytes(), alt)


def figure_png(draw: Callable[[Any], None], size: tuple[float, float]) -> bytes:
    # An object-oriented Figure, not pyplot: no global state, no backend switch in the user's kernel.
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, layout="constrained")
    draw(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def mib(value: Any) -> str:
    """Bytes as MiB with one decimal ('-' when not a number)."""
    return f"{float(value) / MiB:.1f} MiB" if isinstance(value, int | float) else "-"


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
    """``data`` (the result of ``operation``) as HTML; a generic table/JSON view when there is no special one."""
    from llamaforge.core.registry import operations

    op = operations().get(operation)
    renderer = op.render_html if op is not None else None
    try:
        body = renderer(data) if renderer else _generic_html(operation, data)
    except (KeyError, TypeError, ValueError, AttributeError):
        # A result whose shape moved on from its renderer still shows, as data.
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
