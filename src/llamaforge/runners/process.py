"""The process runner: every binary llamaforge starts (git, cmake, nvcc, llama-bench, llama-server …) goes here.

Modelled on Invoke's ``Runner``: a command is an argv list (never a shell string) with an environment, a working
directory, optional stdin, its output streamed line by line to a callback, a timeout and cancellation through
the operation's :class:`~llamaforge.core.events.CancelToken`. :meth:`ProcessRunner.run` waits and returns a
:class:`ProcessResult`; a non-zero exit raises :class:`~llamaforge.core.errors.ToolFailed` with the command,
the exit code and the last lines of output (Invoke's ``UnexpectedExit``) unless the caller passes ``warn=True``.
:meth:`ProcessRunner.start` starts a long-lived process (llama-server) and returns a :class:`ProcessHandle`.

Fabric's ``Connection`` is an Invoke ``Context`` with a remote runner: an SSH runner implements this same
protocol. Secrets travel in the environment only: the runner refuses an argv that contains the value of a
secret-looking variable, and masks such values in every line it keeps or forwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from llamaforge.core.errors import InvalidOption, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.core.guard import check_program, child_env

LineCallback = Callable[[str], None]
TAIL_LINES = 20
# Variables named like HF_TOKEN, AWS_SECRET_ACCESS_KEY, REGISTRY_PASSWORD (not TOKENIZERS_PARALLELISM).
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIALS?)(_|$)", re.IGNORECASE)
_MASK = "****"


@dataclass(frozen=True)
class ProcessResult:
    """A finished command: its argv, exit code, output and how long it ran."""

    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str  # empty when stderr was merged into stdout
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def lines(self) -> list[str]:
        """Every output line (stdout, then stderr when they were kept apart)."""
        return [*self.stdout.splitlines(), *self.stderr.splitlines()]


class ProcessHandle(Protocol):
    """A process started by :meth:`ProcessRunner.start`."""

    argv: list[str]
    pid: int

    def lines(self, timeout_s: float | None = None) -> Iterator[str]:
        """Output lines from the first one, as they arrive; ends when the output closes or after ``timeout_s``."""
        ...

    def tail(self, count: int = TAIL_LINES) -> list[str]:
        """The last ``count`` output lines seen so far."""
        ...

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        ...

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the exit code; None when ``timeout_s`` passed first."""
        ...

    def terminate(self, grace_s: float = 5.0) -> int:
        """Stop the process (SIGTERM, SIGKILL after ``grace_s``; at once for 0); returns its exit code."""
        ...


class ProcessRunner(Protocol):
    """Runs commands somewhere: this host (:class:`LocalProcessRunner`), later an SSH host."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdin: str | None = None,
        on_line: LineCallback | None = None,
        merge_stderr: bool = False,
        timeout_s: float | None = None,
        cancel: CancelToken | None = None,
        warn: bool = False,
        log_path: Path | None = None,
        what: str | None = None,
        hint: str | None = None,
    ) -> ProcessResult:
        """Run ``argv`` to its end and return its result.

        ``env`` is added to this process's environment; ``on_line`` gets every output line as it arrives;
        ``log_path`` receives stderr's lines (every line with ``merge_stderr``) and is named in errors. A
        non-zero exit raises ToolFailed unless ``warn``; a timeout kills the process and raises ToolFailed (with
        ``warn``: a result with ``timed_out``); cancellation kills it and raises Cancelled.
        """
        ...

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        on_line: LineCallback | None = None,
        log_path: Path | None = None,
        cancel: CancelToken | None = None,
    ) -> ProcessHandle:
        """Start ``argv`` (stdout and stderr merged, no stdin) and return at once; cancellation kills it."""
        ...


def _secrets(env: Mapping[str, str]) -> list[str]:
    return [value for name, value in env.items() if _SECRET_NAME.search(name) and len(value) >= 6]


def _check_argv(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    command = [str(part) for part in argv]
    if not command:
        raise InvalidOption("empty command", hint="pass the program and its arguments as a list")
    if any(secret in part for secret in secrets for part in command):
        raise InvalidOption(
            f"the command line of {command[0]} contains a secret",
            hint="pass tokens and passwords through the environment, never on the command line",
        )
    return command


def _masker(secrets: Sequence[str]) -> Callable[[str], str]:
    def mask(line: str) -> str:
        for secret in secrets:
            line = line.replace(secret, _MASK)
        return line

    return mask


def _kill_group(process: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    """Signal the process group (build scripts leave children); the process itself when that fails."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        process.send_signal(sig)


