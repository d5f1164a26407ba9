"""SSH connections for the SSH runner: the host's address, host-key checking and key-only authentication.

Fabric 3 builds its paramiko client with ``AutoAddPolicy`` and never loads known_hosts (fabric issues 1804,
2071, 2138), so :func:`open_connection` loads the host's own known_hosts file (an inventory's) and the user's
``~/.ssh/known_hosts`` into the client and replaces the policy before connecting: an unknown host is refused
with its SHA256 fingerprint (paramiko's ``RejectPolicy``, with a message that says what to do next); a key
that differs from a recorded one is refused naming both fingerprints, whatever the policy. Accepting new keys
is OpenSSH's ``StrictHostKeyChecking=accept-new``: a never-seen host's key is recorded, a changed one is not.
Authentication is by key only (a key file or the agent); a password is never taken, even from Fabric's
configuration files.

A connection whose peer stops answering (a network partition, a frozen host) leaves paramiko waiting forever:
TCP keeps an unanswered connection open for many minutes, and through a port proxy never gives up at all.
:func:`keep_alive` is OpenSSH's ``ServerAliveInterval``/``ServerAliveCountMax``: a request the server must answer
every few seconds, and the transport closed after several go unanswered, so every command waiting on it ends
with a lost connection instead of hanging. ``connect_timeout_s`` bounds the SSH banner and authentication too,
not only the TCP connect (a host whose sshd is frozen accepts TCP and never speaks).

A command that a signal ended reports ``-N`` (``-4`` for SIGILL), as a local process does: sshd then sends
``exit-signal`` instead of ``exit-status`` (RFC 4254, 6.10), which paramiko drops, leaving -1;
:func:`report_exit_signals` reads it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.guard import check_ssh_host, refuse_if_read_only


class SshError(LlamaforgeError):
    """An SSH host cannot be reached, refuses the key, or presents a host key that is not trusted."""

    exit_code = ExitCode.SSH


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
    # Where the address was given ("--hosts", "the inventory PATH"), for the hints; not part of the host.
    origin: str = field(default="", compare=False)

    @property
    def known_hosts_name(self) -> str:
        """The host's name in known_hosts files (``[host]:port`` off port 22, as OpenSSH writes it)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def address(self) -> str:
        """``user@host:port`` (``user@[v6]:port``) for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"


DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
ALIVE_INTERVAL_S = 5.0  # OpenSSH's ServerAliveInterval: how often the server must answer
ALIVE_COUNT = 3  # ServerAliveCountMax: unanswered in a row before the connection counts as lost
SESSION_OPEN_TIMEOUT_S = 60.0  # how long the server may take to confirm a new session or forwarded channel


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


def open_connection(
    host: SshHost, accept_new_host_keys: bool, user_known_hosts: Path | None, connect_timeout_s: float
) -> Any:
    """An open ``fabric.Connection`` to ``host`` whose host key was checked (see the module docstring).

    Raises HostKeyUnknown, HostKeyChanged, or SshError (unreachable, key refused), each naming the host.
    """
    import paramiko
    from fabric import Connection

    check_ssh_host(host.host)
    if accept_new_host_keys:
        refuse_if_read_only(f"record {host.host}'s host key in known_hosts (accept_new_host_keys)")
    connect_kwargs: dict[str, Any] = {
        "allow_agent": True,
        "look_for_keys": host.key_file is None,
        "banner_timeout": connect_timeout_s,
        "auth_timeout": connect_timeout_s,
    }
    if host.key_file is not None:
        connect_kwargs["key_filename"] = [str(host.key_file)]
    connection = Connection(
        host.host,
        user=host.user,
        port=host.port,
        connect_timeout=max(1, round(connect_timeout_s)),
        connect_kwargs=connect_kwargs,
    )
    # Fabric's configuration files may carry a password: key authentication only, so it is dropped.
    connection.connect_kwargs.pop("password", None)
    client = connection.client
    # Inventory first: its entries win when both files know the host.
    for path in (host.known_hosts, user_known_hosts):
        if path is not None and path.is_file():
            client.load_system_host_keys(str(path))
    record = host.known_hosts or user_known_hosts
    if accept_new_host_keys:
        if record is None:
            raise InvalidOption(
                "accepting new host keys needs a known_hosts file to record them in",
                hint="give --known-hosts FILE (or known_hosts in the inventory)",
            )
        client.set_missing_host_key_policy(_AcceptNew(record))
    else:
        client.set_missing_host_key_policy(_RefuseUnknown(host))
    try:
        connection.open()
    except paramiko.BadHostKeyException as error:
        connection.close()
        also = f", and from {host.known_hosts}" if host.known_hosts else ""
        raise HostKeyChanged(
            f"host key of {host.host}:{host.port} has CHANGED: it presents {error.key.get_name()} "
            f"{error.key.fingerprint}, but known_hosts records {error.expected_key.get_name()} "
            f"{error.expected_key.fingerprint}; refusing to connect (someone may be intercepting the "
            "connection, or the host was reinstalled)",
            hint=(
                "confirm the new key with the host's administrator, then remove the old entry "
                f"(`ssh-keygen -R '{host.known_hosts_name}'`{also}) and "
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
        where = f"the address in {host.origin}" if host.origin else "its address"
        raise SshError(
            f"cannot reach {host.address}: {connect_failure(error)}",
            hint=f"check that the host is up, that sshd listens on port {host.port} there, and {where}",
        ) from None
    report_exit_signals(connection.transport)
    return connection


def connect_failure(error: BaseException) -> str:
    """Why a connection failed, in words: ``connection refused``, ``timed out``, ``name not known``, … never
    paramiko's ``[Errno None] Unable to connect`` (its error for a refusal on every address tried, which keeps
    each address's own error)."""
    per_address = getattr(error, "errors", None)  # paramiko's NoValidConnectionsError
    if isinstance(per_address, dict) and per_address:
        return "; ".join(dict.fromkeys(_failure_words(each) for each in per_address.values()))
    return _failure_words(error)


