"""The RPC worker target: ``ggml-rpc-server`` as a hardened systemd unit, one per worker of a topology.

It is the systemd target with another unit (``templates/deploy/rpc-server.service.j2``, installed as
``llamaforge-<name>-rpc.service``): the server binds the worker's private address (checked by
:func:`~llamaforge.deploy.topology.workers.check_rpc_address` before anything is rendered), keeps its tensor cache
(``-c``) in a systemd ``CacheDirectory`` that survives restarts and releases, and its gate is the RPC
protocol's own HELLO, asked on the worker through its SSH connection.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llamaforge.core.events import CancelToken
from llamaforge.core.templates import render
from llamaforge.deploy.hosts.health import GateOutcome, service_down
from llamaforge.deploy.release import SERVICE_USER, Layout, ReleaseSpec
from llamaforge.deploy.targets.systemd import SystemdTarget, check_command
from llamaforge.deploy.topology.workers import RPC_SERVER, check_rpc_address, rpc_hello
from llamaforge.runners.ssh.forward import forward_local

if TYPE_CHECKING:
    from llamaforge.runners.ssh import SshProcessRunner

RPC_UNIT_FILE = "rpc-server.service"
WORKER_GATE_S = 60.0


def rpc_unit_name(layout: Layout) -> str:
    """The worker unit's name on the host."""
    return f"llamaforge-{layout.name}-rpc.service"


def rpc_cache_dir(layout: Layout) -> str:
    """Where the worker keeps the tensors it was sent (``LLAMA_CACHE``; ggml-rpc-server adds ``rpc/``)."""
    return f"/var/cache/llamaforge-{layout.name}-rpc"


def rpc_server_argv(layout: Layout, address: str, port: int, threads: int | None) -> list[str]:
    """ggml-rpc-server's command line on the worker: from ``current/``, on ``address:port``, with its cache."""
    argv = [posixpath.join(layout.current, "bin", RPC_SERVER), "-H", address, "-p", str(port), "-c"]
    return argv + (["-t", str(threads)] if threads else [])


@dataclass(frozen=True)
class RpcServerTarget(SystemdTarget):
    """ggml-rpc-server on one worker, bound to ``address:port`` (see the module docstring)."""

    address: str = "127.0.0.1"
    port: int = 50052
    threads: int | None = None
    name = "rpc-server"
    deploys = False  # a topology's worker (topology.deploy), never deploy's --target
    renders = False
    heads_topology = False
    unit_file = RPC_UNIT_FILE

    def __post_init__(self) -> None:
        check_rpc_address(self.address, worker=f"{self.address}:{self.port}")

    def unit(self, layout: Layout) -> str:
        """``llamaforge-<name>-rpc.service``."""
        return rpc_unit_name(layout)

    def listens(self, spec: ReleaseSpec) -> tuple[str, int] | None:
        """Not checked: the worker's releases do not record its port, so its own running worker would look
        like another program (a port taken there fails the worker's HELLO gate instead)."""
        return None

    def service_files(self, spec: ReleaseSpec, layout: Layout) -> dict[str, str]:
        """The worker unit, as ``rpc-server.service`` inside the release."""
        argv = rpc_server_argv(layout, self.address, self.port, self.threads)
        check_command(argv, RPC_SERVER)
        cache = rpc_cache_dir(layout)
        # no IP restriction: the worker answers its head, whose address it is not told
        text = render(
            "deploy/rpc-server.service.j2",
            name=layout.name,
            user=SERVICE_USER,
            current=layout.current,
            root=layout.root,
            argv=argv,
            cache=cache,
            cache_name=posixpath.basename(cache),
            backend=spec.backend,
            ip_allow=[],
        )
        return {RPC_UNIT_FILE: text}

    def gate(
        self,
        runner: SshProcessRunner,
        layout: Layout,
        *,
        timeout_s: float | None = None,
        cancel: CancelToken | None = None,
    ) -> GateOutcome:
        """The service is active and answers the RPC HELLO on its address (asked on the worker, over SSH)."""
        cancel = cancel or CancelToken()
        limit = timeout_s if timeout_s is not None else WORKER_GATE_S
        started = time.monotonic()
        last = "no answer"
        with forward_local(runner, self.port, self.address) as local:
            while True:
                cancel.raise_if_cancelled()
                state = self.state(runner, layout)
                if state.restarts > 0 or state.active == "failed":
                    return service_down(
                        runner,
                        self,
                        layout,
                        state,
                        started=started,
                        service="the RPC server",
                        program=RPC_SERVER,
                    )
                try:
                    major, minor, patch = rpc_hello(local, timeout=5.0)
                    break
                except OSError as error:
                    last = str(error) or type(error).__name__
                if time.monotonic() - started > limit:
                    return GateOutcome(
                        False,
                        f"the RPC server did not answer HELLO within {limit:g} s ({last})",
                        time.monotonic() - started,
                        logs=self.logs(runner, layout),
                    )
                time.sleep(0.5)
        detail = f"RPC HELLO answered on {self.address}:{self.port} (protocol {major}.{minor}.{patch})"
        return GateOutcome(True, detail, time.monotonic() - started, completion=f"{major}.{minor}.{patch}")
