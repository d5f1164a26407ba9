"""How smoke results look: rich tables for the CLI, HTML with the run's plots for notebooks (registered with each
operation in :mod:`llamaforge.smoke.ops` and :mod:`llamaforge.smoke.ops_cpu_modules`). Each takes the operation's
typed result, so a renamed field is a type error here, not a view that silently shows less."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamaforge.core.views import html
from llamaforge.core.views.console import STATUS

if TYPE_CHECKING:  # showing one operation's result imports no other operation's module
    from llamaforge.smoke.ops import SmokeCompareResult, SmokeResult
    from llamaforge.smoke.ops_cpu_modules import CpuModulesResult, CpuModuleSweep


def smoke_cli(result: SmokeResult, console: Console) -> None:
    """``smoke``: the verdict, llama-bench and llama-server tables, the checks."""
    verdict = result.verdict
    state = "[green]PASS[/green]" if verdict.passed else "[red]FAIL[/red]"
    console.print(
        f"{state} smoke run {result.run_id} ({result.wall_s:.1f} s): build {result.build['key']}, "
        f"model {result.model['label']}"
    )
    if result.bench:
        table = Table("llama-bench", "t/s", "stddev", title=f"build {result.bench['build_commit']}")
        for test in result.bench["tests"]:
            table.add_row(test["name"], f"{test['avg_ts']:.1f}", f"{test['stddev_ts']:.1f}")
        console.print(table)
    if result.cpu_modules:
        _print_cpu_modules(result.cpu_modules, console)
    if result.server:
        table = Table(
            "c",
            "requests",
            "TTFT p50/p95 ms",
            "ITL p50/p95 ms",
            "decode t/s",
            "aggregate t/s",
            "e2e p50 ms",
            "client/server",
            title="llama-server streaming",
        )
        for level in result.server["levels"]:
            ratio = level["cross_check"]["client_over_server_decode"]
            table.add_row(
                str(level["concurrency"]),
                f"{level['requests']} ({len(level['errors'])} failed)",
                _p50_p95(level["ttft_ms"]),
                _p50_p95(level["itl_ms"], 2),
                f"{level['decode_tps']['p50']:.1f}" if level["decode_tps"] else "-",
                f"{level['aggregate_tps']:.1f}" if level["aggregate_tps"] else "-",
                f"{level['e2e_ms']['p50']:.0f}" if level["e2e_ms"] else "-",
                f"{ratio['p50']:.3f}" if ratio else "-",
            )
        console.print(table)
    roof = result.roofline or {}
    if roof.get("efficiency") is not None:
        console.print(
            f"roofline (estimated): {roof['efficiency'] * 100:.1f} % of {roof['roof_tps']:.0f} t/s "
            f"({roof['bandwidth_gbs']:.1f} GB/s {roof['bandwidth_source']}; "
            f"{roof['bytes_per_token'] / 2**20:.1f} MiB/token)",
            highlight=False,
        )
    elif roof.get("error"):
        console.print(f"roofline: not computed ({roof['error']})", highlight=False)
    if roof.get("cpu_diagnosis"):
        warned = (result.cpu_features or {}).get("warning")
        console.print(
            f"[yellow]{roof['cpu_diagnosis']}[/yellow]" if warned else roof["cpu_diagnosis"], highlight=False
        )
    table = Table("check", "status", "value", "threshold", "source")
    for check in verdict.checks:
        status = {"pass": "ok", "fail": "fail", "skipped": "warn"}[check.status]
        raw = check.value
        value = f"{raw:.1f}" if isinstance(raw, float) else " ".join(str(raw).split())
        table.add_row(
            check.name,
            STATUS[status].replace(status, check.status),
            value[:40],
            str(check.threshold)[:40],
            check.source,
        )
    console.print(table)
    console.print(f"summary: {result.files['summary.md']}", highlight=False)


_OUTCOME_STYLE = {"ran": "green", "not_for_this_cpu": "dim"}  # the others (a crash, a failure) in red


def _tps(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _print_cpu_modules(sweep: CpuModuleSweep, console: Console) -> None:
    if not sweep.modules:
        console.print(f"CPU modules: {sweep.note or sweep.summary}", highlight=False)
        return
    cpu = sweep.cpu.model if sweep.cpu else "?"
    # the variant names the module (libggml-cpu-<variant>.so) and keeps the table narrow enough for a terminal
    table = Table(
        "CPU module",
        "pick",
        "result",
        "pp t/s",
        "tg t/s",
        title=f"CPU modules on {cpu}: {sweep.summary}",
        caption="a few tokens each, once: whether a module runs here, not a benchmark",
    )
    for row in sweep.modules:
        style = _OUTCOME_STYLE.get(row.status, "red")
        label = f"[{style}]{escape(row.outcome)}[/{style}]"
        table.add_row(
            row.variant or row.module,
            "default" if row.default else "",
            label,
            _tps(row.pp_tps),
            _tps(row.tg_tps),
        )
    console.print(table)  # what went wrong, in full, follows as the problems
    default = sweep.default
    if default is None or default.signal or not default.module:
        detail = default.detail if default is not None else "-"
        console.print(f"[red]loader's default pick: {escape(detail)}[/red]", highlight=False)
    for problem in sweep.problems:
        console.print(f"[red]{escape(problem)}[/red]", highlight=False)


def cpu_modules_cli(result: CpuModulesResult, console: Console) -> None:
    """``smoke.cpu_modules``: one row per module, the loader's pick, what failed."""
    state = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
    console.print(
        f"{state} build {result.build_key[:12]}, model {result.model_label} ({result.wall_s:.1f} s)",
        highlight=False,
    )
    _print_cpu_modules(result, console)
    if result.files:
        console.print(f"summary: {result.files['summary.md']}", highlight=False)


