"""The fit chart, drawn once: GPU and host-RAM memory per plan, stacked by category, against the VRAM line.

It draws from the JSON form of a plan (:meth:`llamaforge.serve.fit.FitPlan.to_json`), so ``models.fit --plot``,
the notebook view of a fit result and the accuracy benchmark show the same picture. It uses matplotlib's
object-oriented ``Figure`` (no pyplot): no global state, no backend switch in a user's kernel.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from llamaforge.core.errors import InvalidOption
from llamaforge.core.paths import unwritable_reason

__all__ = ["CATEGORIES", "PLOT_FORMATS", "fit_chart_png", "plot_path", "save_fit_chart"]

GiB: Final = 1 << 30

#: Memory categories of a plan, in stacking order: label and colour.
CATEGORIES: Final[dict[str, tuple[str, str]]] = {
    "weights": ("weights", "#4c72b0"),
    "kv_cache": ("KV cache", "#dd8452"),
    "recurrent_state": ("recurrent state", "#55a868"),
    "compute": ("compute buffer", "#c44e52"),
    "output": ("output (logits)", "#8172b3"),
}

Plan = Mapping[str, Any]


def _gib(memory: Mapping[str, Any], category: str) -> float:
    return float(memory.get(category) or 0) / GiB


def _draw(figure: Any, plans: Sequence[Plan], title: str | None) -> None:
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    axes = figure.subplots()
    labels: list[str] = []
    positions: list[float] = []
    drawn: set[str] = set()
    tallest = 0.0
    for index, plan in enumerate(plans):
        for offset, device, key in ((-0.2, "GPU", "gpu_memory"), (0.2, "host", "host_memory")):
            memory = plan.get(key) or {}
            x = index + offset
            bottom = 0.0
            for category, (_label, colour) in CATEGORIES.items():
                value = _gib(memory, category)
                if value <= 0:
                    continue
                drawn.add(category)
                axes.bar(
                    x,
                    value,
                    0.36,
                    bottom=bottom,
                    color=colour,
                    hatch="//" if device == "host" else None,
                    edgecolor="white",
                )
                bottom += value
            axes.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=8)
            tallest = max(tallest, bottom)
            positions.append(x)
            labels.append(device)
        settings = plan.get("settings") or {}
        placement = f"-ngl {plan.get('n_gpu_layers')}" + (
            f" --n-cpu-moe {plan['n_cpu_moe']}" if plan.get("n_cpu_moe") else ""
        )
        axes.text(
            index,
            -0.13,
            f"ctx {int(settings.get('ctx') or 0):,} x{settings.get('parallel', 1)}  "
            f"{settings.get('cache_type_k', 'f16')}/{settings.get('cache_type_v', 'f16')}\n{placement}",
            ha="center",
            va="top",
            transform=axes.get_xaxis_transform(),
            fontsize=8,
        )
    handles: list[Artist] = [
        Patch(color=CATEGORIES[c][1], label=CATEGORIES[c][0]) for c in CATEGORIES if c in drawn
    ]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label="host RAM"))
    vram = float(plans[0].get("vram_bytes") or 0) / GiB
    if vram:
        usable = vram - float(plans[0].get("margin_bytes") or 0) / GiB
        axes.axhline(vram, color="black", linewidth=1.2)
        axes.axhline(usable, color="black", linestyle="--", linewidth=0.8)
        handles.append(Line2D([], [], color="black", linewidth=1.2, label=f"VRAM {vram:.0f} GiB"))
        handles.append(
            Line2D(
                [], [], color="black", linestyle="--", linewidth=0.8, label=f"VRAM - margin {usable:.1f} GiB"
            )
        )
    axes.set_xticks(positions, labels, fontsize=8)
    axes.set_ylabel("GiB")
    model = Path(str(plans[0].get("model", "model"))).name
    axes.set_title(title or f"{model} on {plans[0].get('gpu') or 'GPU'}", fontsize=10)
    axes.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.set_ylim(0, max(vram, tallest) * 1.08 or 1.0)
    figure.subplots_adjust(bottom=0.2, left=0.07, right=0.76)


def _figure(plans: Sequence[Plan], title: str | None) -> Any:
    from matplotlib.figure import Figure

    if not plans:
        raise InvalidOption("nothing to plot")
    figure = Figure(figsize=(max(6.0, 2.4 * len(plans) + 4.0), 5.0))
    _draw(figure, plans, title)
    return figure


#: What ``--plot`` writes, by file suffix (matplotlib's own writers, no extra backend).
PLOT_FORMATS: Final[dict[str, str]] = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def _render(plans: Sequence[Plan], title: str | None, fmt: str, dpi: int) -> bytes:
    buffer = io.BytesIO()
    # "tight" grows the canvas to what is drawn: the legend beside the axes and the y label stay whole.
    _figure(plans, title).savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight", pad_inches=0.15)
    return buffer.getvalue()


def fit_chart_png(plans: Sequence[Plan], *, title: str | None = None, dpi: int = 100) -> bytes:
    """The chart of ``plans`` (fit plans in their JSON form) as PNG bytes."""
    return _render(plans, title, "png", dpi)


def plot_path(text: str) -> Path:
    """The file ``--plot TEXT`` names, checked before anything is planned: not a directory, and a suffix the
    chart can be written as (.png, .svg, .pdf)."""
    path = Path(text)
    if text.endswith(("/", "\\")) or path.is_dir():
        raise InvalidOption(
            f"--plot {text} is a directory", hint=f"give a file name, e.g. --plot {path / 'fit.png'}"
        )
    if path.suffix.lower() not in PLOT_FORMATS:
        raise InvalidOption(
            f"--plot {text}: the chart is written as PNG, SVG or PDF, not {path.suffix or 'a name without a suffix'}",
            hint="end the name in " + ", ".join(PLOT_FORMATS) + f", e.g. --plot {path.with_suffix('.png')}",
        )
    return path


def save_fit_chart(plans: Sequence[Plan], path: Path, *, title: str | None = None) -> Path:
    """Write the chart of ``plans`` (fit plans in their JSON form) to ``path``, as PNG, SVG or PDF by its
    suffix (InvalidOption for another suffix, a directory or a place that cannot be written); returns it."""
    path = plot_path(str(path))
    data = _render(plans, title, PLOT_FORMATS[path.suffix.lower()], 120)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = path.open("wb")
    except OSError as error:
        raise _unwritable(path, error) from None
    try:
        with out:
            out.write(data)
    except OSError as error:
        path.unlink(missing_ok=True)  # no half-written chart
        raise _unwritable(path, error) from None
    return path


def _unwritable(path: Path, error: OSError) -> InvalidOption:
    return InvalidOption(
        f"--plot {path}: cannot write the chart there: {unwritable_reason(path, error)}",
        hint="give a --plot in a directory you can write, e.g. --plot fit.png",
    )
