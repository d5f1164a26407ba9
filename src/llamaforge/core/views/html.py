"""HTML building blocks for the result views in notebooks: escaping, tables, badges, collapsible blocks and inline
PNG charts. The operations' HTML renderers (``render.py`` beside each operation) and the fronts' generic view both
use them; they know no operation. Charts are drawn on object-oriented matplotlib figures (no pyplot state)."""

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