_BADGE = {"ran": "pass", "not_for_this_cpu": "skipped"}


def _cpu_modules_table(sweep: CpuModuleSweep) -> str:
    if not sweep.modules:
        return f"<p>CPU modules: {html.escape(sweep.note or sweep.summary)}</p>"
    cpu = sweep.cpu.model if sweep.cpu else "?"
    body = f"<p>CPU modules on {html.escape(cpu)}: {html.escape(sweep.summary)}</p>"
    body += html.table(
        ["module", "pick", "result", "pp t/s", "tg t/s", "detail"],
        [
            (
                row.module,
                "default" if row.default else "",
                html.badge(_BADGE.get(row.status, "fail")),
                _tps(row.pp_tps),
                _tps(row.tg_tps),
                row.outcome if row.status in ("ran", "not_for_this_cpu") else f"{row.outcome}: {row.detail}",
            )
            for row in sweep.modules
        ],
    )
    return body + "".join(f"<p>{html.escape(problem)}</p>" for problem in sweep.problems)


def cpu_modules_html(data: CpuModulesResult) -> str:
    """``smoke.cpu_modules`` in a notebook."""
    state = html.badge("pass" if data.passed else "fail")
    build, model = html.escape(data.build_key[:12]), html.escape(data.model_label)
    head = f"<p>{state} build {build}, model {model}</p>"
    return html.section("CPU modules", head + _cpu_modules_table(data))


def smoke_compare_cli(result: SmokeCompareResult, console: Console) -> None:
    """``smoke.compare``: what differs, then the metrics."""
    console.print(f"A = {result.a['run_id']}\nB = {result.b['run_id']}", highlight=False)
    for key in result.differs:
        console.print(f"  {key}: {result.a[key]} -> {result.b[key]}", highlight=False)
    table = Table("metric", "A", "B", "B/A", "speedup", "better")
    for row in result.rows:
        color = {"B": "green", "A": "red"}.get(row["better"], "white")
        table.add_row(
            f"{row['metric']} ({row['unit']})" if row["unit"] else row["metric"],
            f"{row['a']:.4g}",
            f"{row['b']:.4g}",
            f"{row['ratio']:.3f}" if row["ratio"] is not None else "-",
            f"[{color}]{row['speedup']:.3f}[/{color}]" if row["speedup"] is not None else "-",
            row["better"],
        )
    console.print(table)
    console.print(f"files: {result.files['compare.md']}", highlight=False)


def _p50_p95(dist: Any, digits: int = 1) -> str:
    return f"{dist['p50']:.{digits}f} / {dist['p95']:.{digits}f}" if isinstance(dist, Mapping) else "-"


