"""How an upgrade's result is shown: a rich summary on the command line, an HTML section in a notebook."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamaforge.core.views import html

if TYPE_CHECKING:  # showing one operation's result imports no other operation's module
    from llamaforge.upgrade.results import UpgradeResult

_COLOURS = {
    "upgrade ok": "green",
    "dry run": "cyan",
    "regression": "yellow",
    "broken": "red",
    "conflicts": "red",
}


def _speed_rows(result: UpgradeResult) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for smoke in result.smokes:
        for row in smoke.rows:
            if row["metric"].startswith(("llama-bench", "c=1 TTFT p50", "c=1 ITL p50")):
                ratio = row["ratio"]
                rows.append(
                    (
                        smoke.model,
                        f"{row['metric']} ({row['unit']})",
                        f"{row['a']:.4g}",
                        f"{row['b']:.4g}",
                        "-" if ratio is None else f"{ratio:.3f}",
                    )
                )
    return rows


def upgrade_cli(result: UpgradeResult, console: Console) -> None:
    """``upgrade``: the two releases, the patches, what moved, the speeds side by side, the verdict."""
    console.print(
        f"{escape(result.recipe)}: {result.old.label} ({result.old.commit[:9]}) -> "
        f"{result.new.label} ({result.new.commit[:9]}, {escape(result.new.origin)})",
        highlight=False,
    )
    patches = Table("patch", "status", "conflicting hunks")
    for patch in result.rebase.patches:
        hunks = "; ".join(f"{file}: {', '.join(found)}" for file, found in patch.files.items())
        patches.add_row(escape(patch.name), patch.status, escape(hunks))
    console.print(patches)
    if result.findings:
        moved = Table("moved", "name", "old", "new", "suggestion")
        for finding in result.findings:
            moved.add_row(
                finding.kind,
                escape(finding.name),
                escape(finding.old or "-"),
                escape(finding.new or "-"),
                escape(finding.suggestion),
            )
        console.print(moved)
    speeds = _speed_rows(result)
    if speeds:
        table = Table("model", "metric", result.old.label, result.new.label, "new/old")
        for row in speeds:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
    for fit in (item for item in result.fit if item.moved):
        console.print(
            f"fit: {fit.model} {fit.category}: {fit.old_mib} -> {fit.new_mib} MiB (plan {fit.planned_mib})",
            highlight=False,
        )
    colour = _COLOURS[result.verdict]
    console.print(
        f"[bold {colour}]{result.verdict}[/bold {colour}]" + (" (applied)" if result.applied else "")
    )
    for reason in result.reasons:
        console.print(f"  - {escape(reason)}", highlight=False)
    console.print(f"next: {escape(result.next_step)}", highlight=False)
    console.print(f"report: {result.files.get('report.md', '-')}", highlight=False)


def upgrade_html(result: UpgradeResult) -> str:
    """``upgrade`` in a notebook: the verdict, the patches, what moved, the speeds and the chart."""
    body = html.kv_table(
        [
            ("recipe", result.recipe),
            ("old", f"{result.old.label} ({result.old.commit[:12]})"),
            ("new", f"{result.new.label} ({result.new.commit[:12]}, {result.new.origin})"),
            ("verdict", html.badge(result.verdict)),
            ("next", result.next_step),
        ]
    )
    body += html.table(
        ["reason"],
        [(reason,) for reason in result.reasons],
    )
    body += html.table(
        ["patch", "status", "conflicts"],
        [(p.name, p.status, "; ".join(p.files)) for p in result.rebase.patches],
    )
    if result.findings:
        body += html.table(
            ["moved", "name", "old", "new", "suggestion"],
            [(f.kind, f.name, f.old, f.new, f.suggestion) for f in result.findings],
        )
    speeds: list[Any] = _speed_rows(result)
    if speeds:
        body += html.table(["model", "metric", result.old.label, result.new.label, "new/old"], speeds)
    return html.section("upgrade", body + html.png_file(result.files.get("report.png"), "old against new"))
