"""Progress events and cancellation, shared by every operation and rendered by every front.

Operations never print: they call ``report(Event)``. The CLI renders events with rich, the MCP server turns
them into progress notifications and job logs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from llamaforge.core.errors import Cancelled

EventKind = Literal["stage", "progress", "log", "info", "warning"]


@dataclass(frozen=True)
class Event:
    """One thing an operation wants its front to know."""

    kind: EventKind
    message: str
    stage: str = ""
    completed: float | None = None
    total: float | None = None
    unit: str | None = None  # what ``completed`` and ``total`` count: "bytes", or None for steps


Reporter = Callable[[Event], None]


def null_reporter(event: Event) -> None:
    """Drop every event (library use without a front)."""


@dataclass
class CancelToken:
    """Cooperative cancellation: operations poll ``raise_if_cancelled`` and register cleanups."""

    _event: threading.Event = field(default_factory=threading.Event)
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cancelled(self) -> bool:
        """True once ``cancel`` was called."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Request cancellation and run the registered callbacks (e.g. kill a container)."""
        with self._lock:
            self._event.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register ``callback``; returns a function that unregisters it."""
        with self._lock:
            self._callbacks.append(callback)
            already = self._event.is_set()
        if already:
            callback()

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` if cancellation was requested."""
        if self._event.is_set():
            raise Cancelled("operation cancelled; nothing was published")
