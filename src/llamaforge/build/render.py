"""How the build operations' results look: rich output for the CLI, HTML for notebooks (registered with each
operation in :mod:`llamaforge.build.ops` and :mod:`llamaforge.build.ops_store`). Each takes the operation's typed
result, so a renamed field is a type error here, not a view that silently shows less."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from llamaforge.core.views import html
from llamaforge.core.views.console import STATUS

if TYPE_CHECKING:  # showing a build's result imports no other operation's module
    from llamaforge.build.matrix import MatrixRow
    from llamaforge.build.ops import BuildResult
    from llamaforge.build.ops_store import BuildListResult, BuildShowResult, DoctorResult, RecipeListResult


def build_cli(result: BuildResult, console: Console) -> None:
    """``build`` for a person: the plan of a dry run, or the build and its artifacts; a matrix as one table."""
    if result.matrix is not None:
        _matrix_cli(result.matrix, console)
        return
    if result.dry_run:
        plan = result.plan or {}
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
    build = result.build
    if build is None:
        raise ValueError("a build result without a plan, a build or a matrix")
    state = "[green]cache hit[/green]" if build.cached else "[green]built[/green]"
    console.print(f"{state} {build.key} in {build.seconds:.1f} s\n  {build.path}")
    table = Table("artifact", "size", "sha256")
    for name, info in sorted(build.artifacts.items()):
        table.add_row(name, f"{info['size'] / 2**20:.1f} MiB", info["sha256"][:16] + "…")
    console.print(table)
    report = result.reproducibility
    if report:
        if report.rebuilt_on and report.rebuilt_on != report.built_on:
            console.print(f"built on {report.built_on}, rebuilt on {report.rebuilt_on}", highlight=False)
        if report.note:
            console.print(f"[yellow]note:[/yellow] {report.note}", highlight=False)
        if report.reproducible:
            console.print(f"[green]reproducible[/green]: {len(report.identical)} artifacts bit-identical")
        else:
            console.print(f"[red]not reproducible[/red]: {len(report.different)} artifacts differ")
            for diff in report.different:
                sections = ", ".join(diff["sections"]) or "?"
                console.print(f"  {diff['path']}: sections {sections} differ: {diff['explanation']}")
                if diff["kept"]:
                    console.print(f"    rebuilt copy kept at {diff['kept']}")


def _ca_bundle(plan: dict[str, Any]) -> str:
    bundle = plan.get("ca_bundle")
    return f"{bundle['path']} (from {bundle['from']})" if bundle else "none"


def _builder(row: MatrixRow) -> str:
    """The builder column of a fanned-out matrix: the builder's name, and the builders lost on the way."""
    name = row.builder.split(" ", 1)[0] if row.builder else "-"
    return name + (f" (lost: {', '.join(row.lost_builders)})" if row.lost_builders else "")


def _matrix_cli(rows: list[MatrixRow], console: Console) -> None:
    fanned = any(row.builder or row.lost_builders for row in rows)
    table = Table(
        "build", "key", "platform", "backend", "archs", *(["builder"] if fanned else []), "time", "result"
    )
    for row in rows:
        state = {"failed": "[red]failed[/red]", "not run": "[yellow]not run[/yellow]"}.get(row.result, "")
        table.add_row(
            row.name,
            row.key or "-",
            row.platform or "-",
            row.backend or "-",
            ",".join(row.archs) or "-",
            *([_builder(row)] if fanned else []),
            f"{row.seconds:.1f} s",
            state or f"[green]{row.result}[/green]",
        )
    console.print(table)
    for row in rows:
        if row.error:
            console.print(f"[red]{row.name}[/red]: {row.error}", highlight=False)
            if row.hint:
                console.print(f"  hint: {row.hint}", highlight=False)


def builds_list_cli(result: BuildListResult, console: Console) -> None:
    """``builds.list`` as a table."""
    table = Table("key", "recipe", "backend", "archs", "patches", "executor", "finished")
    for item in result.builds:
        table.add_row(
            item.key,
            item.recipe,
            item.backend,
            ",".join(item.cuda_architectures) or "-",
            ",".join(item.patches) or "-",
            item.executor,
            item.finished_at,
        )
    console.print(table if result.builds or result.broken else "no builds yet: `invoke build`")
    for entry in result.broken:
        console.print(
            f"[yellow]warning:[/yellow] damaged store entry {entry.path}: {entry.error}",
            highlight=False,
            soft_wrap=True,
        )