@dataclass
class _Output:
    """Lines read from one process, shared by its reader threads and its consumers."""

    mask: Callable[[str], str]
    on_line: LineCallback | None
    log: IO[str] | None
    keep_all: bool = True
    lines: list[str] = field(default_factory=list)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES * 4))
    closed: int = 0
    streams: int = 1
    changed: threading.Condition = field(default_factory=threading.Condition)

    def pump(self, stream: IO[str], sink: list[str], to_log: bool = True) -> None:
        """Read ``stream`` to its end (a reader thread's body)."""
        try:
            for raw in stream:
                line = self.mask(raw.rstrip("\n"))
                with self.changed:
                    sink.append(line)
                    if self.keep_all and sink is not self.lines:
                        self.lines.append(line)
                    self.recent.append(line)
                    if self.log is not None and to_log:
                        self.log.write(line + "\n")
                        self.log.flush()
                    if self.on_line is not None:
                        self.on_line(line)
                    self.changed.notify_all()
        finally:
            stream.close()
            with self.changed:
                self.closed += 1
                self.changed.notify_all()

    @property
    def done(self) -> bool:
        """True once every stream reached its end."""
        return self.closed >= self.streams


def _feed(stream: IO[str], text: str) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        stream.write(text)
        stream.close()


def _spawn(
    command: list[str],
    env: Mapping[str, str] | None,
    cwd: Path | None,
    *,
    stdin: bool,
    merge: bool,
    log: IO[str] | None,
    hint: str | None,
) -> subprocess.Popen[str]:
    """Start ``command`` in a new process group; ToolFailed (exit code 127) when it cannot start."""
    try:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=child_env(env),
            text=True,
            errors="replace",
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as error:
        if log is not None:
            log.close()
        raise ToolFailed(
            f"{Path(command[0]).name} could not be started: {error.strerror or error}",
            command=command,
            returncode=127,
            tail=[],
            hint=hint or f"check that {command[0]} exists and is executable",
        ) from None


class OutputHandle:
    """The output side of a started process: its lines as they arrive and the last ones (shared by the local
    and the SSH handles)."""

    def __init__(self, output: _Output) -> None:
        self._output = output

    def lines(self, timeout_s: float | None = None) -> Iterator[str]:
        """Output lines from the first one, as they arrive; ends when the output closes or after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        index = 0
        while True:
            with self._output.changed:
                while index >= len(self._output.lines) and not self._output.done:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return
                    self._output.changed.wait(timeout=left)
                if index >= len(self._output.lines):
                    return
                line = self._output.lines[index]
            index += 1
            yield line

    def tail(self, count: int = TAIL_LINES) -> list[str]:
        """The last ``count`` output lines seen so far."""
        with self._output.changed:
            return list(self._output.recent)[-count:]

    def wait_output(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) until every output stream has reached its end."""
        with self._output.changed:
            self._output.changed.wait_for(lambda: self._output.done, timeout=timeout_s)


