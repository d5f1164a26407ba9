"""How the build operations' results look: rich output for the CLI, HTML for notebooks (registered with each
operation in :mod:`llamaforge.build.ops`)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from llamaforge.core.views import html
from llamaforge.core.views.console import STATUS


def build_cli(result: dict[str, Any], console: Console) -> None:
    """``build`` for a person: the plan of a dry run, or the build and its artifacts; a matrix as one table."""
    if result.get("matrix") is not None:
        _matrix_cli(result["matrix"], console)
        return
    if result["dry_run"]:
        plan = result["plan"]
        archs = ",".join(plan["cuda_architectures"]) or "-"
        where = f"base={plan['base_image']['tag']}" if plan.get("base_image") else "on a build host"
        toolchain = f" toolchain={plan['toolchain']}" if plan.get("toolchain") else ""
        console.print(
            f"[bold]plan[/bold] recipe={plan['recipe']} platform={plan['platform']}{toolchain} "
            f"backend={plan['backend']} archs={archs} {where}"
        )
        console.print(f"source: {json.dumps(plan['source'])}")
        console.print("patches: " + (", ".join(p["name"] for p in plan["patches"]) or "none"))
        console.print(f"ca bundle: {_ca_bundle(plan)}", highlight=False)
        console.print("cmake: " + " ".join(plan["cmake_args"]), highlight=False)
        console.print(f"plan digest: {plan['plan_digest']}")
        console.print(f"cache key: {plan['cache_key'] or '-'} ({plan['cache_key_note']})")
        from rich.syntax import Syntax  # pygments: only a dry run shows files, a cache hit never

        for name, text in plan["files"].items():
            lexer = "docker" if name == "Dockerfile" else "powershell" if name.endswith(".ps1") else "bash"
            console.print(f"[bold]{name}[/bold]")
            if console.is_terminal:  # highlighted, long lines wrapped, never cut
                console.print(Syntax(text, lexer, line_numbers=False, word_wrap=True))
            else:  # a pipe, a file, a log: the file's text as it is
                console.out(text, end="" if text.endswith("\n") else "\n", highlight=False)
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


def _ca_bundle(plan: dict[str, Any]) -> str:
    bundle = plan.get("ca_bundle")
    return f"{bundle['path']} (from {bundle['from']})" if bundle else "none"


def _matrix_cli(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table("build", "key", "platform", "backend", "archs", "time", "result")
    for row in rows:
        state = {"failed": "[red]failed[/red]", "not run": "[yellow]not run[/yellow]"}.get(row["result"], "")
        table.add_row(
            row["name"],
            row["key"] or "-",
            row["platform"] or "-",
            row["backend"] or "-",
            ",".join(row["archs"]) or "-",
            f"{row['seconds']:.1f} s",
            state or f"[green]{row['result']}[/green]",
        )
    console.print(table)
    for row in rows:
        if row["error"]:
            console.print(f"[red]{row['name']}[/red]: {row['error']}", highlight=False)
            if row["hint"]:
                console.print(f"  hint: {row['hint']}", highlight=False)


def builds_list_cli(result: dict[str, Any], console: Console) -> None:
    """``builds.list`` as a table."""
    table = Table("key", "recipe", "backend", "archs", "patches", "executor", "finished")
    for item in result["builds"]:
        table.add_row(
            item["key"],
            item["recipe"],
            item["backend"],
            ",".join(item["cuda_architectures"]) or "-",
            ",".join(item["patches"]) or "-",
            item["executor"],
            item["finished_at"],
        )
    console.print(table if result["builds"] or result.get("broken") else "no builds yet: `invoke build`")
    for entry in result.get("broken") or []:
        console.print(
            f"[yellow]warning:[/yellow] damaged store entry {entry['path']}: {entry['error']}",
            highlight=False,
            soft_wrap=True,
        )


def doctor_cli(result: dict[str, Any], console: Console) -> None:
    """``doctor`` as a table of checks."""
    table = Table("check", "status", "detail", "next step")
    for check in result["checks"]:
        table.add_row(check["name"], STATUS[check["status"]], check["detail"], check["hint"])
    console.print(table)


def recipes_list_cli(result: dict[str, Any], console: Console) -> None:
    """``recipes.list`` as a table."""
    table = Table("recipe", "backend", "source", "description")
    for item in result["recipes"]:
        table.add_row(item["name"], item["backend"], item["source"], item["description"])
    console.print(table)


def build_html(data: dict[str, Any]) -> str:
    """``build`` in a notebook: the plan, or the build and its artifacts; a matrix as one table."""
    if data.get("matrix") is not None:
        table = [
            (
                row["name"],
                row.get("key") or "-",
                row.get("platform") or "-",
                row.get("backend") or "-",
                ",".join(row.get("archs") or []) or "-",
                f"{row.get('seconds', 0):.1f} s",
                row["result"],
                row.get("error") or "",
            )
            for row in data["matrix"]
        ]
        headers = ["build", "key", "platform", "backend", "archs", "time", "result", "error"]
        return html.section("build matrix", html.table(headers, table))
    if data.get("dry_run"):
        plan = data["plan"]
        source = plan.get("source") or {}
        rows = [
            ("recipe", plan.get("recipe")),
            ("platform", plan.get("platform")),
            *([("toolchain", plan["toolchain"])] if plan.get("toolchain") else []),
            ("backend", plan.get("backend")),
            ("CUDA archs", ",".join(plan.get("cuda_architectures") or []) or "-"),
            ("base image", (plan.get("base_image") or {}).get("tag")),
            ("builder image", plan.get("builder_tag")),
            ("source", " ".join(f"{k}={v}" for k, v in source.items() if k in ("kind", "version", "commit"))),
            ("patches", ", ".join(p["name"] for p in plan.get("patches") or []) or "none"),
            ("CA bundle", _ca_bundle(plan)),
            ("targets", ", ".join(plan.get("targets") or [])),
            ("plan digest", plan.get("plan_digest")),
            ("cache key", f"{plan.get('cache_key') or '-'} ({plan.get('cache_key_note', '')})"),
            ("cmake", html.Raw("<code>" + html.escape(" ".join(plan.get("cmake_args") or [])) + "</code>")),
        ]
        files = "".join(
            html.details(name, html.pre(text)) for name, text in sorted((plan.get("files") or {}).items())
        )
        return html.section("build plan (dry run)", html.kv_table(rows) + files)
    build = data["build"]
    state = html.badge("ok") if build.get("cached") else html.badge("succeeded")
    rows = [
        ("result", html.Raw(f"{state} {'cache hit' if build.get('cached') else 'built'}")),
        ("key", build.get("key")),
        ("path", build.get("path")),
        ("seconds", f"{build.get('seconds', 0):.1f}"),
    ]
    artifacts = html.table(
        ["artifact", "size", "sha256"],
        [
            (
                name,
                html.mib(info.get("size")),
                _short_sha256(info.get("sha256", "")),
            )
            for name, info in sorted((build.get("artifacts") or {}).items())
        ],
    )
    body = html.kv_table(rows) + artifacts
    report = data.get("reproducibility")
    if report:
        verdict = html.badge("ok" if report.get("reproducible") else "fail")
        body += f"<p>reproducible: {verdict}</p>" + html.table(
            ["artifact", "differs in", "explanation"],
            [
                (d.get("path"), ", ".join(d.get("sections") or []), d.get("explanation"))
                for d in report.get("different", [])
            ],
        )
    return html.section("build", body)


def builds_list_html(data: dict[str, Any]) -> str:
    """``builds.list`` in a notebook."""
    builds = data.get("builds") or []
    broken = "".join(
        f"<p>damaged store entry {html.escape(entry['path'])}: {html.escape(entry['error'])}</p>"
        for entry in data.get("broken") or []
    )
    if not builds:
        return html.section("builds", broken or "<p>no builds yet: <code>%llamaforge build</code></p>")
    return html.section(
        "builds",
        broken
        + html.table(
            ["key", "recipe", "backend", "archs", "patches", "executor", "finished"],
            [
                (
                    b["key"],
                    b.get("recipe"),
                    b.get("backend"),
                    ",".join(b.get("cuda_architectures") or []) or "-",
                    ",".join(b.get("patches") or []) or "-",
                    b.get("executor"),
                    b.get("finished_at"),
                )
                for b in builds
            ],
        ),
    )


def builds_show_html(data: dict[str, Any]) -> str:
    """``builds.show`` in a notebook: the manifest's main facts."""
    manifest = data.get("manifest") or {}
    recipe = manifest.get("recipe") or {}
    rows = [
        ("key", manifest.get("key")),
        ("path", data.get("path")),
        ("recipe", recipe.get("name")),
        ("backend", manifest.get("backend")),
        ("finished", manifest.get("finished_at")),
    ]
    artifacts = manifest.get("artifacts") or {}
    table = (
        html.table(
            ["artifact", "size", "sha256"],
            [
                (name, html.mib(info.get("size")), info.get("sha256"))
                for name, info in sorted(artifacts.items())
            ],
        )
        if isinstance(artifacts, dict) and artifacts
        else ""
    )
    manifest_json = html.details("manifest.json", html.json_view(manifest))
    return html.section("build manifest", html.kv_table(rows) + table + manifest_json)


def doctor_html(data: dict[str, Any]) -> str:
    """``doctor`` in a notebook."""
    verdict = html.badge("ok" if data.get("ok") else "fail")
    table = html.table(
        ["check", "status", "detail", "next step"],
        [
            (c["name"], html.badge(c["status"]), c.get("detail"), c.get("hint"))
            for c in data.get("checks", [])
        ],
    )
    return html.section("doctor", f"<p>this machine can build: {verdict}</p>{table}")


def recipes_list_html(data: dict[str, Any]) -> str:
    """``recipes.list`` in a notebook."""
    return html.section(
        "build recipes",
        html.table(
            ["recipe", "backend", "source", "description"],
            [
                (r["name"], r.get("backend"), r.get("source"), r.get("description"))
                for r in data.get("recipes", [])
            ],
        ),
    )


def _short_sha256(digest: str) -> html.Raw:
    text = html.escape(digest)
    return html.Raw(f"<code title='{text}'>{text[:16]}…</code>")
