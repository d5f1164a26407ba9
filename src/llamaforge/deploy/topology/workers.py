"""A topology: one head (llama-server ``--rpc``) and llama.cpp RPC workers (``ggml-rpc-server``), and the rules
it must keep before anything starts.

* Every worker binds the private address the topology names for it. ggml-rpc has no authentication (upstream:
  "never expose the RPC server to an open network"), so an unspecified address (``0.0.0.0``, ``::``) and any
  public address are refused; only private (RFC 1918, ULA, link-local) and loopback addresses pass.
* Head and workers run the same build: the RPC protocol refuses mismatched ends at its HELLO, but only once the
  head loads; here a mismatch is refused before any host changes, naming each host and its build.
* The build has the RPC server (``ggml-rpc-server``, a build with ``GGML_RPC=ON``).

:func:`rpc_hello` speaks the protocol's own handshake (command 14) so a worker's gate and status see the
protocol version it answers with.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.runners.ssh import parse_host, parse_hosts
from llamaforge.runners.ssh.connection import SshHost
from llamaforge.serve.launcher import DEFAULT_RPC_PORT

RPC_SERVER = "ggml-rpc-server"  # the RPC server's target and binary at b11312 (tools/rpc)
RPC_CMD_HELLO = 14
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE (ggml-rpc/transport.h)
_SCOPE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")  # an interface name (IFNAMSIZ 16) or index


class BuildMismatch(LlamaforgeError):
    """The head and a worker would run different builds, or the build has no RPC server."""

    exit_code = ExitCode.BUILD_MISMATCH


#: Why an RPC worker has an IPv4 address: the pinned llama.cpp's rpc-server binds and its client connects with
#: AF_INET only (ggml-rpc/transport.cpp), and ``--rpc`` splits ``host:port`` at the first ':' (an IPv6
#: endpoint aborts the head: "Failed to parse endpoint").
RPC_IPV4_ONLY = (
    "llama.cpp's RPC backend speaks IPv4 only (its server binds, and the head connects, over IPv4)"
)
IPV4_HINT = "give the worker's private IPv4 address, e.g. 10.0.0.2"


@dataclass(frozen=True)
class RpcWorker:
    """One worker: how it is reached over SSH, and the private address and port its RPC server binds."""

    host: SshHost
    address: str
    port: int = DEFAULT_RPC_PORT
    memory_bytes: int | None = None

    @property
    def endpoint(self) -> str:
        """``address:port`` as the head's ``--rpc`` names it."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def check_rpc_address(address: str, *, worker: str) -> str:
    """``address`` when it is a private or loopback IP address (an IPv6 one may carry a scope id that is a
    plain interface name or number: ``fe80::2%eth1``); InvalidOption naming ``worker`` otherwise."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        raise InvalidOption(
            f"RPC address {address!r} of worker {worker} is not an IP address",
            hint="give the worker's private address (e.g. 10.0.0.2): a name could resolve to a public one",
        ) from None
    scope = ip.scope_id if isinstance(ip, ipaddress.IPv6Address) else None
    # Python takes anything after '%' (a newline, a space, '$'); the address reaches the head's unit and status
    if scope is not None and not _SCOPE_ID.fullmatch(scope):
        raise InvalidOption(
            f"RPC address {address!r} of worker {worker} has a scope id that is no interface name",
            hint="write the scope as the interface's name or index (fe80::2%eth1, fe80::2%3), or leave it out",
        )
    if isinstance(ip, ipaddress.IPv6Address):
        raise InvalidOption(
            f"RPC address {address} of worker {worker} is IPv6: {RPC_IPV4_ONLY}", hint=IPV4_HINT
        )
    if ip.is_unspecified:
        raise InvalidOption(
            f"RPC address {address} of worker {worker} would listen on every network",
            hint="the RPC server has no authentication: bind it to the worker's private address",
        )
    if not (ip.is_private or ip.is_loopback or ip.is_link_local):
        raise InvalidOption(
            f"RPC address {address} of worker {worker} is public",
            hint="the RPC server has no authentication and must never be reachable from an open network: give "
            "an address on a private network (10/8, 172.16/12, 192.168/16, fc00::/7)",
        )
    return str(ip)


def parse_workers(
    hosts: str,
    addresses: str,
    *,
    port: int = DEFAULT_RPC_PORT,
    memory: str | None = None,
    key_file: Path | None = None,
    known_hosts: Path | None = None,
) -> list[RpcWorker]:
    """The workers of ``--rpc-workers h2,h3 --rpc-addresses 10.0.0.2,10.0.0.3 [--worker-memory 24GiB,8GiB]``."""
    from llamaforge.serve.memory import parse_device_memory

    ssh = parse_hosts(hosts, key_file=key_file, known_hosts=known_hosts, origin="--rpc-workers")
    binds = [part.strip() for part in addresses.split(",") if part.strip()]
    if len(binds) != len(ssh):
        raise InvalidOption(
            f"{len(ssh)} RPC workers but {len(binds)} RPC addresses",
            hint="give each worker the private address its RPC server binds, in the same order",
        )
    sizes: list[int | None] = [None] * len(ssh)
    if memory:
        parts = [part.strip() for part in memory.split(",") if part.strip()]
        if len(parts) != len(ssh):
            raise InvalidOption(
                f"{len(ssh)} RPC workers but {len(parts)} memory sizes",
                hint="one size per worker (its GPU memory, or RAM for a CPU worker)",
            )
        sizes = [parse_device_memory(part, "worker memory") for part in parts]
    workers = [
        RpcWorker(host, check_rpc_address(bind, worker=host.address), port, size)
        for host, bind, size in zip(ssh, binds, sizes, strict=True)
    ]
    endpoints = [worker.endpoint for worker in workers]
    twice = sorted({endpoint for endpoint in endpoints if endpoints.count(endpoint) > 1})
    if twice:
        raise InvalidOption(f"RPC endpoints given twice: {', '.join(twice)}", hint="one address per worker")
    return workers


def parse_head(
    text: str, workers: Sequence[RpcWorker], *, key_file: Path | None = None, known_hosts: Path | None = None
) -> SshHost:
    """The head host; refused when it is one of the workers."""
    head = parse_host(text, key_file=key_file, known_hosts=known_hosts, origin="--head")
    if any(worker.host.address == head.address for worker in workers):
        raise InvalidOption(
            f"{head.address} is both the head and a worker",
            hint="the head runs llama-server; give it no RPC server of its own",
        )
    return head


def check_builds(head: str, head_key: str, workers: Mapping[str, str | None]) -> None:
    """Refuse when a worker's build key differs from the head's (``None``: the worker runs nothing yet)."""
    other = {host: key for host, key in workers.items() if key is not None and key != head_key}
    if other:
        listed = ", ".join(f"{host} runs {key}" for host, key in other.items())
        raise BuildMismatch(
            f"head and workers must run the same build: the head {head} gets {head_key}, but {listed}",
            hint="deploy one build to the whole topology (the RPC protocol refuses mismatched ends)",
        )


def check_rpc_build(key: str, build_dir: Path) -> None:
    """Refuse a build without the RPC server."""
    if not (build_dir / "bin" / RPC_SERVER).is_file():
        raise BuildMismatch(
            f"build {key} has no {RPC_SERVER}",
            hint="build with GGML_RPC=ON and the ggml-rpc-server target (the default recipe has both)",
        )


def rpc_hello(port: int, *, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, int, int]:
    """The RPC protocol version (major, minor, patch) a server at ``host:port`` answers HELLO with.

    Request: command byte, uint64 size, the client's connection capabilities (zeros: plain TCP); response:
    uint64 size, then major, minor, patch, padding and the server's capabilities. OSError when it does not.
    """
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack("<BQ", RPC_CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
        data = b""
        while len(data) < 8 + 4 + _CONN_CAPS:
            chunk = conn.recv(64)
            if not chunk:
                raise ConnectionError("the RPC server closed the connection before answering HELLO")
            data += chunk
    (size,) = struct.unpack("<Q", data[:8])
    if size != 4 + _CONN_CAPS:
        raise ConnectionError(f"the RPC server answered HELLO with {size} bytes, not {4 + _CONN_CAPS}")
    major, minor, patch = data[8], data[9], data[10]
    return major, minor, patch
