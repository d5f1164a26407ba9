"""The health gate: a deployed llama-server must answer ``/health`` with 200 and then a real completion.

It is checked through the SSH connection, on the host's loopback: a local port on this side's 127.0.0.1 is
forwarded over the runner's own paramiko transport (:func:`~llamaforge.runners.ssh.forward.forward_local`), so
the server never listens beyond the host's loopback and the host needs no curl or other client; the smoke
answer helpers (:mod:`llamaforge.smoke.answers`) then run unchanged against the forwarded URL.

``/health`` answers 503 while the model loads, so the gate waits as long as the model's size warrants, with a
cap. A service the manager had to restart, or that failed, fails the gate at once with its last log lines, a
crash named by its signal and the CPU module it ran (:func:`service_down`).
With a model recipe's ``[[answers]]`` each must match; without, a greedy ``/completion`` must produce its
tokens (the tiny random-weight model has no meaningful answer).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llamaforge.core.events import CancelToken
from llamaforge.core.exits import crash_hint, crash_words, loaded_cpu_module, systemd_crash
from llamaforge.core.guard import is_loopback
from llamaforge.deploy.release import LOOPBACK, Layout, gate_timeout_s
from llamaforge.models.recipes import AnswerCheck
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.serve.launcher import request_json
from llamaforge.smoke.answers import GoldenRequest, check_answers, greedy_completion

if TYPE_CHECKING:
    from llamaforge.deploy.targets.base import ServiceState, Target

COMPLETION_TOKENS = 8
# A small model answers within a second or two of its restart: poll often then, and calmly after that.
POLL_FIRST_S = 0.1
POLL_FAST_FOR_S = 5.0
POLL_S = 0.5
LOG_LINES = 20  # the last log lines a failed gate reports
# After a crash the journal is read further back: to ggml's load_backend line of the run that crashed.
CRASH_LOG_LINES = 400
SERVER = "llama-server"


def gate_address(listen: str) -> str:
    """Where the gate reaches a server that binds ``listen``: its loopback, unless it binds one other address."""
    wildcard = listen in ("0.0.0.0", "::")  # noqa: S104 - reading the bound address, binding nothing
    return LOOPBACK if wildcard or is_loopback(listen) else listen


@dataclass(frozen=True)
class GateOutcome:
    """The gate's verdict on one host."""

    passed: bool
    detail: str
    health_s: float = 0.0
    completion: str = ""
    logs: list[str] = field(default_factory=list)


def _completion(base_url: str, checks: Sequence[AnswerCheck], api_key: str | None) -> tuple[bool, str]:
    try:
        if checks:
            outcomes = check_answers(base_url, checks, api_key=api_key)
            failed = [outcome for outcome in outcomes if not outcome.passed]
            if failed:
                first = failed[0]
                return (
                    False,
                    f"answer to {first.prompt!r}: {first.error or repr(first.reply)}, expected {first.expected}",
                )
            return True, " | ".join(outcome.reply for outcome in outcomes)
        tokens = greedy_completion(
            base_url, GoldenRequest(n_predict=COMPLETION_TOKENS, n_probs=1), api_key=api_key
        )
    except OSError as error:
        return False, f"completion failed: {error}"
    if len(tokens) != COMPLETION_TOKENS:
        return False, f"the completion returned {len(tokens)} tokens, not {COMPLETION_TOKENS}"
    return True, "".join(str(token["token"]) for token in tokens)


def loader_module(runner: SshProcessRunner, layout: Layout) -> str | None:
    """The CPU module ggml's loader picks on the host for the current release's llama-server, asked of the
    binary itself (``-lv 4 --list-devices``, with the unit's library path): a server's log names it from level 4
    only, and the loader's choice follows from the host's CPU and the release's files alone."""
    current = layout.current
    result = runner.run(
        [posixpath.join(current, "bin", SERVER), "-lv", "4", "--list-devices"],
        env={"LD_LIBRARY_PATH": posixpath.join(current, "lib")},
        merge_stderr=True,
        warn=True,
        timeout_s=30,
    )
    return loaded_cpu_module(result.stdout.splitlines())


