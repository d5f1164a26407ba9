"""How ``models.fit`` results look: its summary lines for the CLI; for notebooks, the placement, the memory
table and the one memory-breakdown chart (:mod:`llamaforge.serve.fit_chart`) (registered with the operation in
:mod:`llamaforge.serve.ops_fit`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from llamaforge.core.views import html
from llamaforge.serve.fit import GiB
from llamaforge.serve.fit_chart import CATEGORIES, fit_chart_png


def models_fit_cli(result: dict[str, Any], console: Console) -> None:
    """``models.fit``: its summary lines."""
    summary = result.get("summary")
    lines = summary if isinstance(summary, list) else [str(summary)] if summary else []
    for line in lines:
        console.print(line, highlight=False)
    if not lines:
        console.print_json(json.dumps(result, default=str))


def models_fit_html(data: dict[str, Any]) -> str:
    """``models.fit`` in a notebook: placement, memory table, chart."""
    body = ""
    if data.get("summary"):
        body += "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in data["summary"]) + "</ul>"
    gpu, host = data.get("gpu_memory") or {}, data.get("host_memory") or {}
    body += html.table(
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
        ("command", html.Raw(f"<code>{html.escape(data.get('command', ''))}</code>")),
    ]
    if data.get("tg_ceiling_tps") is not None:
        placement.append(("token generation ceiling", f"~{data['tg_ceiling_tps']:.0f} tok/s"))
    body += html.kv_table(placement)
    chart = html.png_file(data.get("plot"), "memory breakdown")
    if not chart:
        drawable = all(isinstance(data.get(key), Mapping) for key in ("gpu_memory", "host_memory"))
        chart = html.img_png(fit_chart_png([data]), "memory breakdown") if drawable else ""
    return html.section("fit plan", body + chart)