def _smoke_chart_png(data: SmokeResult) -> bytes | None:
    tests = (data.bench or {}).get("tests") or []
    if not tests:
        return None

    def draw(figure: Any) -> None:
        axes = figure.subplots()
        names = [test["name"] for test in tests]
        axes.bar(
            names,
            [test["avg_ts"] for test in tests],
            yerr=[test.get("stddev_ts", 0) for test in tests],
            color="#4c72b0",
        )
        axes.set_ylabel("tokens/s")
        axes.set_title("llama-bench", fontsize=10)

    return html.figure_png(draw, (5.0, 3.0))


def smoke_html(data: SmokeResult) -> str:
    """``smoke`` in a notebook, with the run's plots."""
    verdict, build, model = data.verdict, data.build, data.model
    state = html.badge("pass" if verdict.passed else "fail")
    body = (
        f"<p>{state} run <code>{html.escape(data.run_id)}</code> ({data.wall_s:.1f} s): "
        f"build {html.escape(build.get('key'))}, model {html.escape(model.get('label'))}</p>"
    )
    bench = data.bench or {}
    if bench.get("tests"):
        body += html.table(
            ["llama-bench", "t/s", "stddev"],
            [(t["name"], f"{t['avg_ts']:.1f}", f"{t.get('stddev_ts', 0):.1f}") for t in bench["tests"]],
        )
    if data.cpu_modules:
        body += _cpu_modules_table(data.cpu_modules)
    levels = (data.server or {}).get("levels") or []
    if levels:
        body += html.table(
            ["concurrency", "requests", "TTFT p50/p95 ms", "ITL p50/p95 ms", "decode t/s", "aggregate t/s"],
            [
                (
                    lv.get("concurrency"),
                    f"{lv.get('requests')} ({len(lv.get('errors') or [])} failed)",
                    _p50_p95(lv.get("ttft_ms")),
                    _p50_p95(lv.get("itl_ms"), 2),
                    f"{lv['decode_tps']['p50']:.1f}" if lv.get("decode_tps") else "-",
                    f"{lv['aggregate_tps']:.1f}" if lv.get("aggregate_tps") else "-",
                )
                for lv in levels
            ],
        )
    roof = data.roofline or {}
    if roof.get("efficiency") is not None:
        body += (
            f"<p>roofline (estimated): {roof['efficiency'] * 100:.1f} % of {roof.get('roof_tps', 0):.0f} t/s "
            f"({html.escape(roof.get('bandwidth_source', ''))})</p>"
        )
    if roof.get("cpu_diagnosis"):
        body += f"<p>{html.escape(roof['cpu_diagnosis'])}</p>"
    body += html.table(
        ["check", "status", "value", "threshold", "source"],
        [
            (
                c.name,
                html.badge(c.status),
                f"{c.value:.1f}" if isinstance(c.value, float) else c.value,
                c.threshold,
                c.source,
            )
            for c in verdict.checks
        ],
    )
    files = data.files
    plots = "".join(html.png_file(files.get(name), name) for name in ("throughput.png", "latency.png"))
    if not plots:
        png = _smoke_chart_png(data)
        plots = html.img_png(png, "llama-bench") if png else ""
    return html.section("smoke report", body + plots)


def smoke_compare_html(data: SmokeCompareResult) -> str:
    """``smoke.compare`` in a notebook, with its chart."""
    a, b = data.a, data.b
    body = html.kv_table(
        [("A", a.get("run_id")), ("B", b.get("run_id"))]
        + [(k, f"{a.get(k)} → {b.get(k)}") for k in data.differs]
    )

    def number(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, int | float) else "-"

    body += html.table(
        ["metric", "A", "B", "B/A", "speedup", "better"],
        [
            (
                f"{r['metric']} ({r['unit']})" if r.get("unit") else r.get("metric"),
                number(r.get("a"), ".4g"),
                number(r.get("b"), ".4g"),
                number(r.get("ratio"), ".3f"),
                number(r.get("speedup"), ".3f"),
                r.get("better"),
            )
            for r in data.rows
        ],
    )
    return html.section("smoke comparison", body + html.png_file(data.files.get("compare.png"), "comparison"))