def service_down(
    runner: SshProcessRunner,
    target: Target,
    layout: Layout,
    state: ServiceState,
    *,
    started: float,
    service: str = "the service",
    program: str = SERVER,
) -> GateOutcome:
    """The failed gate of a service its manager had to restart, or that failed: a crash is named with its
    signal and the CPU module it ran (from the manager's ``ExecMainCode``/``ExecMainStatus``, else the journal's
    exit line, and ggml's ``load_backend`` line, else :func:`loader_module`) and a hint that fits; the last log
    lines come along."""
    journal = target.logs(runner, layout, lines=CRASH_LOG_LINES)
    sig, module = systemd_crash(journal)
    sig = state.killed_by or sig
    counts = f"({state.active}, {state.restarts} restarts)"
    if sig is None:
        detail = f"{service} {'failed' if state.active == 'failed' else 'exited and was restarted'} {counts}"
    else:
        module = (
            module
            or loaded_cpu_module(journal)
            or (loader_module(runner, layout) if program == SERVER else None)
        )
        what = "failed" if state.active == "failed" else "was restarted"
        detail = f"{service} {what} {counts}: {crash_words(program, sig, module)}; {crash_hint(sig, module)}"
    return GateOutcome(False, detail, time.monotonic() - started, logs=journal[-LOG_LINES:])


def health_gate(
    runner: SshProcessRunner,
    target: Target,
    layout: Layout,
    port: int,
    *,
    model_size: int,
    checks: Sequence[AnswerCheck] = (),
    timeout_s: float | None = None,
    cancel: CancelToken | None = None,
    api_key: str | None = None,
    listen: str = LOOPBACK,
) -> GateOutcome:
    """Wait for the service's ``/health`` on the host's ``127.0.0.1:port`` (or on ``listen`` when it binds one
    address), then ask for a completion, sending ``api_key`` when the server wants one (``/health`` needs none)."""
    cancel = cancel or CancelToken()
    limit = timeout_s if timeout_s is not None else gate_timeout_s(model_size)
    started = time.monotonic()
    with forward_local(runner, port, gate_address(listen)) as local_port:
        status = 0
        while True:
            cancel.raise_if_cancelled()
            state = target.state(runner, layout)
            if state.restarts > 0 or state.active == "failed":
                return service_down(runner, target, layout, state, started=started)
            status, _body = request_json(local_port, "GET", "/health", timeout=5.0)
            if status == 200:
                break
            if time.monotonic() - started > limit:
                detail = f"/health did not answer 200 within {limit:g} s (last: {status or 'no answer'})"
                return GateOutcome(
                    False, detail, time.monotonic() - started, logs=target.logs(runner, layout)
                )
            waited = time.monotonic() - started
            time.sleep(POLL_FIRST_S if waited < POLL_FAST_FOR_S else POLL_S)
        health_s = time.monotonic() - started
        passed, text = _completion(f"http://127.0.0.1:{local_port}", checks, api_key)
    if not passed:
        return GateOutcome(False, text, health_s, logs=target.logs(runner, layout))
    return GateOutcome(True, "/health 200 and a completion", health_s, completion=text)


def gate_service(
    runner: SshProcessRunner,
    target: Target,
    layout: Layout,
    port: int,
    *,
    model_size: int,
    checks: Sequence[AnswerCheck] = (),
    timeout_s: float | None = None,
    cancel: CancelToken | None = None,
    api_key: str | None = None,
    listen: str = LOOPBACK,
) -> GateOutcome:
    """The target's own gate when it has one (an RPC worker answers no HTTP), else :func:`health_gate`."""
    own = getattr(target, "gate", None)
    if own is not None:
        outcome: GateOutcome = own(runner, layout, timeout_s=timeout_s, cancel=cancel)
        return outcome
    return health_gate(
        runner,
        target,
        layout,
        port,
        model_size=model_size,
        checks=checks,
        timeout_s=timeout_s,
        cancel=cancel,
        api_key=api_key,
        listen=listen,
    )
