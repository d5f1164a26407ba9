"""The hosts of a deploy: ``user@host:port,...`` parsed into :class:`SshHost` (or an inventory's hosts, see
:mod:`~llamaforge.deploy.inventory`) as :class:`DeployHost`, one SSH runner each."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh_connection import DEFAULT_KNOWN_HOSTS, SshHost


def parse_host(text: str, *, key_file: Path | None = None, known_hosts: Path | None = None,
               origin: str = "") -> SshHost:  # fmt: skip
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


def parse_hosts(spec: str | Sequence[str], *, key_file: Path | None = None,
                known_hosts: Path | None = None, origin: str = "") -> list[SshHost]:  # fmt: skip
    """Every host of a comma-separated list (or of a list of such), in order; duplicates are refused."""
    items = [spec] if isinstance(spec, str) else list(spec)
    hosts = [parse_host(part, key_file=key_file, known_hosts=known_hosts, origin=origin)
             for item in items for part in item.split(",") if part.strip()]  # fmt: skip
    if not hosts:
        raise InvalidOption("no hosts given", hint="--hosts user@host:port,user@host:port")
    addresses = [host.address for host in hosts]
    duplicates = sorted({address for address in addresses if addresses.count(address) > 1})
    if duplicates:
        raise InvalidOption(f"hosts given twice: {', '.join(duplicates)}", hint="name each host once")
    return hosts


@dataclass(frozen=True)
class DeployHost:
    """One host of a deploy: how to reach it, its name in reports, its GPU (for the fit plan) and labels."""

    ssh: SshHost
    name: str
    gpu: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def deploy_hosts(hosts: Sequence[SshHost]) -> list[DeployHost]:
    """``--hosts`` given as addresses: each named by its address, no GPU known."""
    return [DeployHost(ssh=host, name=host.address) for host in hosts]


@dataclass(frozen=True)
class Access:
    """How every host is reached: whether new host keys are recorded, and the user's known_hosts."""

    accept_new_host_keys: bool = False
    user_known_hosts: Path | None = DEFAULT_KNOWN_HOSTS
    connect_timeout_s: float = 15.0


@contextlib.contextmanager
def open_runners(hosts: Sequence[SshHost], access: Access) -> Iterator[list[SshProcessRunner]]:
    """One runner per host (each connects on first use), all closed when the block ends."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(SshProcessRunner(host, accept_new_host_keys=access.accept_new_host_keys,
                                                    user_known_hosts=access.user_known_hosts,
                                                    connect_timeout_s=access.connect_timeout_s))
               for host in hosts]  # fmt: skip
