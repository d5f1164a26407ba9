"""Smoke stage 2: a llama-server on loopback, measured with real streaming chat completions.

:class:`LlamaServer` owns the process: it picks a free port (and moves on when one turns out busy), waits for
``/health``, checks that the server answering is the one it started, and always stops it (normal exit,
failure, timeout, cancel, Ctrl-C); the log stays in the run directory. :func:`stream_chat` times one
OpenAI-compatible streaming request from the client's side and keeps the server's own ``timings`` next to it.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from llamaforge.core.errors import SmokeFailed, ToolFailed
from llamaforge.core.events import CancelToken, Event, Reporter

HOST = "127.0.0.1"  # loopback only: the smoke never exposes a server
PORT_ATTEMPTS = 5
_BIND_FAILURE = "couldn't bind"


def _tail_since(path: Path, offset: int, lines: int = 20) -> list[str]:
    """The last lines the current attempt wrote to the shared server log."""
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace").splitlines()[-lines:]


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``127.0.0.1:port`` (we can bind it ourselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the kernel says is free now (another process may still take it before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class ServerConfig:
    """How to start llama-server for a smoke run."""

    binary: Path
    model: Path
    log_path: Path
    slots: int
    ctx_per_slot: int
    threads: int | None = None
    port: int | None = None  # None: any free port
    load_timeout_s: float = 300.0


class LlamaServer:
    """A llama-server process on 127.0.0.1; a context manager that always stops it."""

    def __init__(self, config: ServerConfig, reporter: Reporter, cancel: CancelToken) -> None:
        self.config = config
        self.reporter = reporter
        self.cancel = cancel
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.pid = 0
        self.startup_s = 0.0
        self.command: list[str] = []
        self.busy_ports: list[int] = []
        self._log: IO[bytes] | None = None
        self._unregister: Any = None

    def command_for(self, port: int) -> list[str]:
        """The llama-server command line for ``port``."""
        c = self.config
        command = [
            str(c.binary), "-m", str(c.model), "--host", HOST, "--port", str(port), "--no-webui",
            "-np", str(c.slots), "-c", str(c.slots * c.ctx_per_slot),
        ]  # fmt: skip
        if c.threads:
            command += ["-t", str(c.threads), "-tb", str(c.threads)]
        return command

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.stop(grace_s=0.0)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # After a failure, cancel or Ctrl-C nothing is worth waiting for: a busy server can take seconds to
        # finish the request in flight after SIGTERM.
        self.stop(grace_s=0.0 if exc_type is not None else 5.0)

    def start(self) -> None:
        """Start the server and wait until it serves the model; try other ports when one is busy."""
        requested = self.config.port
        self._log = self.config.log_path.open("ab")
        self._unregister = self.cancel.on_cancel(self._kill)
        started = time.monotonic()
        for _attempt in range(PORT_ATTEMPTS):
            port = requested if requested is not None else free_port()
            requested = None
            if not port_is_free(port):
                self._busy(port)
                continue
            if self._launch(port):
                self.startup_s = time.monotonic() - started
                return
            self._busy(port)
        raise SmokeFailed(
            f"llama-server found no free port in {PORT_ATTEMPTS} attempts (busy: {self.busy_ports})",
            hint=f"something keeps taking loopback ports; see {self.config.log_path}",
        )

    def _busy(self, port: int) -> None:
        self.busy_ports.append(port)
        self.reporter(Event("warning", f"port {port} on {HOST} is busy; trying another", stage="server"))

    def _launch(self, port: int) -> bool:
        """Start on ``port``; True once ready, False when the port was taken under us (the process is gone)."""
        assert self._log is not None
        self.command = self.command_for(port)
        self._log.write(f"### llamaforge: {' '.join(self.command)}\n".encode())
        self._log.flush()
        offset = self._log.tell()
        self.cancel.raise_if_cancelled()
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self.port, self.pid = port, self.process.pid
        self.reporter(Event("info", f"llama-server pid {self.pid} loading on {HOST}:{port}", stage="server"))
        deadline = time.monotonic() + self.config.load_timeout_s
        while True:
            self.cancel.raise_if_cancelled()
            code = self.process.poll()
            if code is not None:
                self.process.wait()
                tail = _tail_since(self.config.log_path, offset)
                if any(_BIND_FAILURE in line for line in tail):
                    return False
                raise ToolFailed(
                    f"llama-server exited with code {code} before it was ready", command=self.command,
                    returncode=code, tail=tail, log_path=str(self.config.log_path),
                    hint="the log says why: e.g. a model file llama.cpp cannot load, or not enough memory",
                )  # fmt: skip
            if time.monotonic() > deadline:
                raise SmokeFailed(
                    f"llama-server was not ready within {self.config.load_timeout_s:.0f} s (it was stopped)",
                    hint=f"raise --load-timeout-s for big models; log: {self.config.log_path}",
                )
            if self._ready():
                return True
            time.sleep(0.1)

    def _ready(self) -> bool:
        status, _ = request_json(self.port, "GET", "/health", timeout=2.0)
        if status != 200:
            return False
        # Make sure the server answering is ours and serves our model, not another one on a reused port.
        status, props = request_json(self.port, "GET", "/props", timeout=5.0)
        if status != 200 or self.process is None or self.process.poll() is not None:
            return False
        served = str(props.get("model_path", ""))
        if served != str(self.config.model):
            raise SmokeFailed(
                f"the server on {HOST}:{self.port} serves {served!r}, not {self.config.model}",
                hint="another llama-server took the port; run the smoke again",
            )
        return True

    def _kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``grace_s``; at once for 0) and close its log; idempotent."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None and grace_s > 0:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=grace_s)
            if process.poll() is None:
                process.kill()
            process.wait()
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        if self._log is not None:
            self._log.close()
            self._log = None


def request_json(
    port: int, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float
) -> tuple[int, dict[str, Any]]:
    """One small HTTP request to the loopback server: (status, parsed JSON or {}); status 0 when unreachable."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        try:
            data = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            data = {}
        return response.status, data if isinstance(data, dict) else {"data": data}
    except (OSError, http.client.HTTPException):
        return 0, {}
    finally:
        connection.close()


