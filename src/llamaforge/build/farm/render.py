"""How ``builders.status`` looks: a rich table for the CLI, HTML for notebooks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from llamaforge.core.views import html

if TYPE_CHECKING:
    from llamaforge.build.farm.ops import BuildersStatusResult, BuilderState


def _figure(value: float | None, probed: bool, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}{' (probed)' if probed else ''}"


def _row(state: BuilderState) -> list[str]:
    return [
        state.name,
        state.address,
        ",".join(state.platforms),
        ",".join(state.labels) or "-",
        str(state.concurrency),
        state.version or "-",
        _figure(state.cores, state.cores_probed),
        _figure(state.memory_gib, state.memory_probed, " GiB"),
        _figure(state.free_disk_gib, False, " GiB"),
        "\n".join(state.images) or "-",
    ]


HEADERS = [
    "builder",
    "address",
    "platforms",
    "labels",
    "slots",
    "version",
    "cores",
    "memory",
    "free disk",
    "images",
]


def builders_status_cli(result: BuildersStatusResult, console: Console) -> None:
    """``builders.status`` as a table, then why each unreachable builder did not answer."""
    table = Table(*HEADERS)
    for state in result.builders:
        cells = _row(state)
        if not state.reachable:
            cells[5] = "[red]unreachable[/red]"
        table.add_row(*cells)
    console.print(table)
    console.print(
        f"{result.reachable} of {len(result.builders)} builders answered ({result.fleet})", highlight=False
    )
    for state in result.builders:
        if state.error:
            console.print(f"[red]{state.name}[/red]: {state.error}", highlight=False, soft_wrap=True)
            if state.hint:
                console.print(f"  hint: {state.hint}", highlight=False, soft_wrap=True)


def builders_status_html(result: BuildersStatusResult) -> str:
    """``builders.status`` in a notebook."""
    rows = [(*_row(state), state.error or "") for state in result.builders]
    return html.section(f"builders of {result.fleet}", html.table([*HEADERS, "error"], rows))
