"""The SSH layer: one host's connection (host keys checked, key authentication only), a process runner on it,
sha256-verified file transfer, local port forwards, and host addresses as users write them.

``connection`` opens and checks the connection, ``runner`` runs commands over it (the
:class:`~llamaforge.runners.process.ProcessRunner` loop with SSH hooks), ``transfer`` moves files over its SFTP
session, ``forward`` forwards a local port through it and ``hosts`` parses ``user@host:port`` lists. Callers
import the names below from ``llamaforge.runners.ssh``.
"""

from llamaforge.runners.ssh.connection import (
    DEFAULT_KNOWN_HOSTS,
    HostKeyChanged,
    HostKeyUnknown,
    SshError,
    SshHost,
    connect_failure,
)
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.runners.ssh.hosts import parse_host, parse_hosts
from llamaforge.runners.ssh.runner import SshChannelProcess, SshProcessRunner
from llamaforge.runners.ssh.transfer import TransferResult, file_sha256

__all__ = [
    "DEFAULT_KNOWN_HOSTS",
    "HostKeyChanged",
    "HostKeyUnknown",
    "SshChannelProcess",
    "SshError",
    "SshHost",
    "SshProcessRunner",
    "TransferResult",
    "connect_failure",
    "file_sha256",
    "forward_local",
    "parse_host",
    "parse_hosts",
]