class LocalProcessHandle(OutputHandle):
    """A process on this host, its output read by a thread into memory (and the log file, when given)."""

    def __init__(
        self, process: subprocess.Popen[str], command: list[str], output: _Output, cleanup: Callable[[], None]
    ) -> None:
        super().__init__(output)
        self._process = process
        self._cleanup = cleanup
        self.argv = command
        self.pid = process.pid

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        return self._process.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the exit code; None when ``timeout_s`` passed first."""
        try:
            code = self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._finish()
        return code

    def terminate(self, grace_s: float = 5.0) -> int:
        """Stop the process (SIGTERM, SIGKILL after ``grace_s``; at once for 0); returns its exit code."""
        if self._process.poll() is None and grace_s > 0:
            _kill_group(self._process, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=grace_s)
        _kill_group(self._process)
        code = self._process.wait()
        self._finish()
        return code

    def _finish(self) -> None:
        self.wait_output()
        self._cleanup()


def finished_run(
    command: list[str],
    exit_code: int,
    out_lines: list[str],
    err_lines: list[str],
    *,
    started: float,
    timed_out: bool,
    warn: bool,
    what: str,
    hint: str | None,
    timeout_s: float | None,
    log_path: Path | None,
) -> ProcessResult:
    """The result of a command that ended, or its ToolFailed (a timeout or a non-zero exit, unless ``warn``): one
    rule for every runner, wherever the command ran."""
    result = ProcessResult(
        argv=command,
        exit_code=exit_code,
        stdout="".join(f"{line}\n" for line in out_lines),
        stderr="".join(f"{line}\n" for line in err_lines),
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
    )
    log_name = str(log_path) if log_path is not None else None
    tail = (err_lines or out_lines)[-TAIL_LINES:]
    if timed_out and not warn:
        raise ToolFailed(
            f"{what} did not finish within {timeout_s:g} s",
            command=command,
            returncode=exit_code,
            tail=tail,
            log_path=log_name,
            hint=hint or "raise the timeout, or give it less work",
            timed_out=True,
        )
    if exit_code != 0 and not warn:
        raise ToolFailed(
            f"{what} failed", command=command, returncode=exit_code, tail=tail, log_path=log_name, hint=hint
        )
    return result


class LocalProcessRunner:
    """Runs commands as processes of this host, each in its own process group (killed whole on cancel)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdin: str | None = None,
        on_line: LineCallback | None = None,
        merge_stderr: bool = False,
        timeout_s: float | None = None,
        cancel: CancelToken | None = None,
        warn: bool = False,
        log_path: Path | None = None,
        what: str | None = None,
        hint: str | None = None,
    ) -> ProcessResult:
        """Run ``argv`` to its end and return its result (see :meth:`ProcessRunner.run`)."""
        cancel = cancel or CancelToken()
        secrets = _secrets(env or {})
        command = _check_argv(argv, secrets)
        check_program(command)  # a read-only front runs only llamaforge's own probes
        what = what or Path(command[0]).name
        cancel.raise_if_cancelled()
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        output = _Output(_masker(secrets), on_line, log, keep_all=False, streams=1 if merge_stderr else 2)
        out_lines: list[str] = []
        err_lines: list[str] = []
        started = time.monotonic()
        timed_out = False
        process = _spawn(command, env, cwd, stdin=stdin is not None, merge=merge_stderr, log=log, hint=hint)
        unregister = cancel.on_cancel(lambda: _kill_group(process))
        # Kept apart, stdout is the command's product (JSON, a version): the log and the error tail show stderr.
        readers = [
            threading.Thread(target=output.pump, args=(process.stdout, out_lines, merge_stderr), daemon=True)
        ]
        if not merge_stderr:
            readers.append(
                threading.Thread(target=output.pump, args=(process.stderr, err_lines), daemon=True)
            )
        try:
            for reader in readers:
                reader.start()
            if stdin is not None and process.stdin is not None:
                # From a thread: a command that never reads a large input must not block the timeout.
                threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True).start()
            deadline = None if timeout_s is None else started + timeout_s
            while process.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    _kill_group(process)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.1)
            for reader in readers:
                # A killed command's escaped grandchild may hold the pipe open: don't wait for it forever.
                reader.join(timeout=5.0 if timed_out or cancel.cancelled else None)
        except BaseException:
            _kill_group(process)
            process.wait()
            raise
        finally:
            unregister()
            if log is not None:
                with output.changed:
                    output.log = None
                log.close()
        cancel.raise_if_cancelled()
        return finished_run(
            command,
            process.returncode,
            out_lines,
            err_lines,
            started=started,
            timed_out=timed_out,
            warn=warn,
            what=what,
            hint=hint,
            timeout_s=timeout_s,
            log_path=log_path,
        )

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        on_line: LineCallback | None = None,
        log_path: Path | None = None,
        cancel: CancelToken | None = None,
    ) -> LocalProcessHandle:
        """Start ``argv`` (stdout and stderr merged, no stdin) and return at once; cancellation kills it."""
        cancel = cancel or CancelToken()
        secrets = _secrets(env or {})
        command = _check_argv(argv, secrets)
        check_program(command)  # a read-only front runs only llamaforge's own probes
        cancel.raise_if_cancelled()
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        output = _Output(_masker(secrets), on_line, log)
        process = _spawn(command, env, cwd, stdin=False, merge=True, log=log, hint=None)
        unregister = cancel.on_cancel(lambda: _kill_group(process))

        def cleanup() -> None:
            unregister()
            if log is not None and not log.closed:
                with output.changed:
                    log.close()
                    output.log = None

        threading.Thread(target=output.pump, args=(process.stdout, output.lines), daemon=True).start()
        return LocalProcessHandle(process, command, output, cleanup)


LOCAL = LocalProcessRunner()
"""The runner for this host: the default of every function that starts a process."""
