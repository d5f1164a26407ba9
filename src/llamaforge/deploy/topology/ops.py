"""Operations ``topology.deploy``, ``topology.plan``, ``topology.status``, ``topology.rollback`` and
``topology.smoke``: one model over a head and llama.cpp RPC workers (see :mod:`llamaforge.deploy.topology.service`).

``topology.deploy`` and ``topology.rollback`` change hosts (destructive); the plan and the status only read. Every
input is checked before any host is reached: the workers' RPC addresses (private or loopback, never
``0.0.0.0``), the build (it has ``ggml-rpc-server``; head and workers the same), the split (it fits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from llamaforge.core.errors import InvalidOption
from llamaforge.core.registry import (
    MAX_WAIT_S,
    Int32,
    OperationContext,
    Params,
    Result,
    Slots,
    operation,
    path_field,
)
from llamaforge.deploy.hosts.access import Access, ssh_files
from llamaforge.deploy.release import (
    DEFAULT_PORT,
    DEFAULT_ROOT,
    KEEP_RELEASES,
    DeployRoot,
    Layout,
    ReleaseId,
    ReleaseRequest,
)
from llamaforge.deploy.topology import service
from llamaforge.deploy.topology.orchestrate import TopologyDeployResult, TopologyStatusResult
from llamaforge.deploy.topology.workers import RpcWorker, parse_workers
from llamaforge.models.ops_split import ModelSplitResult
from llamaforge.serve.launcher import DEFAULT_RPC_PORT


class TopologyParams(Params):
    """Where a topology lives: the head, the workers with their private RPC addresses, how to reach them."""

    head: str = Field("", description="The head host (runs llama-server --rpc) as user@host:port")
    rpc_workers: str = Field(
        "", description="The RPC workers as user@host:port, comma-separated, in device order"
    )
    rpc_addresses: str = Field(
        "",
        description="Each worker's private address its RPC server binds (same order); public addresses and "
        "0.0.0.0 are refused",
    )
    topology: str | None = path_field(
        None,
        description="A TOML file whose [topology] table names the head and the workers (instead of --head, "
        "--rpc-workers, --rpc-addresses)",
    )
    rpc_port: int = Field(DEFAULT_RPC_PORT, ge=1, le=65535, description="The RPC servers' port")
    ssh_key: str | None = path_field(None, description="Private key file (default: the SSH agent)")
    known_hosts: str | None = path_field(None, description="The hosts' known_hosts file")
    accept_new_host_keys: bool = Field(False, description="Record the key of a host never seen before")
    name: str = Field("default", description="Deployment name: units llamaforge-NAME and llamaforge-NAME-rpc")
    root: DeployRoot = Field(DEFAULT_ROOT, description="Directory on the hosts that holds the deployments")
    rpc_threads: Int32 | None = Field(None, ge=1, description="ggml-rpc-server -t (CPU workers)")
    gate_timeout_s: float | None = Field(None, gt=0, le=MAX_WAIT_S, description="Seconds each gate may take")

    @model_validator(mode="before")
    @classmethod
    def _topology_file(cls, data: Any) -> Any:
        """Fill the topology from ``--topology FILE``; naming it twice is refused."""
        if not isinstance(data, dict) or not data.get("topology"):
            return data
        from llamaforge.deploy.topology.file import load_topology, topology_options

        given = [name for name in ("head", "rpc_workers", "rpc_addresses") if data.get(name)]
        if given:
            raise InvalidOption(
                f"--topology and --{given[0].replace('_', '-')} both name the topology",
                hint="give the file or the options, not both",
            )
        options = topology_options(load_topology(Path(str(data["topology"]))))
        filled = {
            name: value for name, value in options.items() if value is not None and name in cls.model_fields
        }
        return {**data, **filled}

    def workers(self, memory: str | None = None) -> list[RpcWorker]:
        """The parsed workers (addresses checked)."""
        if not (self.head and self.rpc_workers and self.rpc_addresses):
            raise InvalidOption(
                "the topology needs a head, RPC workers and their addresses",
                hint="--head H --rpc-workers H2,H3 --rpc-addresses A2,A3, or --topology FILE",
            )
        key, known = self._paths()
        return parse_workers(
            self.rpc_workers,
            self.rpc_addresses,
            port=self.rpc_port,
            memory=memory,
            key_file=key,
            known_hosts=known,
        )

    def _paths(self) -> tuple[Path | None, Path | None]:
        return ssh_files(self.ssh_key, self.known_hosts)

    def layout(self) -> Layout:
        """The deployment's layout on every host."""
        return Layout(self.name, self.root)

    def members(self, memory: str | None = None) -> service.Topology:
        """The topology as the domain service takes it (the workers parsed and checked)."""
        key, known = self._paths()
        return service.Topology(
            self.head,
            self.workers(memory),
            self.layout(),
            Access(self.accept_new_host_keys),
            self.rpc_port,
            key,
            known,
            self.rpc_threads,
            self.gate_timeout_s,
        )


