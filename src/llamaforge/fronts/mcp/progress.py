"""Progress notifications of a long call: one per stage event, and a heartbeat while the operation is silent.

MCP clients give up on a call that stays silent: the TypeScript SDK (what desktop clients and IDEs use) times a
request out after 60 s unless a progress notification resets its timer (``resetTimeoutOnProgress``). A build
stage, a download or a deploy gate may print nothing for minutes, so while a call runs the server sends a
notification at least every :data:`HEARTBEAT_SECONDS`. Notifications go out only when the client asked for them
(its request carried a ``progressToken``); without one, sending is a no-op of the SDK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver import Context

from llamaforge.core.events import Event
from llamaforge.fronts.mcp.output import Output

HEARTBEAT_SECONDS = 15.0
"""The longest silence between two progress notifications of a running call (well under the TypeScript SDK's
60 s request timeout, which each notification resets)."""

_T = TypeVar("_T")


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


class Progress:
    """The progress notifications of one call: :meth:`event` for each stage event, and, while :meth:`run`
    awaits the operation, a heartbeat whenever nothing was sent for ``every`` seconds."""

    def __init__(self, ctx: Context[Any, Any], output: Output, every: float) -> None:
        self._ctx = ctx
        self._output = output
        self._every = every
        self._step = 0
        self._stage = ""
        self._started = self._last = anyio.current_time()
        self._lock = anyio.Lock()  # notifications leave in the order of their step

    async def send(self, message: str) -> None:
        """One notification with the next step number. Best effort: a client that went away must not fail the
        operation."""
        async with self._lock:
            self._step += 1
            self._last = anyio.current_time()
            with contextlib.suppress(Exception):
                await self._ctx.report_progress(self._step, None, self._output.text(message))

    async def event(self, event: Event) -> None:
        """A stage event of the operation (log lines are not progress)."""
        if event.kind == "log":
            return
        self._stage = event.stage or self._stage
        await self.send(f"[{event.stage}] {event.message}" if event.stage else event.message)

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(max(0.0, self._last + self._every - anyio.current_time()))
            if anyio.current_time() - self._last >= self._every:
                running = f"still running, {_duration(anyio.current_time() - self._started)} so far"
                await self.send(f"[{self._stage}] {running}" if self._stage else running)

    async def run(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Await ``work`` with the heartbeat beating; its result, or what it raised."""
        results: list[_T] = []
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._heartbeat)
            try:
                results.append(await work())
            except Exception as error:  # noqa: BLE001 - raised after the group, not as an ExceptionGroup
                failure = error
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return results[0]
