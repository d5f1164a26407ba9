"""The SSH process runner: the :class:`~llamaforge.runners.process.ProcessRunner` protocol on a remote host,
over a Fabric ``Connection``, plus sha256-verified, resumable file transfer.

Secure by default. Fabric 3 builds its paramiko client with ``AutoAddPolicy`` and never loads known_hosts, so
before the first command this runner loads the host's own known_hosts file (an inventory's) and the user's
``~/.ssh/known_hosts``, and replaces the policy: an unknown host is refused with its SHA256 fingerprint
(paramiko's ``RejectPolicy`` with a message that says what to do), a key that differs from a recorded one is
refused naming both fingerprints, whatever the policy. ``accept_new_host_keys=True`` is OpenSSH's
``StrictHostKeyChecking=accept-new``: a host never seen before is recorded, a changed key is still refused.
Authentication is by key only (a key file or the agent); no password is accepted, sent, logged or shown.

Commands: argv is quoted with :func:`shlex.join` for the remote shell. ``env`` never reaches a command line:
the remote command starts with a fixed bootstrap that reads ``export NAME='value'`` statements from the
channel's stdin (their byte count first, then exactly that many bytes with ``dd``) and ``eval``\\ s them, so the
values exist only in the shell's memory and the command's environment, never in any process's argv. The
bootstrap also writes the shell's pid (the session's process group, as sshd starts each command with
``setsid``) as the first stderr line; a timeout, cancel or :meth:`SshProcessHandle.terminate` signals that
group on the host, so nothing keeps running there. Each host gets its own runner: a rollout loops over
hosts itself and never uses Fabric's ``SerialGroup``/``ThreadingGroup``, which run every host even after
one failed.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import re
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from llamaforge.core.errors import InvalidOption, LlamaforgeError, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.runners.process import (
    TAIL_LINES,
    LineCallback,
    OutputHandle,
    ProcessResult,
    _check_argv,
    _masker,
    _Output,
    _secrets,
)
from llamaforge.runners.transfer import Transfer, TransferResult

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Prints the process group's id, then reads the exported variables from stdin (see the module docstring).
_PID_LINE = 'printf "%s\\n" "$$" >&2'
_READ_ENV = 'IFS= read -r n && eval "$(dd bs=1 count="$n" 2>/dev/null)"'


class SshError(LlamaforgeError):
    """An SSH host cannot be reached, refuses the key, or presents a host key that is not trusted."""

    exit_code = 14


class HostKeyUnknown(SshError):
    """The host's key is in no known_hosts file and new keys are not accepted."""


class HostKeyChanged(SshError):
    """The host presents a key different from the one recorded for it."""


@dataclass(frozen=True)
class SshHost:
    """How to reach one host: address, port, user, key file and its own known_hosts file (an inventory's)."""

    host: str
    port: int = 22
    user: str | None = None
    key_file: Path | None = None
    known_hosts: Path | None = None

    @property
    def known_hosts_name(self) -> str:
        """The host's name in known_hosts files (``[host]:port`` off port 22, as OpenSSH writes it)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def address(self) -> str:
        """``user@host:port`` for messages."""
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


def _keygen_hint(host: SshHost) -> str:
    port = f" -p {host.port}" if host.port != 22 else ""
    return f"ssh-keyscan{port} {host.host} | ssh-keygen -lf -"


class _RefuseUnknown:
    """paramiko's RejectPolicy, with the fingerprint and the next step in the error."""

    def __init__(self, host: SshHost) -> None:
        self.host = host

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        raise HostKeyUnknown(
            f"host key of {self.host.host}:{self.host.port} is unknown ({key.get_name()} {key.fingerprint}); "
            "refusing to connect",
            hint=(
                "check the fingerprint with the host's administrator (on the host: "
                "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`; from here: "
                f"`{_keygen_hint(self.host)}`), then add it to known_hosts or connect once with "
                "--accept-new-host-keys"
            ),
        )


