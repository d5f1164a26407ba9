"""The process runner: every binary llamaforge starts (git, cmake, nvcc, llama-bench, llama-server …) goes here.

Modelled on Invoke's ``Runner``: a command is an argv list (never a shell string) with an environment, a working
directory, optional stdin, its output streamed line by line to a callback, a timeout and cancellation through
the operation's :class:`~llamaforge.core.events.CancelToken`. :meth:`ProcessRunner.run` waits and returns a
:class:`ProcessResult`; a non-zero exit raises :class:`~llamaforge.core.errors.ToolFailed` with the command,
the exit code and the last lines of output (Invoke's ``UnexpectedExit``) unless the caller passes ``warn=True``.
:meth:`ProcessRunner.start` starts a long-lived process (llama-server) and returns a :class:`ProcessHandle`.

The loop is written once, in :class:`ProcessRunner`; a runner supplies how a command starts and ends on its
host (:meth:`ProcessRunner.spawn` and a few hooks), as Fabric's ``Remote`` does for Invoke: this host's
:class:`LocalProcessRunner` here, the SSH runner in :mod:`llamaforge.runners.ssh.runner`. Secrets travel in
the environment only: the runner refuses an argv that contains the value of a
secret-looking variable, and masks such values in every line it keeps or forwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from llamaforge.core.errors import ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.core.guard import check_program, child_env
from llamaforge.runners.output import (
    TAIL_LINES,
    LineCallback,
    OutputLines,
    checked_command,
    masker,
    secret_values,
)

KILL_WAIT_S = 10.0  # how long a killed command may take to end before the runner stops waiting for it


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


class RunningProcess(ABC):
    """A command a runner started, as the run loop sees it: a process of this host, or a session channel on an
    SSH host. Each runner's :meth:`ProcessRunner.spawn` returns its own kind."""

    pid: int
    stdout: IO[str]
    stderr: IO[str] | None  # None when stderr was merged into stdout where the command runs

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code, or None while the command runs (-N: ended by signal N)."""

    @abstractmethod
    def wait(self, timeout_s: float | None) -> bool:
        """Wait (at most ``timeout_s``; None: for ever) for the command to end; True once it has."""

    @abstractmethod
    def kill(self, signal_name: str = "KILL") -> None:
        """Send ``SIG<signal_name>`` to the command's whole process group."""

    def release(self) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """Free what the command held once the runner is done with it (default: nothing)."""


def _feed(stream: IO[str], text: str) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        stream.write(text)
        stream.close()


