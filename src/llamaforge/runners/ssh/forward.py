"""A local port forwarded to a port on an SSH host's loopback, through the runner's own connection.

Fabric's ``Connection.forward_local`` needs a local port chosen in advance (a race with other processes) and
its listener thread dies on the first refused ``direct-tcpip`` channel, which is the normal answer while a
server is still starting. Here the kernel picks the local port, a refused channel only closes that one local
connection (the client sees a reset and may try again) and the listener keeps running. Only 127.0.0.1 is
bound on this side; the host's port is reached on its own loopback, so nothing is opened to any network.

paramiko logs every refused channel as an error (``Secsh channel 3 open FAILED: Connection refused: Connect
failed``), which Python prints on stderr when nothing configured logging: a health gate polling a starting
server printed it dozens of times. :func:`forward_local` drops exactly those records; every other record of
paramiko's goes on as before.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from llamaforge.runners.ssh.connection import SESSION_OPEN_TIMEOUT_S

if TYPE_CHECKING:
    from llamaforge.runners.ssh.runner import SshProcessRunner

_LOOPBACK = "127.0.0.1"
_TRANSPORT_LOGGER = "paramiko.transport"


class _ExpectedRefusals(logging.Filter):
    """Drops paramiko's record of a channel the host refused to connect (nothing listens there yet): the
    forward's caller sees the refusal as a reset connection and asks again."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Secsh channel ") and "open FAILED: Connection refused" in message)


def _quiet_expected_refusals() -> None:
    logger = logging.getLogger(_TRANSPORT_LOGGER)
    if not any(isinstance(each, _ExpectedRefusals) for each in logger.filters):
        logger.addFilter(_ExpectedRefusals())


def _pump(local: socket.socket, channel: Any, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes."""
    try:
        while not stop.is_set():
            ready, _, _ = select.select([local, channel], [], [], 0.2)
            if local in ready:
                data = local.recv(65536)
                if not data:
                    break
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(65536)
                if not data:
                    break
                local.sendall(data)
    except OSError:
        pass
    finally:
        channel.close()
        local.close()


@contextlib.contextmanager
def forward_local(runner: SshProcessRunner, remote_port: int, remote_host: str = _LOOPBACK) -> Iterator[int]:
    """Forward a free port on this side's 127.0.0.1 to ``remote_host:remote_port`` as seen from the host (its
    loopback by default); yields the local port. Every forwarded connection ends when the block does."""
    _quiet_expected_refusals()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((_LOOPBACK, 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()
    pumps: list[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                local, origin = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                # the runner's connection as it is now: after a lost one, the one it opened again
                channel = runner.connection.transport.open_channel(
                    "direct-tcpip", (remote_host, remote_port), origin, timeout=SESSION_OPEN_TIMEOUT_S
                )
            except Exception:  # noqa: BLE001 - refused on the host (nothing listens yet): drop this one
                local.close()
                continue
            pump = threading.Thread(target=_pump, args=(local, channel, stop), daemon=True)
            pump.start()
            pumps.append(pump)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        acceptor.join(timeout=2)
        listener.close()
        for pump in pumps:
            pump.join(timeout=2)
