"""How ``models.fit`` results look: its summary lines for the CLI; for notebooks, the placement, the memory
table and a memory-breakdown chart drawn from the numbers (registered with the operation in
:mod:`llamaforge.serve.ops_fit`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaforge.fronts import render_html as html
from llamaforge.serve.fit import GiB


def models_fit_cli(result: dict[str, Any], console: Console) -> None:
    """``models.fit``: its summary lines."""
    summary = result.get("summary")
    lines = summary if isinstance(summary, list) else [str(summary)] if summary else []
    for line in lines:
        console.print(line, highlight=False)
    if not lines:
        console.print_json(json.dumps(result, default=str))


_MEMORY = {
    "weights": ("weights", "#4c72b0"),
    "kv_cache": ("KV cache", "#dd8452"),
    "recurrent_state": ("recurrent state", "#55a868"),
    "compute": ("compute buffer", "#c44e52"),
    "output": ("output (logits)", "#8172b3"),
}


def fit_chart_png(data: Mapping[str, Any]) -> bytes | None:
    """A memory-breakdown bar chart (GPU and host RAM, stacked by category) drawn from a fit plan's numbers."""
    devices: list[tuple[str, Mapping[str, Any]]] = []
    for label, key in (("GPU", "gpu_memory"), ("host RAM", "host_memory")):
        memory = data.get(key)
        if not isinstance(memory, Mapping):
            return None
        devices.append((label, memory))

    def draw(figure: Any) -> None:
        axes = figure.subplots()
        labelled: set[str] = set()
        for row, (_label, memory) in enumerate(devices):
            left = 0.0
            for category, (name, colour) in _MEMORY.items():
                value = float(memory.get(category) or 0) / GiB
                if value <= 0:
                    continue
                axes.barh(row, value, left=left, color=colour, label=None if name in labelled else name)
                labelled.add(name)
                left += value
            axes.text(left, row, f" {left:.2f}", va="center", fontsize=8)
        vram = float(data.get("vram_bytes") or 0) / GiB
        if vram:
            axes.axvline(vram, color="black", linewidth=1.2, label=f"VRAM {vram:.1f} GiB")
            usable = vram - float(data.get("margin_bytes") or 0) / GiB
            axes.axvline(
                usable, color="black", linestyle="--", linewidth=0.8, label=f"usable {usable:.1f} GiB"
            )
        axes.set_yticks(range(len(devices)), [label for label, _memory in devices])
        axes.invert_yaxis()  # GPU on top
        axes.set_xlabel("GiB")
        axes.set_title(
            f"{Path(str(data.get('model', 'model'))).name} on {data.get('gpu') or 'GPU'}", fontsize=10
        )
        axes.legend(fontsize=8, loc="lower right")

    return html.figure_png(draw, (7.0, 2.8))


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
            for c, (name, _colour) in [*_MEMORY.items(), ("total", ("total", ""))]
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
        png = fit_chart_png(data)
        chart = html.img_png(png, "memory breakdown") if png else ""
    return html.section("fit plan", body + chart)