class ProcessHandle:
    """A command started by :meth:`ProcessRunner.start`: its output lines as they arrive, the last ones, and its
    end (on whichever host it runs)."""

    def __init__(
        self, process: RunningProcess, command: list[str], output: OutputLines, cleanup: Callable[[], None]
    ) -> None:
        self._process = process
        self._output = output
        self._cleanup = cleanup
        self.argv = command
        self.pid = process.pid

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

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        return self._process.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the exit code; None when ``timeout_s`` passed first."""
        if not self._process.wait(timeout_s):
            return None
        self._finish()
        return self._process.poll()

    def terminate(self, grace_s: float = 5.0) -> int:
        """Stop the process group (SIGTERM, SIGKILL after ``grace_s``; at once for 0); returns its exit code."""
        if self._process.poll() is None and grace_s > 0:
            self._process.kill("TERM")
            self._process.wait(grace_s)
        if self._process.poll() is None:
            self._process.kill("KILL")
        self._process.wait(KILL_WAIT_S)
        self._finish()
        code = self._process.poll()
        return -1 if code is None else code

    def _finish(self) -> None:
        with self._output.changed:
            self._output.changed.wait_for(lambda: self._output.done, timeout=5.0)
        self._process.release()
        self._cleanup()


def _finished_run(
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
    """The result of a command that ended, or its ToolFailed (a timeout or a non-zero exit, unless ``warn``)."""
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


class ProcessRunner(ABC):
    """Runs commands somewhere: this host (:class:`LocalProcessRunner`) or an SSH host
    (:class:`~llamaforge.runners.ssh.runner.SshProcessRunner`).

    :meth:`run` and :meth:`start` are written once here: secrets kept off the command line and masked in the
    output, output pumped line by line, the timeout, cancellation, the log file and the result. A runner
    supplies :meth:`spawn` and may override the other hooks (:meth:`check`, :meth:`describe`,
    :meth:`check_finished`), as Fabric's ``Remote`` overrides hooks of Invoke's ``Runner``.
    """

    @abstractmethod
    def spawn(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: Path | None,
        stdin: str | None,
        merge_stderr: bool,
        hint: str | None,
    ) -> RunningProcess:
        """Start ``command`` in a process group of its own, ``stdin`` fed to it (closed when None); ToolFailed
        when it cannot start."""

    def check(self, command: list[str]) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """Refuse ``command`` before it starts (default: nothing is refused)."""

    def describe(self, command: list[str]) -> str:
        """How messages name ``command`` (default: its program's name)."""
        return Path(command[0]).name

    def check_finished(  # noqa: B027 - a hook whose default is to do nothing
        self, command: list[str], exit_code: int, timed_out: bool
    ) -> None:
        """Raise when the command's end says more than its exit code (default: nothing); ``exit_code`` is -1
        when no exit status came."""

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

        ``env`` is added to the command's environment; ``on_line`` gets every output line as it arrives;
        ``log_path`` receives stderr's lines (every line with ``merge_stderr``) and is named in errors. A
        non-zero exit raises ToolFailed unless ``warn``; a timeout kills the process and raises ToolFailed (with
        ``warn``: a result with ``timed_out``); cancellation kills it and raises Cancelled.
        """
        cancel = cancel or CancelToken()
        secrets = secret_values(env or {})
        command = checked_command(argv, secrets)
        self.check(command)
        what = what or self.describe(command)
        cancel.raise_if_cancelled()
        started = time.monotonic()
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        try:
            process = self.spawn(command, env=env, cwd=cwd, stdin=stdin, merge_stderr=merge_stderr, hint=hint)
        except BaseException:
            if log is not None:
                log.close()
            raise
        out_lines: list[str] = []
        err_lines: list[str] = []
        # Kept apart, stdout is the command's product (JSON, a version): the log and the error tail show stderr.
        # With merge_stderr a separate stderr stream only carries what the runner itself printed there, kept
        # with the rest.
        streams: list[tuple[IO[str], list[str], bool]] = [(process.stdout, out_lines, merge_stderr)]
        if process.stderr is not None:
            streams.append((process.stderr, out_lines if merge_stderr else err_lines, True))
        output = OutputLines(masker(secrets), on_line, log, keep_all=False, streams=len(streams))
        readers = [threading.Thread(target=output.pump, args=stream, daemon=True) for stream in streams]
        unregister = cancel.on_cancel(process.kill)
        timed_out = False
        try:
            for reader in readers:
                reader.start()
            deadline = None if timeout_s is None else started + timeout_s
            while not process.wait(0.1):
                if deadline is not None and time.monotonic() > deadline:
                    if timed_out:
                        break  # killed but still not ended (the kill did not reach it): stop waiting
                    timed_out = True
                    process.kill()
                    deadline = time.monotonic() + KILL_WAIT_S
                if cancel.cancelled:
                    break
            for reader in readers:
                # A killed command's escaped grandchild may hold the pipe open: don't wait for it forever.
                reader.join(timeout=5.0 if timed_out or cancel.cancelled else None)
        except BaseException:
            process.kill()
            raise
        finally:
            unregister()
            process.release()
            if log is not None:
                with output.changed:
                    output.log = None
                log.close()
        cancel.raise_if_cancelled()
        code = process.poll()
        code = -1 if code is None else code
        self.check_finished(command, code, timed_out)
        return _finished_run(
            command,
            code,
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
    ) -> ProcessHandle:
        """Start ``argv`` (stdout and stderr merged, no stdin) and return at once; cancellation kills it."""
        cancel = cancel or CancelToken()
        secrets = secret_values(env or {})
        command = checked_command(argv, secrets)
        self.check(command)
        cancel.raise_if_cancelled()
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        try:
            process = self.spawn(command, env=env, cwd=cwd, stdin=None, merge_stderr=True, hint=None)
        except BaseException:
            if log is not None:
                log.close()
            raise
        streams = [process.stdout] if process.stderr is None else [process.stdout, process.stderr]
        output = OutputLines(masker(secrets), on_line, log, streams=len(streams))
        unregister = cancel.on_cancel(process.kill)

        def cleanup() -> None:
            unregister()
            if log is not None and not log.closed:
                with output.changed:
                    log.close()
                    output.log = None

        for stream in streams:
            threading.Thread(target=output.pump, args=(stream, output.lines), daemon=True).start()
        return ProcessHandle(process, command, output, cleanup)


class LocalProcess(RunningProcess):
    """A process of this host, in a process group of its own (build scripts leave children)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process
        self.pid = process.pid
        assert process.stdout is not None
        self.stdout = process.stdout
        self.stderr = process.stderr

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        return self._process.poll()

    def wait(self, timeout_s: float | None) -> bool:
        """Wait (at most ``timeout_s``) for the process to end; True once it has."""
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, signal_name: str = "KILL") -> None:
        """Signal the process group; the process itself when that fails."""
        if self._process.poll() is not None:
            return
        sig = signal.Signals[f"SIG{signal_name}"]
        try:
            os.killpg(self._process.pid, sig)
        except (ProcessLookupError, PermissionError):
            self._process.send_signal(sig)

    def release(self) -> None:
        """Reap the process (a cancelled or timed-out one was killed and ends at once)."""
        if self._process.poll() is None:
            self.kill()
            self._process.wait()


class LocalProcessRunner(ProcessRunner):
    """Runs commands as processes of this host, each in its own process group (killed whole on cancel)."""

    def check(self, command: list[str]) -> None:
        """A read-only front runs only llamaforge's own probes."""
        check_program(command)

    def spawn(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: Path | None,
        stdin: str | None,
        merge_stderr: bool,
        hint: str | None,
    ) -> LocalProcess:
        """Start ``command`` in a new process group; ToolFailed (exit code 127) when it cannot start."""
        try:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=child_env(env),
                text=True,
                errors="replace",
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            raise ToolFailed(
                f"{Path(command[0]).name} could not be started: {error.strerror or error}",
                command=command,
                returncode=127,
                tail=[],
                hint=hint or f"check that {command[0]} exists and is executable",
            ) from None
        if stdin is not None and process.stdin is not None:
            # From a thread: a command that never reads a large input must not block the timeout.
            threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True).start()
        return LocalProcess(process)


LOCAL = LocalProcessRunner()
"""The runner for this host: the default of every function that starts a process."""
