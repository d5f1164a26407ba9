"""Progress displays of the Jupyter front: ipywidgets or HTML in a kernel, rich in a terminal; each shows the
stage, message, countable progress and the last log lines of a running operation's events."""

from __future__ import annotations

import html
import importlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from llamaforge.core.events import Event


class ProgressView(Protocol):
    """Where a running operation's events go."""

    def event(self, event: Event) -> None:
        """Show one event."""

    def finish(self, state: str, seconds: float) -> None:
        """Show the final state."""


@dataclass
class _ProgressState:
    """What every progress display shows: stage, message, countable progress, the last log lines."""

    operation: str
    stage: str = ""
    message: str = ""
    completed: float | None = None
    total: float | None = None
    unit: str | None = None
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    state: str = "running"
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    _shown: float = 0.0

    def apply(self, event: Event) -> bool:
        """Take ``event`` in; True when the display should refresh now (not more often than 4 times a second)."""
        if event.kind in ("stage", "progress", "info", "warning"):
            self.stage = event.stage or self.stage
            self.message = event.message if event.kind != "warning" else f"warning: {event.message}"
            if event.kind == "progress":
                self.completed, self.total, self.unit = event.completed, event.total, event.unit
            elif event.kind == "stage":
                self.completed = self.total = self.unit = None
        else:
            self.logs.append(event.message)
        now = time.monotonic()
        self.seconds = now - self.started
        if event.kind == "stage" or now - self._shown >= 0.25:
            self._shown = now
            return True
        return False

    def counted(self) -> str:
        """``12/474`` for steps, ``120.0/400.0 MiB`` for bytes; empty without a total."""
        if not self.total:
            return ""
        if self.unit == "bytes":
            return f"{(self.completed or 0) / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
        return f"{self.completed or 0:g}/{self.total:g}"

    def text(self) -> str:
        """The state as one line of plain text."""
        counted = f" [{self.counted()}]" if self.total else ""
        stage = f"{self.stage}: " if self.stage else ""
        return f"{self.operation} {self.state} {self.seconds:.1f} s{counted} {stage}{self.message}".rstrip()

    def as_html(self, *, bar: bool = True) -> str:
        """The state as a small HTML block, with a <progress> bar unless the caller draws its own."""
        counted = html.escape(self.counted())
        if bar and self.total:
            value = f'value="{self.completed or 0:g}" max="{self.total:g}"'
            counted = f'<progress {value} style="width:40%"></progress> {counted}'
        colour = {"succeeded": "#2e7d32", "failed": "#c62828", "cancelled": "#ef6c00"}.get(
            self.state, "#1565c0"
        )
        escape = html.escape
        stage = f"<b>{escape(self.stage)}</b>: " if self.stage else ""
        tail = (
            f'<pre style="margin:2px 0;color:#666;font-size:85%">{escape(chr(10).join(self.logs))}</pre>'
            if self.logs and self.state == "running"
            else ""
        )
        return (
            f'<div class="llamaforge-progress"><span style="color:{colour}">{escape(self.operation)} '
            f"{escape(self.state)}</span> {self.seconds:.1f} s {counted}<br>{stage}{escape(self.message)}{tail}</div>"
        )


@dataclass
class _HTMLSnapshot:
    """One display of the progress state (text/html and text/plain)."""

    body: str
    plain: str

    def _repr_html_(self) -> str:
        return self.body

    def __repr__(self) -> str:
        return self.plain


class HTMLProgress:
    """Progress as an HTML block that is updated in place through an IPython display handle."""

    def __init__(self, operation: str) -> None:
        self.state = _ProgressState(operation)
        self._handle: Any = None

    def _show(self) -> None:
        snapshot = _HTMLSnapshot(self.state.as_html(), self.state.text())
        if self._handle is None:
            display: Any = importlib.import_module("IPython.display").display
            self._handle = display(snapshot, display_id=True)
        else:
            self._handle.update(snapshot)

    def event(self, event: Event) -> None:
        if self.state.apply(event):
            self._show()

    def finish(self, state: str, seconds: float) -> None:
        self.state.state, self.state.seconds = state, seconds
        if self._handle is not None:  # an operation that reported nothing needs no progress display
            self._show()


class WidgetProgress:
    """Progress as ipywidgets (a bar and a label), when ipywidgets is installed."""

    def __init__(self, operation: str, widgets: Any) -> None:
        self.state = _ProgressState(operation)
        self._widgets = widgets
        self._bar: Any = None
        self._label: Any = None

    def _show(self) -> None:
        if self._bar is None:
            self._bar = self._widgets.FloatProgress(
                value=0.0, min=0.0, max=1.0, description=self.state.operation
            )
            self._label = self._widgets.HTML()
            display: Any = importlib.import_module("IPython.display").display
            display(self._widgets.VBox([self._bar, self._label]))
        if self.state.total:
            self._bar.max, self._bar.value = float(self.state.total), float(self.state.completed or 0)
        self._label.value = self.state.as_html(bar=False)

    def event(self, event: Event) -> None:
        if self.state.apply(event):
            self._show()

    def finish(self, state: str, seconds: float) -> None:
        self.state.state, self.state.seconds = state, seconds
        if self._bar is not None:
            self._show()
            self._bar.bar_style = {"succeeded": "success", "failed": "danger"}.get(state, "warning")
            if state == "succeeded":
                self._bar.value = self._bar.max


class ConsoleProgress:
    """Progress in a terminal IPython: the CLI's rich reporter on stderr."""

    def __init__(self, operation: str) -> None:
        from rich.console import Console

        from llamaforge.fronts.cli import ConsoleReporter

        self._reporter = ConsoleReporter(Console(stderr=True, soft_wrap=True), verbose=False)

    def event(self, event: Event) -> None:
        self._reporter(event)

    def finish(self, state: str, seconds: float) -> None:
        self._reporter.close()


def progress_view(operation: str) -> ProgressView:
    """The progress display that works where this runs: widgets or HTML in a kernel, rich in a terminal."""
    get_ipython: Any = importlib.import_module("IPython").get_ipython
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return ConsoleProgress(operation)
    try:
        widgets = importlib.import_module("ipywidgets")
    except ImportError:
        return HTMLProgress(operation)
    return WidgetProgress(operation, widgets)
