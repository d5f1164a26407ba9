"""Human renderings of operation results (tables and syntax-highlighted files); ``--json`` bypasses them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

_STATUS = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]fail[/red]"}


def _build(result: dict[str, Any], console: Console) -> None:
    if result["dry_run"]:
        plan = result["plan"]
        archs = ",".join(plan["cuda_architectures"]) or "-"
        console.print(
            f"[bold]plan[/bold] recipe={plan['recipe']} backend={plan['backend']} archs={archs} "
            f"base={plan['base_image']['tag']}"
        )
        console.print(f"source: {json.dumps(plan['source'])}")
        console.print("patches: " + (", ".join(p["name"] for p in plan["patches"]) or "none"))
        console.print("cmake: " + " ".join(plan["cmake_args"]), highlight=False)
        console.print(f"plan digest: {plan['plan_digest']}")
        console.print(f"cache key: {plan['cache_key'] or '-'} ({plan['cache_key_note']})")
        console.print(Syntax(plan["files"]["Dockerfile"], "docker", line_numbers=False))
        console.print(Syntax(plan["files"]["build.sh"], "bash", line_numbers=False))
        return
    build = result["build"]
    state = "[green]cache hit[/green]" if build["cached"] else "[green]built[/green]"
    console.print(f"{state} {build['key']} in {build['seconds']:.1f} s\n  {build['path']}")
    table = Table("artifact", "size", "sha256")
    for name, info in sorted(build["artifacts"].items()):
        table.add_row(name, f"{info['size'] / 2**20:.1f} MiB", info["sha256"][:16] + "…")
    console.print(table)
    report = result.get("reproducibility")
    if report:
        if report["reproducible"]:
            console.print(f"[green]reproducible[/green]: {len(report['identical'])} artifacts bit-identical")
        else:
            console.print(f"[red]not reproducible[/red]: {len(report['different'])} artifacts differ")
            for diff in report["different"]:
                sections = ", ".join(diff["sections"]) or "?"
                console.print(f"  {diff['path']}: sections {sections} differ: {diff['explanation']}")
                if diff["kept"]:
                    console.print(f"    rebuilt copy kept at {diff['kept']}")


def _builds_list(result: dict[str, Any], console: Console) -> None:
    table = Table("key", "recipe", "backend", "archs", "patches", "executor", "finished")
    for item in result["builds"]:
        table.add_row(item["key"], item["recipe"], item["backend"], ",".join(item["cuda_architectures"]) or "-",
                      ",".join(item["patches"]) or "-", item["executor"], item["finished_at"])  # fmt: skip
    console.print(table if result["builds"] else "no builds yet: `invoke build`")


def _doctor(result: dict[str, Any], console: Console) -> None:
    table = Table("check", "status", "detail", "next step")
    for check in result["checks"]:
        table.add_row(check["name"], _STATUS[check["status"]], check["detail"], check["hint"])
    console.print(table)


def _recipes_list(result: dict[str, Any], console: Console) -> None:
    table = Table("recipe", "backend", "source", "description")
    for item in result["recipes"]:
        table.add_row(item["name"], item["backend"], item["source"], item["description"])
    console.print(table)


_RENDERERS: dict[str, Callable[[dict[str, Any], Console], None]] = {
    "build": _build,
    "builds.list": _builds_list,
    "doctor": _doctor,
    "recipes.list": _recipes_list,
}


def render_human(name: str, result: dict[str, Any], console: Console) -> None:
    """Print ``result`` of operation ``name`` for a person (pretty JSON when there is no table for it)."""
    renderer = _RENDERERS.get(name)
    if renderer:
        renderer(result, console)
    else:
        console.print_json(json.dumps(result, default=str))
