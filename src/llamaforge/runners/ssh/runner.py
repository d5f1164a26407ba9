"""The SSH process runner: the :class:`~llamaforge.runners.process.ProcessRunner` loop on a remote host (this
module supplies its hooks: how a command starts in a session channel, is signalled and ends), over a Fabric
``Connection`` whose host key was checked (:mod:`llamaforge.runners.ssh.connection`: unknown hosts and changed
keys refused, key authentication only), plus sha256-verified, resumable file transfer
(:mod:`llamaforge.runners.ssh.transfer`).

argv is quoted with :func:`shlex.join` for the remote shell. ``env`` never reaches a command line: the remote
command starts with a fixed bootstrap that reads ``export NAME='value'`` statements from the channel's stdin
(their byte count first, then exactly that many bytes with ``dd``) and runs them with ``eval``, so the values exist
only in the shell's memory and the command's environment, never in any process's argv; ``stdin`` follows
them on the same stream. The bootstrap also writes the shell's pid (the session's process group: sshd starts
each command with ``setsid``) as the first stderr line; a timeout, cancel or
:meth:`~llamaforge.runners.process.ProcessHandle.terminate` signals that group on the host, so nothing keeps
running there.

Each host gets its own runner: a rollout loops over hosts itself and never uses Fabric's
``SerialGroup``/``ThreadingGroup``, which run every host even after one failed.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from llamaforge.core.errors import InvalidOption, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.runners.output import TAIL_LINES
from llamaforge.runners.process import ProcessRunner, RunningProcess
from llamaforge.runners.ssh.connection import (
    DEFAULT_KNOWN_HOSTS,
    SESSION_OPEN_TIMEOUT_S,
    SshError,
    SshHost,
    keep_alive,
    open_connection,
)
from llamaforge.runners.ssh.transfer import Transfer, TransferResult

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Prints the process group's id, then reads the exported variables from stdin (see the module docstring).
_PID_MARK = "llamaforge-pid "
_PID_LINE = f'printf "{_PID_MARK}%s\\n" "$$" >&2'
_READ_ENV = 'IFS= read -r n && eval "$(dd bs=1 count="$n" 2>/dev/null)"'


class _ChannelReader(io.RawIOBase):
    """One stream of a channel (stdout or stderr) as a raw binary file, for a text wrapper."""

    def __init__(self, channel: Any, stderr: bool) -> None:
        self._recv = channel.recv_stderr if stderr else channel.recv

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._recv(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _text(channel: Any, stderr: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedReader(_ChannelReader(channel, stderr)), encoding="utf-8", errors="replace"
    )


def _env_script(env: Mapping[str, str]) -> bytes:
    for name in env:
        if not _ENV_NAME.match(name):
            raise InvalidOption(
                f"environment variable name {name!r} is not valid", hint="use [A-Za-z_][A-Za-z0-9_]*"
            )
    script = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items()).encode()
    return f"{len(script)}\n".encode() + script


def remote_command(argv: Sequence[str], *, env: bool, cwd: str | None, merge: bool = False) -> str:
    """The command line the remote shell runs for ``argv`` (no secret ever appears in it); with ``merge`` the
    command's stderr goes into its stdout pipe, so their lines keep their order."""
    steps = [_PID_LINE]
    if env:
        steps.append(_READ_ENV)
    if cwd is not None:
        steps.append(f"cd -- {shlex.quote(cwd)}")
    steps.append(f"exec {shlex.join(argv)}" + (" 2>&1" if merge else ""))
    return " && ".join(steps)


class SshChannelProcess(RunningProcess):
    """A command running on the host in a session channel of its own; ``pid`` is its process group there."""

    def __init__(self, runner: SshProcessRunner, channel: Any, pid: int, stderr: io.TextIOWrapper) -> None:
        self._runner = runner
        self._channel = channel
        self.pid = pid
        self.stdout = _text(channel, stderr=False)
        self.stderr = stderr

    def poll(self) -> int | None:
        """The exit code, or None while the command runs (-N: ended by signal N; -1: no status came)."""
        if not self._channel.exit_status_ready():
            return None
        return int(self._channel.recv_exit_status())

    def wait(self, timeout_s: float | None) -> bool:
        """Wait (at most ``timeout_s``) for the channel's exit status; True once it came."""
        return bool(self._channel.status_event.wait(timeout_s))

    def kill(self, signal_name: str = "KILL") -> None:
        """Signal the command's process group on the host."""
        self._runner.kill(self.pid, signal_name)

    def release(self) -> None:
        """Close the channel."""
        self._channel.close()


