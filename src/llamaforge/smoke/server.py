"""Smoke stage 2: a llama-server on loopback, measured with real streaming chat completions.

The server is started by :class:`~llamaforge.serve.launcher.LlamaServer`. :func:`stream_chat` times one
OpenAI-compatible streaming request from the client's side and keeps the server's own ``timings`` next to it.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from llamaforge.core.events import CancelToken, Event, Reporter
from llamaforge.serve.launcher import HOST


@dataclass(frozen=True)
class ChatRequest:
    """What one measured request asks for."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = True  # measured requests generate exactly max_tokens; non_empty_answer does not

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
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(request.body()).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
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
            reporter(
                Event(
                    "progress",
                    f"c={concurrency}: request {done}/{requests}",
                    stage="server",
                    completed=done,
                    total=requests,
                )
            )
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