class _AcceptNew:
    """OpenSSH's accept-new: record a never-seen host's key in ``path`` (mode 0600) and go on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as known:
            self.path.chmod(0o600)
            known.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


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


def remote_command(argv: Sequence[str], *, env: bool, cwd: str | None) -> str:
    """The command line the remote shell runs for ``argv`` (no secret ever appears in it)."""
    steps = [_PID_LINE]
    if env:
        steps.append(_READ_ENV)
    if cwd is not None:
        steps.append(f"cd -- {shlex.quote(cwd)}")
    steps.append(f"exec {shlex.join(argv)}")
    return " && ".join(steps)


class SshProcessHandle(OutputHandle):
    """A process started on the host by :meth:`SshProcessRunner.start`; its output read by a thread."""

    def __init__(self, runner: SshProcessRunner, channel: Any, command: list[str], pid: int,
                 output: _Output, cleanup: Any) -> None:  # fmt: skip
        super().__init__(output)
        self._runner = runner
        self._channel = channel
        self._cleanup = cleanup
        self.argv = command
        self.pid = pid

    def poll(self) -> int | None:
        """The exit code, or None while the process runs (-1: ended by a signal)."""
        if not self._channel.exit_status_ready():
            return None
        return int(self._channel.recv_exit_status())

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the exit code; None when ``timeout_s`` passed first."""
        if not self._channel.status_event.wait(timeout_s):
            return None
        self._finish()
        return int(self._channel.recv_exit_status())

    def terminate(self, grace_s: float = 5.0) -> int:
        """Stop the process group on the host (SIGTERM, SIGKILL after ``grace_s``); returns its exit code."""
        if self.poll() is None and grace_s > 0:
            self._runner.kill(self.pid, "TERM")
            self._channel.status_event.wait(grace_s)
        if self.poll() is None:
            self._runner.kill(self.pid, "KILL")
        self._channel.status_event.wait(10.0)
        self._finish()
        code = self.poll()
        return -1 if code is None else code

    def _finish(self) -> None:
        self.wait_output()
        self._channel.close()
        self._cleanup()


