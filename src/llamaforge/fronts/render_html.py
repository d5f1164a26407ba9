"""HTML renderings of operation results for notebooks: tables, badges and inline PNG charts.

The notebook twin of :mod:`llamaforge.fronts.render_cli`: one renderer per operation that has a shape worth showing, a
generic table/JSON view for the rest. Charts are drawn on object-oriented matplotlib figures (no pyplot state).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llamaforge.serve.fit_chart import CATEGORIES, fit_chart_png

GiB = float(1 << 30)
MiB = float(1 << 20)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


class _Raw(str):
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


def badge(status: Any) -> _Raw:
    colour = _STATUS_COLOURS.get(str(status), "#555")
    return _Raw(f'<span style="color:{colour};font-weight:bold">{_e(status)}</span>')


def _cell(value: Any) -> str:
    return value if isinstance(value, _Raw) else _e("-" if value is None or value == "" else value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th style='text-align:left'>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'>{_cell(v)}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th style='text-align:left'>{_e(k)}</th><td style='text-align:left'>{_cell(v)}</td></tr>"
        for k, v in rows
    )
    return f"<table><tbody>{body}</tbody></table>"


def section(title: str, body: str) -> str:
    return f'<div class="llamaforge"><h4 style="margin:4px 0">{_e(title)}</h4>{body}</div>'


def _details(summary: str, body: str, *, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{_e(summary)}</summary>{body}</details>"


def _pre(text: str) -> str:
    return f"<pre style='max-height:30em;overflow:auto'>{_e(text)}</pre>"


def _json(data: Any) -> str:
    return _pre(json.dumps(data, indent=2, sort_keys=True, default=str))


def _img_png(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'


def _png_file(path: Any, alt: str) -> str:
    """An existing PNG file inline ('' when it is not there)."""
    file = Path(str(path)) if path else None
    if file is None or file.suffix != ".png" or not file.is_file():
        return ""
    return _img_png(file.read_bytes(), alt)


def _figure_png(draw: Callable[[Any], None], size: tuple[float, float]) -> bytes:
    # An object-oriented Figure, not pyplot: no global state, no backend switch in the user's kernel.
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, layout="constrained")
    draw(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _mib(value: Any) -> str:
    return f"{float(value) / MiB:.1f} MiB" if isinstance(value, int | float) else "-"


def _build_html(data: dict[str, Any]) -> str:
    if data.get("dry_run"):
        plan = data["plan"]
        source = plan.get("source") or {}
        rows = [
            ("recipe", plan.get("recipe")),
            ("backend", plan.get("backend")),
            ("CUDA archs", ",".join(plan.get("cuda_architectures") or []) or "-"),
            ("base image", (plan.get("base_image") or {}).get("tag")),
            ("builder image", plan.get("builder_tag")),
            ("source", " ".join(f"{k}={v}" for k, v in source.items() if k in ("kind", "version", "commit"))),
            ("patches", ", ".join(p["name"] for p in plan.get("patches") or []) or "none"),
            ("targets", ", ".join(plan.get("targets") or [])),
            ("plan digest", plan.get("plan_digest")),
            ("cache key", f"{plan.get('cache_key') or '-'} ({plan.get('cache_key_note', '')})"),
            ("cmake", _Raw("<code>" + _e(" ".join(plan.get("cmake_args") or [])) + "</code>")),
        ]
        files = "".join(
            _details(name, _pre(text)) for name, text in sorted((plan.get("files") or {}).items())
        )
        return section("build plan (dry run)", kv_table(rows) + files)
    build = data["build"]
    state = badge("ok") if build.get("cached") else badge("succeeded")
    rows = [
        ("result", _Raw(f"{state} {'cache hit' if build.get('cached') else 'built'}")),
        ("key", build.get("key")),
        ("path", build.get("path")),
        ("seconds", f"{build.get('seconds', 0):.1f}"),
    ]
    artifacts = _table(
        ["artifact", "size", "sha256"],
        [
            (
                name,
                _mib(info.get("size")),
                _Raw(f"<code title='{_e(info.get('sha256'))}'>{_e(info.get('sha256', ''))[:16]}…</code>"),
            )
            for name, info in sorted((build.get("artifacts") or {}).items())
        ],
    )
    body = kv_table(rows) + artifacts
    report = data.get("reproducibility")
    if report:
        verdict = badge("ok" if report.get("reproducible") else "fail")
        body += f"<p>reproducible: {verdict}</p>" + _table(
            ["artifact", "differs in", "explanation"],
            [
                (d.get("path"), ", ".join(d.get("sections") or []), d.get("explanation"))
                for d in report.get("different", [])
            ],
        )
    return section("build", body)


def _builds_list_html(data: dict[str, Any]) -> str:
    builds = data.get("builds") or []
    if not builds:
        return section("builds", "<p>no builds yet: <code>%llamaforge build</code></p>")
    return section(
        "builds",
        _table(
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


def _builds_show_html(data: dict[str, Any]) -> str:
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
        _table(
            ["artifact", "size", "sha256"],
            [(name, _mib(info.get("size")), info.get("sha256")) for name, info in sorted(artifacts.items())],
        )
        if isinstance(artifacts, dict) and artifacts
        else ""
    )
    return section("build manifest", kv_table(rows) + table + _details("manifest.json", _json(manifest)))


def _doctor_html(data: dict[str, Any]) -> str:
    verdict = badge("ok" if data.get("ok") else "fail")
    table = _table(
        ["check", "status", "detail", "next step"],
        [(c["name"], badge(c["status"]), c.get("detail"), c.get("hint")) for c in data.get("checks", [])],
    )
    return section("doctor", f"<p>this machine can build: {verdict}</p>{table}")


def _recipes_list_html(data: dict[str, Any]) -> str:
    return section(
        "build recipes",
        _table(
            ["recipe", "backend", "source", "description"],
            [
                (r["name"], r.get("backend"), r.get("source"), r.get("description"))
                for r in data.get("recipes", [])
            ],
        ),
    )


def _model_rows(model: dict[str, Any]) -> list[tuple[str, Any]]:
    layers = model.get("layers") or {}
    tokenizer = model.get("tokenizer") or {}
    template = model.get("chat_template") or {}
    histogram = model.get("quant_histogram") or {}
    return [
        ("architecture", f"{model.get('architecture')} ({model.get('name') or '-'})"),
        (
            "parameters",
            f"{model.get('parameters_human', '-')} ({model.get('bits_per_weight', '-')} bits/weight)",
        ),
        (
            "layers",
            f"{layers.get('block_count', '-')}: {layers.get('attention', '-')} attention, "
            f"{layers.get('recurrent', '-')} recurrent, {layers.get('mtp', '-')} MTP",
        ),
        ("context", model.get("context_length")),
        ("file type", f"{model.get('file_type') or '-'} (most tensors {model.get('dominant_type') or '-'})"),
        (
            "quant mix",
            ", ".join(
                f"{name} {entry.get('count')}x {_mib(entry.get('bytes'))}"
                for name, entry in histogram.items()
            ),
        ),
        ("size", _mib(model.get("file_size"))),
        (
            "tokenizer",
            f"{tokenizer.get('model') or '-'} / {tokenizer.get('pre') or '-'}, "
            f"{tokenizer.get('vocab_size', '-')} tokens",
        ),
        ("chat template", f"{template.get('bytes')} bytes" if template.get("present") else "none"),
    ]


def _models_inspect_html(data: dict[str, Any]) -> str:
    remote = " (header only, over HTTP range requests)" if data.get("remote") else ""
    return section(f"model {data.get('source', '')}{remote}", kv_table(_model_rows(data.get("model") or {})))


def _models_verify_html(data: dict[str, Any]) -> str:
    checks = data.get("checks") or {}
    rows = [
        ("verdict", badge("ok" if data.get("ok") else "fail")),
        ("path", data.get("path")),
        ("size", data.get("size")),
        ("sha256", data.get("sha256")),
        ("cached verdict", data.get("cached")),
        ("checks", _Raw(" ".join(f"{_e(name)} {badge(state)}" for name, state in checks.items()))),
    ]
    findings = [f for f in data.get("findings") or [] if f.get("status") != "ok"]
    body = kv_table(rows)
    if findings:
        body += _table(
            ["status", "check", "message"],
            [(badge(f["status"]), f.get("check"), f.get("message")) for f in findings],
        )
    if data.get("model"):
        body += kv_table(_model_rows(data["model"]))
    load = data.get("load_check")
    if load:
        body += _table(
            ["buffer", "device", "MiB"],
            [
                (kind, name, f"{mib:.2f}")
                for kind, per in (load.get("buffers_mib") or {}).items()
                for name, mib in per.items()
            ],
        )
    return section("model verification", body)


def _models_fetch_html(data: dict[str, Any]) -> str:
    rows = [
        ("result", "cached" if data.get("cached") else "downloaded"),
        ("source", data.get("source")),
        ("commit", data.get("commit")),
        ("path", data.get("path")),
        ("size", data.get("size")),
        ("sha256", data.get("sha256")),
    ]
    return section("model fetch", kv_table(rows))


def _fit_chart(data: Mapping[str, Any]) -> bytes | None:
    if not all(isinstance(data.get(key), Mapping) for key in ("gpu_memory", "host_memory")):
        return None
    return fit_chart_png([data])


def _models_fit_html(data: dict[str, Any]) -> str:
    body = ""
    if data.get("summary"):
        body += "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in data["summary"]) + "</ul>"
    gpu, host = data.get("gpu_memory") or {}, data.get("host_memory") or {}
    body += _table(
        ["memory (GiB)", "GPU", "host RAM"],
        [
            (name, f"{float(gpu.get(c) or 0) / GiB:.3f}", f"{float(host.get(c) or 0) / GiB:.3f}")
            for c, (name, _colour) in [*CATEGORIES.items(), ("total", ("total", ""))]
        ],
    )
    placement = [
        ("-ngl", f"{data.get('n_gpu_layers')} of {data.get('max_gpu_layers')}"),
        ("--n-cpu-moe", data.get("n_cpu_moe")),
        ("VRAM", f"{float(data.get('vram_bytes') or 0) / GiB:.1f} GiB"),
        ("command", _Raw(f"<code>{_e(data.get('command', ''))}</code>")),
    ]
    if data.get("tg_ceiling_tps") is not None:
        placement.append(("token generation ceiling", f"~{data['tg_ceiling_tps']:.0f} tok/s"))
    body += kv_table(placement)
    chart = _png_file(data.get("plot"), "memory breakdown")
    if not chart:
        png = _fit_chart(data)
        chart = _img_png(png, "memory breakdown") if png else ""
    return section("fit plan", body + chart)


def _p50_p95(dist: Any, digits: int = 1) -> str:
    return f"{dist['p50']:.{digits}f} / {dist['p95']:.{digits}f}" if isinstance(dist, Mapping) else "-"


def _smoke_chart_png(data: Mapping[str, Any]) -> bytes | None:
    tests = (data.get("bench") or {}).get("tests") or []
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

    return _figure_png(draw, (5.0, 3.0))


def _smoke_html(data: dict[str, Any]) -> str:
    verdict = data.get("verdict") or {}
    build, model = data.get("build") or {}, data.get("model") or {}
    body = (
        f"<p>{badge('pass' if verdict.get('passed') else 'fail')} run <code>{_e(data.get('run_id'))}</code> "
        f"({float(data.get('wall_s') or 0):.1f} s): build {_e(build.get('key'))}, model {_e(model.get('label'))}</p>"
    )
    bench = data.get("bench") or {}
    if bench.get("tests"):
        body += _table(
            ["llama-bench", "t/s", "stddev"],
            [(t["name"], f"{t['avg_ts']:.1f}", f"{t.get('stddev_ts', 0):.1f}") for t in bench["tests"]],
        )
    levels = (data.get("server") or {}).get("levels") or []
    if levels:
        body += _table(
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
    roof = data.get("roofline") or {}
    if roof.get("efficiency") is not None:
        body += (
            f"<p>roofline (estimated): {roof['efficiency'] * 100:.1f} % of {roof.get('roof_tps', 0):.0f} t/s "
            f"({_e(roof.get('bandwidth_source', ''))})</p>"
        )
    body += _table(
        ["check", "status", "value", "threshold", "source"],
        [
            (
                c.get("name"),
                badge(c.get("status")),
                f"{c['value']:.1f}" if isinstance(c.get("value"), float) else c.get("value"),
                c.get("threshold"),
                c.get("source"),
            )
            for c in verdict.get("checks") or []
        ],
    )
    files = data.get("files") or {}
    plots = "".join(_png_file(files.get(name), name) for name in ("throughput.png", "latency.png"))
    if not plots:
        png = _smoke_chart_png(data)
        plots = _img_png(png, "llama-bench") if png else ""
    return section("smoke report", body + plots)


def _smoke_compare_html(data: dict[str, Any]) -> str:
    a, b = data.get("a") or {}, data.get("b") or {}
    body = kv_table(
        [("A", a.get("run_id")), ("B", b.get("run_id"))]
        + [(k, f"{a.get(k)} → {b.get(k)}") for k in data.get("differs") or []]
    )

    def number(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, int | float) else "-"

    body += _table(
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
            for r in data.get("rows") or []
        ],
    )
    return section(
        "smoke comparison", body + _png_file((data.get("files") or {}).get("compare.png"), "comparison")
    )


def _generic_html(operation: str, data: dict[str, Any]) -> str:
    """Scalars as a key/value table, lists of flat records as tables, everything else as JSON."""
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict | list)]
    body = kv_table(scalars) if scalars else ""
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            headers = list(dict.fromkeys(k for item in value for k in item))
            if all(not isinstance(item.get(h), dict | list) for item in value for h in headers):
                body += f"<p><b>{_e(key)}</b></p>" + _table(
                    headers, [[item.get(h) for h in headers] for item in value]
                )
                continue
        if isinstance(value, dict | list):
            body += _details(key, _json(value), open_=len(data) == 1)
    return section(operation, body or _json(data))


_HTML: dict[str, Callable[[dict[str, Any]], str]] = {
    "build": _build_html,
    "builds.list": _builds_list_html,
    "builds.show": _builds_show_html,
    "doctor": _doctor_html,
    "models.fetch": _models_fetch_html,
    "models.fit": _models_fit_html,
    "models.inspect": _models_inspect_html,
    "models.verify": _models_verify_html,
    "recipes.list": _recipes_list_html,
    "smoke": _smoke_html,
    "smoke.compare": _smoke_compare_html,
}


def render_html(operation: str, data: dict[str, Any], *, seconds: float | None = None) -> str:
    """``data`` (the result of ``operation``) as HTML; a generic table/JSON view when there is no special one."""
    renderer = _HTML.get(operation)
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
