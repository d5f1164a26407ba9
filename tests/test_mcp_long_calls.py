"""Long MCP calls outlive the client's timeout only because the server's heartbeat resets it.

The MCP TypeScript SDK (what desktop clients and IDEs use) gives up on a request after 60 s unless a progress
notification resets its timer (``resetTimeoutOnProgress``). The server (``tests/silent_server.py``: the real
``build_server`` over operations that wait in silence, reporting no event) must send a progress notification at
least every ``HEARTBEAT_SECONDS`` while a call runs, in a job (``_run_as_job``) or in a worker thread
(``_run_inline``), and only when the client asked for progress.

The TypeScript tests run the SDK pinned in tests/ts-client (``npm ci`` there; .ci/run does it). The slow one makes
calls of 70 s on purpose, longer than the client's 60 s timeout; its three calls run side by side (about 75 s).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import Client, StdioServerParameters

from conftest import require
from helpers import REPO

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

from llamaforge.fronts.mcp.options import ServerOptions
from llamaforge.fronts.mcp.progress import HEARTBEAT_SECONDS

pytestmark = pytest.mark.quick

TS_CLIENT = REPO / "tests" / "ts-client"
LAUNCHER = REPO / "tests" / "silent_server.py"
HEARTBEAT_ENV = "LLAMAFORGE_TEST_HEARTBEAT_SECONDS"  # read by the launcher only
TS_TIMEOUT = 60.0  # the TypeScript SDK's DEFAULT_REQUEST_TIMEOUT_MSEC
LONG_CALL = 70.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def server_env(home: Path, heartbeat: float | None) -> dict[str, str]:
    env = {"LLAMAFORGE_HOME": str(home), "PATH": os.environ["PATH"]}
    if heartbeat is not None:
        env[HEARTBEAT_ENV] = str(heartbeat)
    return env


def gaps(times: Sequence[float], end: float) -> list[float]:
    """The silences of a call: from its start to the first notification, between notifications, and from the
    last one to its end."""
    marks = [0.0, *times, end]
    return [later - earlier for earlier, later in itertools.pairwise(marks)]


def test_the_heartbeat_is_well_inside_the_typescript_timeout() -> None:
    assert HEARTBEAT_SECONDS <= 20, "a desktop client gives up after 60 s without a progress notification"
    assert ServerOptions().heartbeat_seconds == HEARTBEAT_SECONDS


# --- the Python client, fast: a heartbeat of 0.2 s --------------------------------------------------------------


@pytest.mark.anyio
async def test_silent_calls_send_a_heartbeat_only_when_progress_was_asked_for(lf_home: Path) -> None:
    heartbeat = 0.2
    server = StdioServerParameters(
        command=sys.executable, args=[str(LAUNCHER)], cwd=str(REPO), env=server_env(lf_home, heartbeat)
    )
    received: list[mcp_types.ProgressNotification] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ProgressNotification):
            received.append(message)

    async with Client(server, message_handler=on_message) as client:
        for tool in ("silent_wait", "silent_pause"):  # a job, and a worker thread
            updates: list[tuple[float, float, str | None]] = []
            started = time.monotonic()

            async def on_progress(
                progress: float,
                total: float | None,
                message: str | None,
                log: list[Any] = updates,
                start: float = started,
            ) -> None:
                log.append((time.monotonic() - start, progress, message))

            result = await client.call_tool(tool, {"seconds": 2.0}, progress_callback=on_progress)
            elapsed = time.monotonic() - started
            assert not result.is_error, result.content
            assert result.structured_content == {"seconds": 2.0, "cancelled": False}
            assert len(updates) >= 5, (tool, updates)
            assert all(message and "still running" in message for _, _, message in updates), updates
            values = [progress for _, progress, _ in updates]
            assert values == sorted(set(values)), f"progress must increase: {values}"
            # No silence much longer than a heartbeat (a loaded machine may be slow to wake a thread).
            assert max(gaps([at for at, _, _ in updates], elapsed)) < heartbeat + 1.0, (tool, updates)
        assert received, "the message handler sees progress notifications"
        received.clear()
        # No progressToken: nothing is sent.
        result = await client.call_tool("silent_wait", {"seconds": 1.0})
        assert not result.is_error, result.content
        result = await client.call_tool("silent_pause", {"seconds": 1.0})
        assert not result.is_error, result.content
        assert received == []


# --- the TypeScript client ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ts_client() -> Iterator[Path]:
    """tests/ts-client/call.mjs with the pinned SDK installed (skips, or fails in strict mode, without node)."""
    require(shutil.which("node") is not None, "node is not installed (the MCP TypeScript SDK runs on node)")
    require(
        (TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").is_file(),
        "the MCP TypeScript SDK is not installed: run `npm ci` in tests/ts-client",
    )
    yield TS_CLIENT / "call.mjs"


def ts_calls(
    client: Path, calls: list[dict[str, Any]], home: Path, heartbeat: float | None
) -> dict[str, Any]:
    """Run the TypeScript client against the launcher; its report."""
    env = {**os.environ, **server_env(home, heartbeat)}
    if heartbeat is None:
        env.pop(HEARTBEAT_ENV, None)
    done = subprocess.run(
        ["node", str(client), json.dumps(calls), sys.executable, str(LAUNCHER)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_typescript_client_reads_argument_errors(ts_client: Path, lf_home: Path) -> None:
    report = ts_calls(
        ts_client,
        [
            {"name": "silent_pause", "arguments": {"seconds": "soon"}},
            {"name": "silent_wait", "arguments": {"secnds": 1}},
            {"name": "job_logs", "arguments": {"job_id": "x", "limit": 0, "page": 2}},
        ],
        lf_home,
        None,
    )
    for schema in report["tools"].values():
        assert schema["additionalProperties"] is False, schema
    wrong, unknown, job_logs = (call["result"] for call in report["calls"])
    assert all(result["isError"] for result in (wrong, unknown, job_logs))
    assert wrong["text"] == (
        "invalid arguments for silent_pause: seconds: Input should be a valid number, unable to parse string as "
        "a number"
    )
    assert unknown["text"] == (
        "invalid arguments for silent_wait: secnds: unknown argument; seconds: Field required\n"
        "  hint: did you mean 'seconds' instead of 'secnds'?"
    )
    assert job_logs["text"].startswith("invalid arguments for job_logs: page: unknown argument; limit: ")
    assert "job_logs takes: job_id, offset, limit" in job_logs["text"]
    for result in (wrong, unknown, job_logs):
        assert "pydantic" not in result["text"] and "input_value" not in result["text"], result["text"]


@pytest.mark.slow
def test_typescript_client_waits_past_its_timeout_on_heartbeats(ts_client: Path, tmp_path: Path) -> None:
    """Slow on purpose: each call lasts 70 s, longer than the TypeScript SDK's 60 s request timeout."""
    call = [{"name": "silent_wait", "arguments": {"seconds": LONG_CALL}}]
    inline = [{"name": "silent_pause", "arguments": {"seconds": LONG_CALL}}]
    runs = [(call, None), (inline, None), (call, 3600.0)]  # the last one without heartbeats
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [
            pool.submit(ts_calls, ts_client, calls, tmp_path / f"home{index}", heartbeat)
            for index, (calls, heartbeat) in enumerate(runs)
        ]
        reports = [future.result() for future in futures]
    for report in reports[:2]:
        (outcome,) = report["calls"]
        assert "error" not in outcome, outcome
        assert not outcome["result"]["isError"], outcome["result"]["text"]
        assert outcome["result"]["structuredContent"] == {"seconds": LONG_CALL, "cancelled": False}
        assert outcome["seconds"] >= LONG_CALL > TS_TIMEOUT
        times = [update["at"] for update in outcome["progress"]]
        assert len(times) >= int(LONG_CALL // HEARTBEAT_SECONDS), outcome["progress"]
        assert max(gaps(times, outcome["seconds"])) <= HEARTBEAT_SECONDS + 3, outcome["progress"]
        assert all("still running" in update["message"] for update in outcome["progress"])
    # The same call without heartbeats: the client gives up at its 60 s.
    (silent,) = reports[2]["calls"]
    assert silent["progress"] == []
    assert "result" not in silent, silent
    assert silent["error"]["code"] == -32001 and "Request timed out" in silent["error"]["message"], silent
    assert TS_TIMEOUT - 1 <= silent["seconds"] < TS_TIMEOUT + 5, silent


@pytest.mark.anyio
async def test_heartbeat_keeps_progress_values_rising_between_stage_events(lf_home: Path) -> None:
    """Stage events and heartbeats share one counter: a client sees progress rise whichever sent it."""
    from mcp_server import build_server

    from llamaforge.core.events import Event
    from llamaforge.core.registry import Operation, OperationContext
    from silent_server import Waited, WaitParams

    def staged(params: WaitParams, ctx: OperationContext) -> Waited:
        ctx.reporter(Event("stage", "first", stage="one"))
        time.sleep(params.seconds)
        ctx.reporter(Event("stage", "second", stage="two"))
        time.sleep(params.seconds)
        return Waited(seconds=params.seconds, cancelled=False)

    registry = {
        "staged.run": Operation("staged.run", "stages", WaitParams, Waited, staged, read_only=True),
        "staged.job": Operation(
            "staged.job", "stages", WaitParams, Waited, staged, read_only=True, long_running=True
        ),
    }
    server = build_server(ServerOptions(heartbeat_seconds=0.2), registry=registry)
    async with Client(server) as client:
        for tool in ("staged_run", "staged_job"):
            updates: list[tuple[float, str | None]] = []

            async def on_progress(
                progress: float, total: float | None, message: str | None, log: list[Any] = updates
            ) -> None:
                log.append((progress, message))

            result = await client.call_tool(tool, {"seconds": 0.7}, progress_callback=on_progress)
            assert not result.is_error, result.content
            values = [progress for progress, _ in updates]
            assert values == sorted(set(values)), values
            messages = [message or "" for _, message in updates]
            assert messages[0] == "[one] first", messages
            assert "[two] second" in messages, messages
            # Heartbeats name the stage they wait in.
            assert any(message.startswith("[one] still running") for message in messages), messages
            assert any(message.startswith("[two] still running") for message in messages), messages