class SshProcessRunner(ProcessRunner):
    """Runs commands on one SSH host (see the module docstring); connects on first use. Close it when done
    (it is a context manager). ``user_known_hosts`` is ``~/.ssh/known_hosts`` unless given (None: not read)."""

    def __init__(
        self,
        host: SshHost,
        *,
        accept_new_host_keys: bool = False,
        user_known_hosts: Path | None = DEFAULT_KNOWN_HOSTS,
        connect_timeout_s: float = 15.0,
    ) -> None:
        self.host = host
        self.accept_new_host_keys = accept_new_host_keys
        self.user_known_hosts = user_known_hosts.expanduser() if user_known_hosts is not None else None
        self.connect_timeout_s = connect_timeout_s
        self._connection: Any = None
        self._lock = threading.Lock()
        self.transfer = Transfer(self)

    def __enter__(self) -> SshProcessRunner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (and its SFTP session); the next command opens a new one."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    @property
    def connection(self) -> Any:
        """The open ``fabric.Connection``, host key checked (connects on first use, and again after the
        connection dropped)."""
        with self._lock:
            if self._connection is not None and not self._connection.is_connected:
                self._connection.close()
                self._connection = None
            if self._connection is None:
                self._connection = open_connection(
                    self.host, self.accept_new_host_keys, self.user_known_hosts, self.connect_timeout_s
                )
                keep_alive(
                    self._connection.transport
                )  # a host that stops answering ends as a lost connection
            return self._connection

    def connection_alive(self) -> bool:
        """Whether the connection opened last is still up (False when none is open)."""
        connection = self._connection
        return (
            connection is not None and connection.transport is not None and connection.transport.is_active()
        )

    def kill(self, pid: int, signal_name: str = "KILL") -> None:
        """Send ``signal_name`` to the remote process group ``pid`` (the process when it has no group)."""
        with contextlib.suppress(Exception):
            channel = self.connection.transport.open_session(timeout=SESSION_OPEN_TIMEOUT_S)
            channel.exec_command(f"kill -{signal_name} -- -{pid} 2>/dev/null || kill -{signal_name} {pid}")
            channel.recv_exit_status()
            channel.close()

    def describe(self, command: list[str]) -> str:
        """The program's name and the host, for messages."""
        return f"{posixpath.basename(command[0])} on {self.host.host}"

    def spawn(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: Path | None,
        stdin: str | None,
        merge_stderr: bool,
        hint: str | None,
    ) -> SshChannelProcess:
        """Start ``command`` on the host (``cwd`` is a host path): its channel, with the process group's id
        read from the bootstrap's first stderr line, and stderr after that line."""
        import paramiko

        payload = (_env_script(env) if env else b"") + (stdin or "").encode()
        try:
            # paramiko waits forever for a channel the server never confirms (seen on a loaded host with
            # several threads on one transport); a bounded wait turns that into an SshError naming the host
            channel = self.connection.transport.open_session(timeout=SESSION_OPEN_TIMEOUT_S)
            channel.exec_command(
                remote_command(
                    command, env=bool(env), cwd=None if cwd is None else str(cwd), merge=merge_stderr
                )
            )
        except (paramiko.SSHException, OSError, EOFError) as error:
            self.close()
            raise SshError(
                f"{self.host.address} did not start {command[0]}: {error or type(error).__name__}",
                hint="check the host and its network (sshd's MaxSessions), then run it again",
            ) from None

        def feed() -> None:
            with contextlib.suppress(OSError, EOFError):
                if payload:
                    channel.sendall(payload)
                channel.shutdown_write()

        threading.Thread(target=feed, daemon=True).start()
        stderr = _text(channel, stderr=True)
        before: list[str] = []  # what the login shell printed first (a noisy .bashrc): dropped
        while line := stderr.readline():
            if line.startswith(_PID_MARK) and line[len(_PID_MARK) :].strip().isdigit():
                return SshChannelProcess(self, channel, int(line[len(_PID_MARK) :]), stderr)
            before.append(line.rstrip("\n"))
        code = channel.recv_exit_status()
        if not self.connection_alive():
            self.close()
            raise SshError(
                f"the connection to {self.host.address} was lost while {command[0]} started",
                hint="check the host and its network, then run it again",
            )
        raise ToolFailed(
            f"{self.host.address} could not start {command[0]}",
            command=command,
            returncode=code,
            tail=before[-TAIL_LINES:],
            hint="check that the user's login shell on the host is a POSIX shell",
        )

    def check_finished(self, command: list[str], exit_code: int, timed_out: bool) -> None:
        """A command that ended without an exit status because the connection dropped is an SshError."""
        if exit_code == -1 and not timed_out and not self.connection_alive():
            self.close()
            raise SshError(
                f"the connection to {self.host.address} was lost while {command[0]} ran; it may still be "
                "running there",
                hint="check the host and its network, then run it again",
            )

    def sha256(self, path: str) -> str | None:
        """The sha256 of the host's file ``path`` (``sha256sum``), or None when there is no such file."""
        result = self.run(["sha256sum", "--", path], warn=True)
        if not result.ok:
            return None
        return result.stdout.split(maxsplit=1)[0]

    def sha256s(self, paths: Sequence[str]) -> dict[str, str]:
        """The sha256 of each of the host's files ``paths`` that exists, by path, from one ``sha256sum``."""
        script = 'for f; do [ -f "$f" ] && sha256sum -- "$f"; done; true'
        output = self.run(["sh", "-c", script, "sh", *paths]).stdout if paths else ""
        digests = {}
        for line in output.splitlines():
            digest, _, path = line.partition("  ")
            digests[path] = digest
        return digests

    def put(self, local: Path, remote: str, *, cancel: CancelToken | None = None) -> TransferResult:
        """Send ``local`` to the host's ``remote`` path (see :class:`~llamaforge.runners.ssh.transfer.Transfer`)."""
        return self.transfer.put(local, remote, cancel=cancel)

    def get(self, remote: str, local: Path, *, cancel: CancelToken | None = None) -> TransferResult:
        """Fetch the host's ``remote`` file to ``local`` (see :class:`~llamaforge.runners.ssh.transfer.Transfer`)."""
        return self.transfer.get(remote, local, cancel=cancel)