def _failure_words(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(error, TimeoutError):
        return "timed out (no answer from the host)"
    if isinstance(error, socket.gaierror):
        words = error.strerror or str(error)
        return "name not known" if "not known" in words else f"name not resolved ({words})"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]
    if isinstance(error, EOFError):
        return "the host closed the connection before SSH started"
    return str(error) or type(error).__name__


def report_exit_signals(transport: Any) -> None:
    """Give each channel of ``transport`` whose command a signal ended the exit status ``-N`` (see the module
    docstring); every other channel request goes to paramiko as before."""
    from paramiko.channel import Channel
    from paramiko.common import MSG_CHANNEL_REQUEST

    forward = Channel._handle_request  # paramiko's own handler, for every other request

    def handle_request(channel: Any, message: Any) -> None:
        start = message.packet.tell()
        if message.get_text() != "exit-signal":
            message.packet.seek(start)
            forward(channel, message)
            return
        message.get_boolean()  # want-reply: always false for exit-signal
        number = getattr(signal, f"SIG{message.get_text()}", None)
        if isinstance(number, signal.Signals):
            channel.exit_status = -number.value
            channel.status_event.set()

    # The table is paramiko's class attribute: this transport gets a copy of its own.
    transport._channel_handler_table = {
        **transport._channel_handler_table,
        MSG_CHANNEL_REQUEST: handle_request,
    }


def keep_alive(transport: Any, interval_s: float | None = None, count: int | None = None) -> threading.Thread:
    """Ask the server for an answer (``keepalive@openssh.com``, which it answers with a failure) every
    ``interval_s``; after ``count`` unanswered in a row, close ``transport`` (each channel on it ends as closed).
    Runs in a daemon thread until the transport closes; returns the thread."""
    interval = ALIVE_INTERVAL_S if interval_s is None else interval_s
    limit = ALIVE_COUNT if count is None else count

    def probe(answered: threading.Event) -> None:
        with contextlib.suppress(Exception):
            # returns on the server's answer, or when the transport closed (then nothing answered)
            transport.global_request("keepalive@openssh.com", wait=True)
            if transport.is_active():
                answered.set()

    def watch() -> None:
        missed = 0
        while transport.is_active():
            answered = threading.Event()
            threading.Thread(target=probe, args=(answered,), name="llamaforge-ssh-probe", daemon=True).start()
            if answered.wait(interval):
                missed = 0
                threading.Event().wait(interval)
                continue
            missed += 1
            if missed >= limit:
                with contextlib.suppress(Exception):
                    transport.close()
                return

    thread = threading.Thread(target=watch, name="llamaforge-ssh-alive", daemon=True)
    thread.start()
    return thread
