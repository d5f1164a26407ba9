"""Host addresses as users write them: ``[user@]host[:port]`` and comma-separated lists of them, parsed into
:class:`~llamaforge.runners.ssh.connection.SshHost` (for deploy hosts, RPC workers and build hosts alike)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.runners.ssh.connection import SshHost


def parse_host(
    text: str, *, key_file: Path | None = None, known_hosts: Path | None = None, origin: str = ""
) -> SshHost:
    """``[user@]host[:port]`` as an :class:`SshHost` (port 22 when none is given); ``origin`` names the option
    it came from in hints (``--hosts``)."""
    user, _, rest = text.strip().rpartition("@")
    host, port = rest, 22
    if rest.count(":") == 1:
        host, _, raw = rest.partition(":")
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise InvalidOption(f"host {text!r} has no valid port", hint="write hosts as user@host:port")
        port = int(raw)
    if not host:
        raise InvalidOption(
            f"host {text!r} names no host", hint="write hosts as user@host:port,user@host:port"
        )
    return SshHost(host, port, user or None, key_file, known_hosts, origin=origin)


def parse_hosts(
    spec: str | Sequence[str],
    *,
    key_file: Path | None = None,
    known_hosts: Path | None = None,
    origin: str = "",
) -> list[SshHost]:
    """Every host of a comma-separated list (or of a list of such), in order; duplicates are refused."""
    items = [spec] if isinstance(spec, str) else list(spec)
    hosts = [
        parse_host(part, key_file=key_file, known_hosts=known_hosts, origin=origin)
        for item in items
        for part in item.split(",")
        if part.strip()
    ]
    if not hosts:
        raise InvalidOption("no hosts given", hint="--hosts user@host:port,user@host:port")
    addresses = [host.address for host in hosts]
    duplicates = sorted({address for address in addresses if addresses.count(address) > 1})
    if duplicates:
        raise InvalidOption(f"hosts given twice: {', '.join(duplicates)}", hint="name each host once")
    return hosts
