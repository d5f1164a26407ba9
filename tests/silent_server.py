"""A stdio MCP server for the long-call tests: the real server (``llamaforge.fronts.mcp.server.build_server``) over a
registry of two test operations that wait in silence, reporting no event at all.

    python tests/silent_server.py

``silent.wait`` is long-running (the server runs it as a job, ``_run_as_job``); ``silent.pause`` is short (run in
a worker thread, ``_run_inline``). Both wait ``seconds`` unless the call is cancelled. What the tests check is
the server's heartbeat, not the operations.

``LLAMAFORGE_TEST_HEARTBEAT_SECONDS`` sets the server's heartbeat interval (default: the server's own); only this
launcher reads it.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO / "src"), str(REPO)):  # this checkout's mcp_server/ and src/
    if entry not in sys.path:
        sys.path.insert(0, entry)

from pydantic import Field  # noqa: E402

from llamaforge.core.registry import Operation, OperationContext, Params, Result  # noqa: E402
from llamaforge.fronts.mcp.options import ServerOptions  # noqa: E402
from llamaforge.fronts.mcp.server import build_server  # noqa: E402

HEARTBEAT_ENV = "LLAMAFORGE_TEST_HEARTBEAT_SECONDS"


class WaitParams(Params):
    """How long the test operation waits."""

    seconds: float = Field(ge=0, description="Seconds to wait, reporting nothing")


class Waited(Result):
    """What the test operation did."""

    seconds: float
    cancelled: bool


def wait(params: WaitParams, ctx: OperationContext) -> Waited:
    """Wait in silence until the time is up or the call is cancelled."""
    woken = threading.Event()
    remove = ctx.cancel.on_cancel(woken.set)
    try:
        woken.wait(params.seconds)
    finally:
        remove()
    return Waited(seconds=params.seconds, cancelled=ctx.cancel.cancelled)


REGISTRY = {
    op.name: op
    for op in (
        Operation(
            "silent.wait",
            "Wait in silence as a job (test only)",
            WaitParams,
            Waited,
            wait,
            read_only=True,
            long_running=True,
        ),
        Operation(
            "silent.pause",
            "Wait in silence in a worker thread (test only)",
            WaitParams,
            Waited,
            wait,
            read_only=True,
        ),
    )
}


def main() -> None:
    """Serve over stdio until the client closes the connection."""
    heartbeat = os.environ.get(HEARTBEAT_ENV)
    options = ServerOptions() if heartbeat is None else ServerOptions(heartbeat_seconds=float(heartbeat))
    build_server(options, registry=REGISTRY).run("stdio")


if __name__ == "__main__":
    main()