class TopologyDeployParams(TopologyParams):
    """Parameters of ``topology.deploy`` and ``topology.plan``."""

    build: str = Field(
        description="Build key (or prefix) for the head and every worker (needs ggml-rpc-server)"
    )
    worker_build: str | None = Field(
        None, description="A build key for the workers; refused unless the head's"
    )
    model: str = path_field(
        description="Model recipe, .toml, GGUF or URL, or `tiny` (`tiny-q4_k_m`): the random-weight tiny qwen3 "
        "smoke model"
    )
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="llama-server's port on the head's 127.0.0.1")
    ctx: Int32 = Field(4096, ge=1, description="Context (tokens) of each slot")
    parallel: Slots = Field(1, description="Slots, at most 256")
    threads: Int32 | None = Field(None, ge=1, description="llama-server -t on the head")
    worker_memory: str | None = Field(
        None, description="Each worker's device memory, comma-separated (default: its MemAvailable, in GiB)"
    )
    head_gpu_memory: str | None = Field(None, description="The head's own GPU memory (default: no GPU)")
    tensor_split: str | None = Field(None, description="Proportions per device (default: by memory)")
    margin: str = Field("256MiB", description="Memory kept free on each device")
    keep: int = Field(KEEP_RELEASES, ge=1, description="Releases kept on each host")

    def split(self) -> service.SplitRequest:
        """What the topology serves and how the model is split."""
        return service.SplitRequest(
            ReleaseRequest(build=self.build, model=self.model, port=self.port),
            worker_build=self.worker_build,
            head_gpu_memory=self.head_gpu_memory,
            ctx=self.ctx,
            parallel=self.parallel,
            threads=self.threads,
            tensor_split=self.tensor_split,
            margin=self.margin,
            keep=self.keep,
        )


@operation("topology.deploy", TopologyDeployParams, read_only=False, destructive=True, long_running=True)
def deploy_rpc_op(params: TopologyDeployParams, ctx: OperationContext) -> TopologyDeployResult:
    """Deploy one model over RPC workers and a head: workers first (RPC HELLO), then the head (health + completion)."""
    return service.deploy(params.members(params.worker_memory), params.split(), ctx.reporter, ctx.cancel)


@operation("topology.plan", TopologyDeployParams, read_only=True)
def deploy_rpc_plan_op(params: TopologyDeployParams, ctx: OperationContext) -> ModelSplitResult:
    """The split plan of a topology deploy (blocks and memory per worker, the head's flags); nothing changes."""
    return service.plan(params.members(params.worker_memory), params.split(), ctx.reporter, ctx.cancel)


@operation("topology.status", TopologyParams, read_only=True)
def deploy_rpc_status_op(params: TopologyParams, ctx: OperationContext) -> TopologyStatusResult:
    """The head (release, /health) and each worker (RPC server unit, build, reachable from the head)."""
    return service.status(params.members())


class TopologyRollbackParams(TopologyParams):
    """Parameters of ``topology.rollback``."""

    release: ReleaseId | None = Field(
        None, description="The head's release to go back to (default: its previous one)"
    )


@operation("topology.rollback", TopologyRollbackParams, read_only=False, destructive=True, long_running=True)
def deploy_rpc_rollback_op(params: TopologyRollbackParams, ctx: OperationContext) -> TopologyDeployResult:
    """Put every worker, then the head, back on its previous release, each gated."""
    return service.rollback(params.members(), params.release, ctx.reporter, ctx.cancel)


class TopologySmokeParams(TopologyParams):
    """Parameters of ``topology.smoke``."""

    single_host: str | None = Field(None, description="A host serving the same model alone (user@host:port)")
    single_name: str | None = Field(None, description="The single host's deployment name")
    n_predict: Int32 = Field(32, ge=1, description="Tokens each timed completion generates")
    runs: int = Field(3, ge=1, le=20, description="Timed completions per server")


class TopologySmokeResult(Result):
    """The head's greedy tokens and tok/s beside a single host's, and each device's buffers: planned vs
    allocated (llama.cpp's load log on the head)."""

    name: str
    head: dict[str, Any]
    single: dict[str, Any] | None
    same_tokens: bool | None = Field(description="The head's greedy tokens equal the single host's")
    devices: list[dict[str, Any]] = Field(
        description="Per device: planned and allocated weights, kv_cache and compute bytes"
    )


@operation("topology.smoke", TopologySmokeParams, read_only=True)
def deploy_rpc_smoke_op(params: TopologySmokeParams, ctx: OperationContext) -> TopologySmokeResult:
    """Smoke a topology through its head: greedy tokens and tok/s beside a single host, buffers per device."""
    figures = service.smoke(
        params.members(),
        params.single_host,
        Layout(params.single_name or params.name, params.root),
        n_predict=params.n_predict,
        runs=params.runs,
    )
    return TopologySmokeResult(
        name=params.name,
        head=figures.head,
        single=figures.single,
        same_tokens=figures.head["tokens"] == figures.single["tokens"] if figures.single else None,
        devices=figures.devices,
    )
