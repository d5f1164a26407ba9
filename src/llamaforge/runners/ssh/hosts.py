"""Host addresses as users write them: ``[user@]host[:port]`` (an IPv6 address as ``[addr]:port``) and
comma-separated lists of them, parsed into :class:`~llamaforge.runners.ssh.connection.SshHost` (for deploy hosts,
RPC workers and build hosts alike). What reaches SSH is checked here: a DNS name or an IP address, a login name,
a port from 1 to 65535; neither may read as an option (``-oProxyCommand=…``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.runners.ssh.connection import SshHost

_DNS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
_FORM = "write hosts as user@host:port (an IPv6 address as user@[addr]:port)"


def address_problem(value: str) -> str | None:
    """Why ``value`` is no host SSH can be given (a DNS name, an IPv4 or IPv6 address), or None."""
    if _DNS_NAME.fullmatch(value):
        return None
    try:
        ipaddress.ip_address(value)
    except ValueError:
        head, sep, tail = value.rpartition(":")
        if sep and tail.isascii() and tail.isdigit() and address_problem(head) is None:
            return f"{value!r} holds a port: give the address alone and the port apart"
        return f"{value!r} is not a DNS name or an IP address"
    return None


def user_problem(value: str) -> str | None:
    """Why ``value`` is no login name, or None."""
    if _USER.fullmatch(value):
        return None
    return f"{value!r} is not a user name (letters, digits, '.', '_' and '-', not starting with '-')"


def _split_port(rest: str, text: str) -> tuple[str, str | None]:
    """``host`` and the port's text (None when none is given) of ``host[:port]`` / ``[v6][:port]`` / ``v6``."""
    if rest.startswith("["):
        inner, closed, after = rest[1:].partition("]")
        if not closed:
            raise InvalidOption(f"host {text!r}: the bracketed address is not closed", hint=_FORM)
        if after and not after.startswith(":"):
            raise InvalidOption(f"host {text!r}: {after!r} follows the bracketed address", hint=_FORM)
        if ":" not in inner:
            raise InvalidOption(f"host {text!r}: brackets hold an IPv6 address only", hint=_FORM)
        return inner, after[1:] if after else None
    if rest.count(":") == 1:
        host, _, port = rest.partition(":")
        return host, port
    return rest, None  # a bare IPv6 address (checked below), or a host without a port


def parse_host(
    text: str, *, key_file: Path | None = None, known_hosts: Path | None = None, origin: str = ""
) -> SshHost:
    """``[user@]host[:port]`` as an :class:`SshHost` (port 22 when none is given); ``origin`` names the option
    it came from in hints (``--hosts``)."""
    user, at, rest = text.strip().rpartition("@")
    if at and not user:
        raise InvalidOption(f"host {text!r} names no user before '@'", hint=_FORM)
    if at and (problem := user_problem(user)):
        raise InvalidOption(f"host {text!r}: {problem}", hint=_FORM)
    host, raw = _split_port(rest, text)
    if not host:
        raise InvalidOption(f"host {text!r} names no host", hint=_FORM)
    if problem := address_problem(host):
        raise InvalidOption(f"host {text!r}: {problem}", hint=_FORM)
    port = 22
    if raw is not None:
        if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) < 65536:
            raise InvalidOption(f"host {text!r} has no valid port", hint=_FORM)
        port = int(raw)
    return SshHost(host, port, user or None, key_file, known_hosts, origin=origin)


def parse_hosts(
    spec: str | Sequence[str],
    *,
    key_file: Path | None = None,
    known_hosts: Path | None = None,
    origin: str = "",
) -> list[SshHost]:
    """Every host of a comma-separated list (or of a list of such), in order; a host given twice (also under
    two users or spellings of one address) is refused."""
    items = [spec] if isinstance(spec, str) else list(spec)
    hosts = [
        parse_host(part, key_file=key_file, known_hosts=known_hosts, origin=origin)
        for item in items
        for part in item.split(",")
        if part.strip()
    ]
    if not hosts:
        raise InvalidOption("no hosts given", hint="--hosts user@host:port,user@host:port")
    first: dict[tuple[str, int], SshHost] = {}
    for host in hosts:
        seen = first.setdefault(host_identity(host), host)
        if seen is not host:
            same = host.address if seen.address == host.address else f"{seen.address} and {host.address}"
            raise InvalidOption(f"hosts given twice: {same}", hint="name each host once")
    return hosts


def canonical_host(name: str) -> str:
    """A host in one spelling: an IP address as :mod:`ipaddress` writes it (``0:0::1`` is ``::1``), a name in
    lower case."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def host_identity(host: SshHost) -> tuple[str, int]:
    """What makes two hosts one machine for a deploy: the address in one spelling and the port; the login user
    does not count."""
    return canonical_host(host.host), host.port