def doctor_cli(result: DoctorResult, console: Console) -> None:
    """``doctor`` as a table of checks."""
    table = Table("check", "status", "detail", "next step")
    for check in result.checks:
        table.add_row(check.name, STATUS[check.status], check.detail, check.hint)
    console.print(table)


def recipes_list_cli(result: RecipeListResult, console: Console) -> None:
    """``recipes.list`` as a table."""
    table = Table("recipe", "backend", "source", "description")
    for item in result.recipes:
        table.add_row(item.name, item.backend, item.source, item.description)
    console.print(table)


def build_html(data: BuildResult) -> str:
    """``build`` in a notebook: the plan, or the build and its artifacts; a matrix as one table."""
    if data.matrix is not None:
        table = [
            (
                row.name,
                row.key or "-",
                row.platform or "-",
                row.backend or "-",
                ",".join(row.archs) or "-",
                _builder(row),
                f"{row.seconds:.1f} s",
                row.result,
                row.error or "",
            )
            for row in data.matrix
        ]
        headers = ["build", "key", "platform", "backend", "archs", "builder", "time", "result", "error"]
        return html.section("build matrix", html.table(headers, table))
    if data.dry_run:
        plan = data.plan or {}
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
    build = data.build
    if build is None:
        raise ValueError("a build result without a plan, a build or a matrix")
    state = html.badge("ok") if build.cached else html.badge("succeeded")
    rows = [
        ("result", html.Raw(f"{state} {'cache hit' if build.cached else 'built'}")),
        ("key", build.key),
        ("path", build.path),
        ("seconds", f"{build.seconds:.1f}"),
    ]
    artifacts = html.table(
        ["artifact", "size", "sha256"],
        [
            (
                name,
                html.mib(info.get("size")),
                _short_sha256(info.get("sha256", "")),
            )
            for name, info in sorted(build.artifacts.items())
        ],
    )
    body = html.kv_table(rows) + artifacts
    report = data.reproducibility
    if report:
        verdict = html.badge("ok" if report.reproducible else "fail")
        body += f"<p>reproducible: {verdict}</p>" + html.table(
            ["artifact", "differs in", "explanation"],
            [
                (d.get("path"), ", ".join(d.get("sections") or []), d.get("explanation"))
                for d in report.different
            ],
        )
    return html.section("build", body)


def builds_list_html(data: BuildListResult) -> str:
    """``builds.list`` in a notebook."""
    builds = data.builds
    broken = "".join(
        f"<p>damaged store entry {html.escape(entry.path)}: {html.escape(entry.error)}</p>"
        for entry in data.broken
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
                    b.key,
                    b.recipe,
                    b.backend,
                    ",".join(b.cuda_architectures) or "-",
                    ",".join(b.patches) or "-",
                    b.executor,
                    b.finished_at,
                )
                for b in builds
            ],
        ),
    )


def builds_show_html(data: BuildShowResult) -> str:
    """``builds.show`` in a notebook: the manifest's main facts."""
    manifest = data.manifest
    recipe = manifest.get("recipe") or {}
    rows = [
        ("key", manifest.get("key")),
        ("path", data.path),
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


def doctor_html(data: DoctorResult) -> str:
    """``doctor`` in a notebook."""
    verdict = html.badge("ok" if data.ok else "fail")
    table = html.table(
        ["check", "status", "detail", "next step"],
        [(c.name, html.badge(c.status), c.detail, c.hint) for c in data.checks],
    )
    return html.section("doctor", f"<p>this machine can build: {verdict}</p>{table}")


def recipes_list_html(data: RecipeListResult) -> str:
    """``recipes.list`` in a notebook."""
    return html.section(
        "build recipes",
        html.table(
            ["recipe", "backend", "source", "description"],
            [(r.name, r.backend, r.source, r.description) for r in data.recipes],
        ),
    )


def _short_sha256(digest: str) -> html.Raw:
    text = html.escape(digest)
    return html.Raw(f"<code title='{text}'>{text[:16]}…</code>")