@dataclass(frozen=True)
class ChatRequest:
    """What one measured request asks for."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = True  # measured requests generate exactly max_tokens; the must-answer one does not

    def body(self) -> dict[str, Any]:
        """The JSON body of the OpenAI-compatible streaming request."""
        return {
            "model": "smoke",
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
            "ignore_eos": self.ignore_eos,
            "cache_prompt": False,  # every request processes its whole prompt: TTFT is not a cache hit
            "chat_template_kwargs": {"enable_thinking": False},
        }


@dataclass
class RequestSample:
    """One request as the client saw it, with the server's own timings next to it."""

    index: int
    concurrency: int
    start_s: float = 0.0  # since the level started
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    decode_tps: float | None = None  # (tokens - 1) / (last token - first token), like the server's figure
    reply: str = ""
    server_timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _parse_event(line: bytes) -> dict[str, Any] | None:
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return {"done": True}
    data = json.loads(payload)
    return data if isinstance(data, dict) else None


def stream_chat(
    port: int, request: ChatRequest, *, index: int, concurrency: int, timeout: float, t0: float
) -> RequestSample:
    """Send one streaming chat completion and time every content chunk as it arrives."""
    sample = RequestSample(index=index, concurrency=concurrency)
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    times: list[float] = []
    parts: list[str] = []
    started = time.perf_counter()
    sample.start_s = started - t0
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps(request.body()).encode(),
                           headers={"Content-Type": "application/json", "Accept": "text/event-stream"})  # fmt: skip
        response = connection.getresponse()
        if response.status != 200:
            sample.error = f"HTTP {response.status}: {response.read()[:300].decode(errors='replace')}"
            return sample
        while line := response.readline():
            event = _parse_event(line.strip())
            if event is None:
                continue
            if event.get("done"):
                break
            if "error" in event:
                sample.error = json.dumps(event["error"])[:300]
                break
            now = time.perf_counter()
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                if piece:
                    times.append(now)
                    parts.append(piece)
            usage = event.get("usage") or {}
            sample.completion_tokens = int(usage.get("completion_tokens", sample.completion_tokens))
            sample.prompt_tokens = int(usage.get("prompt_tokens", sample.prompt_tokens))
            timings = event.get("timings")
            if isinstance(timings, dict):
                sample.server_timings = {
                    k: float(v) for k, v in timings.items() if isinstance(v, int | float)
                }
        sample.e2e_ms = (time.perf_counter() - started) * 1000
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
        sample.error = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    sample.reply = "".join(parts)
    sample.chunks = len(times)
    if times:
        sample.ttft_ms = (times[0] - started) * 1000
        sample.itl_ms = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        tokens = sample.completion_tokens or len(times)
        if tokens > 1 and times[-1] > times[0]:
            sample.decode_tps = (tokens - 1) / (times[-1] - times[0])
    return sample


@dataclass
class LevelRun:
    """All requests of one concurrency level."""

    concurrency: int
    wall_s: float
    samples: list[RequestSample]


def run_level(
    port: int,
    request: ChatRequest,
    *,
    concurrency: int,
    requests: int,
    timeout: float,
    reporter: Reporter,
    cancel: CancelToken,
) -> LevelRun:
    """``requests`` streaming requests with at most ``concurrency`` in flight at once."""
    done = 0
    lock = threading.Lock()

    def one(index: int) -> RequestSample:
        nonlocal done
        if cancel.cancelled:
            return RequestSample(index=index, concurrency=concurrency, error="cancelled")
        sample = stream_chat(port, request, index=index, concurrency=concurrency, timeout=timeout, t0=t0)
        with lock:
            done += 1
            reporter(Event("progress", f"c={concurrency}: request {done}/{requests}", stage="server",
                           completed=done, total=requests))  # fmt: skip
        return sample

    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="smoke-request")
    try:
        samples = list(pool.map(one, range(requests)))
    finally:
        # On Ctrl-C, don't wait here for requests in flight: the caller stops the server, which ends them.
        pool.shutdown(wait=False, cancel_futures=True)
    cancel.raise_if_cancelled()
    return LevelRun(concurrency=concurrency, wall_s=time.perf_counter() - t0, samples=samples)