class SshProcessRunner:
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
        """The open ``fabric.Connection``, host key checked (connects on first use)."""
        with self._lock:
            if self._connection is None:
                self._connection = self._connect()
            return self._connection

    def _connect(self) -> Any:
        import paramiko
        from fabric import Connection

        host = self.host
        connect_kwargs: dict[str, Any] = {"allow_agent": True, "look_for_keys": host.key_file is None}
        if host.key_file is not None:
            connect_kwargs["key_filename"] = [str(host.key_file)]
        connection = Connection(
            host.host, user=host.user, port=host.port, connect_timeout=max(1, round(self.connect_timeout_s)),
            connect_kwargs=connect_kwargs,
        )  # fmt: skip
        client = connection.client
        # Inventory first: its entries win when both files know the host.
        for path in (host.known_hosts, self.user_known_hosts):
            if path is not None and path.is_file():
                client.load_system_host_keys(str(path))
        record = host.known_hosts or self.user_known_hosts
        if self.accept_new_host_keys:
            if record is None:
                raise InvalidOption(
                    "accepting new host keys needs a known_hosts file to record them in",
                    hint="give the host (or inventory) a known_hosts file",
                )
            client.set_missing_host_key_policy(_AcceptNew(record))
        else:
            client.set_missing_host_key_policy(_RefuseUnknown(host))
        try:
            connection.open()
        except paramiko.BadHostKeyException as error:
            connection.close()
            raise HostKeyChanged(
                f"host key of {host.host}:{host.port} has CHANGED: it presents {error.key.get_name()} "
                f"{error.key.fingerprint}, but known_hosts records {error.expected_key.get_name()} "
                f"{error.expected_key.fingerprint}; refusing to connect (someone may be intercepting the "
                "connection, or the host was reinstalled)",
                hint=(
                    "confirm the new key with the host's administrator, then remove the old entry "
                    f"(`ssh-keygen -R '{host.known_hosts_name}'`, and from the inventory's known_hosts) and "
                    "connect again"
                ),
            ) from None
        except SshError:
            connection.close()
            raise
        except paramiko.AuthenticationException as error:
            connection.close()
            key = f"the key {host.key_file}" if host.key_file else "the agent's and the default keys"
            raise SshError(
                f"{host.address} refused {key}: {error}",
                hint="add the public key to the user's ~/.ssh/authorized_keys on the host, or load the right "
                "key into ssh-agent (passwords are never used)",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as error:
            connection.close()
            raise SshError(
                f"cannot reach {host.address}: {error or type(error).__name__}",
                hint="check that the host is up, that sshd listens on that port, and the address in the "
                "inventory",
            ) from None
        return connection

    def kill(self, pid: int, signal_name: str = "KILL") -> None:
        """Send ``signal_name`` to the remote process group ``pid`` (the process when it has no group)."""
        with contextlib.suppress(Exception):
            channel = self.connection.create_session()
            channel.exec_command(f"kill -{signal_name} -- -{pid} 2>/dev/null || kill -{signal_name} {pid}")
            channel.recv_exit_status()
            channel.close()

    def _open(self, command: list[str], env: Mapping[str, str] | None, cwd: Path | None,
              stdin: str | None, merge: bool) -> tuple[Any, int, io.TextIOWrapper]:  # fmt: skip
        """Start ``command``: the channel, the remote pid and the stream the pid line was read from."""
        channel = self.connection.create_session()
        if merge:
            channel.set_combine_stderr(True)
        channel.exec_command(remote_command(command, env=bool(env), cwd=None if cwd is None else str(cwd)))
        payload = (_env_script(env) if env else b"") + (stdin or "").encode()

        def feed() -> None:
            with contextlib.suppress(OSError, EOFError):
                if payload:
                    channel.sendall(payload)
                channel.shutdown_write()

        threading.Thread(target=feed, daemon=True).start()
        first = _text(channel, stderr=not merge)
        pid_line = first.readline().strip()
        if not pid_line.isdigit():
            code = channel.recv_exit_status()
            raise ToolFailed(
                f"{self.host.address} could not start {command[0]}", command=command, returncode=code,
                tail=[pid_line], hint="check that the user's login shell on the host is a POSIX shell",
            )  # fmt: skip
        return channel, int(pid_line), first

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
        """Run ``argv`` on the host to its end (see :meth:`ProcessRunner.run`; ``cwd`` is a host path)."""
        cancel = cancel or CancelToken()
        secrets = _secrets(env or {})
        command = _check_argv(argv, secrets)
        what = what or f"{posixpath.basename(command[0])} on {self.host.host}"
        cancel.raise_if_cancelled()
        started = time.monotonic()
        channel, pid, first = self._open(command, env, cwd, stdin, merge_stderr)
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        output = _Output(_masker(secrets), on_line, log, keep_all=False, streams=1 if merge_stderr else 2)
        out_lines: list[str] = []
        err_lines: list[str] = []
        streams = [(first, out_lines if merge_stderr else err_lines, True)]
        if not merge_stderr:
            streams.insert(0, (_text(channel, stderr=False), out_lines, False))
        readers = [threading.Thread(target=output.pump, args=stream, daemon=True) for stream in streams]
        unregister = cancel.on_cancel(lambda: self.kill(pid))
        timed_out = False
        try:
            for reader in readers:
                reader.start()
            deadline = None if timeout_s is None else started + timeout_s
            while not channel.status_event.wait(0.1):
                if deadline is not None and not timed_out and time.monotonic() > deadline:
                    timed_out = True
                    self.kill(pid)
                if cancel.cancelled:
                    break
            for reader in readers:
                reader.join(timeout=5.0 if timed_out or cancel.cancelled else None)
        except BaseException:
            self.kill(pid)
            raise
        finally:
            unregister()
            channel.close()
            if log is not None:
                with output.changed:
                    output.log = None
                log.close()
        cancel.raise_if_cancelled()
        code = int(channel.recv_exit_status()) if channel.exit_status_ready() else -1
        result = ProcessResult(
            argv=command, exit_code=code, stdout="".join(f"{line}\n" for line in out_lines),
            stderr="".join(f"{line}\n" for line in err_lines), duration_s=time.monotonic() - started,
            timed_out=timed_out,
        )  # fmt: skip
        log_name = str(log_path) if log_path is not None else None
        tail = (err_lines or out_lines)[-TAIL_LINES:]
        if timed_out and not warn:
            raise ToolFailed(
                f"{what} did not finish within {timeout_s:g} s", command=command, returncode=code, tail=tail,
                log_path=log_name, hint=hint or "raise the timeout, or give it less work",
            )  # fmt: skip
        if code != 0 and not warn:
            raise ToolFailed(
                f"{what} failed", command=command, returncode=code, tail=tail, log_path=log_name, hint=hint
            )
        return result

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        on_line: LineCallback | None = None,
        log_path: Path | None = None,
        cancel: CancelToken | None = None,
    ) -> SshProcessHandle:
        """Start ``argv`` on the host (stdout and stderr merged, no stdin) and return at once; cancellation
        kills its process group there."""
        cancel = cancel or CancelToken()
        secrets = _secrets(env or {})
        command = _check_argv(argv, secrets)
        cancel.raise_if_cancelled()
        channel, pid, merged = self._open(command, env, cwd, None, merge=True)
        log = log_path.open("a", encoding="utf-8") if log_path is not None else None
        output = _Output(_masker(secrets), on_line, log)
        unregister = cancel.on_cancel(lambda: self.kill(pid))

        def cleanup() -> None:
            unregister()
            if log is not None and not log.closed:
                with output.changed:
                    log.close()
                    output.log = None

        threading.Thread(target=output.pump, args=(merged, output.lines), daemon=True).start()
        return SshProcessHandle(self, channel, command, pid, output, cleanup)

    def sha256(self, path: str) -> str | None:
        """The sha256 of the host's file ``path`` (``sha256sum``), or None when there is no such file."""
        result = self.run(["sha256sum", "--", path], warn=True)
        if not result.ok:
            return None
        return result.stdout.split(maxsplit=1)[0]

    def put(self, local: Path, remote: str, *, cancel: CancelToken | None = None) -> TransferResult:
        """Send ``local`` to the host's ``remote`` path (see :class:`~llamaforge.runners.transfer.Transfer`)."""
        return self.transfer.put(local, remote, cancel=cancel)

    def get(self, remote: str, local: Path, *, cancel: CancelToken | None = None) -> TransferResult:
        """Fetch the host's ``remote`` file to ``local`` (see :class:`~llamaforge.runners.transfer.Transfer`)."""
        return self.transfer.get(remote, local, cancel=cancel)
