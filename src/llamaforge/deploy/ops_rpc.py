"""Operations ``topology.deploy``, ``topology.plan``, ``topology.status`` and ``topology.rollback``: one
model over a head and llama.cpp RPC workers (see :mod:`llamaforge.deploy.rpc`).

``topology.deploy`` and ``topology.rollback`` change hosts (destructive); the plan and the status only read. Every
input is checked before any host is reached: the workers' RPC addresses (private or loopback, never
``0.0.0.0``), the build (it has ``ggml-rpc-server``; head and workers the same), the split (it fits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from llamaforge.core.errors import ExitCode, InvalidOption, OperationFailed
from llamaforge.core.registry import OperationContext, Params, Result, operation, path_field
from llamaforge.deploy.hosts import Access, open_runners
from llamaforge.deploy.release import DEFAULT_PORT, DEFAULT_ROOT, KEEP_RELEASES, DeployRoot, Layout
from llamaforge.deploy.rpc import (
    Member,
    TopologyReport,
    TopologyStatus,
    deploy_topology,
    elapsed,
    rollback_topology,
    topology_passed,
    topology_status,
)
from llamaforge.deploy.topology import RpcWorker, parse_head, parse_workers
from llamaforge.models.ops_split import ModelSplitResult
from llamaforge.serve.launcher import DEFAULT_RPC_PORT

_DEPLOY_FAILED = ExitCode.DEPLOY  # DeployFailed's exit code (deploy.ops)


class RpcHostsParams(Params):
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
    rpc_threads: int | None = Field(None, ge=1, description="ggml-rpc-server -t (CPU workers)")
    gate_timeout_s: float | None = Field(None, gt=0, description="Seconds each gate may take")

    @model_validator(mode="before")
    @classmethod
    def _topology_file(cls, data: Any) -> Any:
        """Fill the topology from ``--topology FILE``; naming it twice is refused."""
        if not isinstance(data, dict) or not data.get("topology"):
            return data
        from llamaforge.deploy.topology_file import load_topology, topology_options

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
        return (
            Path(self.ssh_key).expanduser() if self.ssh_key else None,
            Path(self.known_hosts).expanduser() if self.known_hosts else None,
        )

    def layout(self) -> Layout:
        """The deployment's layout on every host."""
        return Layout(self.name, self.root)


class RpcDeployParams(RpcHostsParams):
    """Parameters of ``topology.deploy`` and ``topology.plan``."""

    build: str = Field(
        description="Build key (or prefix) for the head and every worker (needs ggml-rpc-server)"
    )
    worker_build: str | None = Field(
        None, description="A build key for the workers; refused unless the head's"
    )
    model: str = path_field(
        description="Model recipe, .toml, GGUF or URL, or `tiny`: the random-weight tiny qwen3 smoke model"
    )
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="llama-server's port on the head's 127.0.0.1")
    ctx: int = Field(4096, ge=1, description="Context (tokens) of each slot")
    parallel: int = Field(1, ge=1, description="Slots")
    threads: int | None = Field(None, ge=1, description="llama-server -t on the head")
    worker_memory: str | None = Field(
        None, description="Each worker's device memory, comma-separated (default: its MemAvailable, in GiB)"
    )
    head_gpu_memory: str | None = Field(None, description="The head's own GPU memory (default: no GPU)")
    tensor_split: str | None = Field(None, description="Proportions per device (default: by memory)")
    margin: str = Field("256MiB", description="Memory kept free on each device")
    keep: int = Field(KEEP_RELEASES, ge=1, description="Releases kept on each host")


@contextlib.contextmanager
def _members(
    params: RpcHostsParams,
    workers: list[RpcWorker],
    head_release: Any = None,
    worker_releases: list[Any] | None = None,
) -> Iterator[tuple[Member, list[Member]]]:
    from llamaforge.deploy.rollout import prepare_release

    key, known = params._paths()
    head = parse_head(params.head, workers, key_file=key, known_hosts=known)
    with open_runners(
        [head, *(worker.host for worker in workers)], Access(params.accept_new_host_keys)
    ) as runners:
        if head_release is None:  # status and rollback: the release objects only name layout and target
            head_release, worker_releases = _bare_releases(params, workers, prepare_release)
        assert worker_releases is not None
        yield (
            Member(runners[0], head_release),
            [
                Member(runner, release, worker.endpoint)
                for runner, release, worker in zip(runners[1:], worker_releases, workers, strict=True)
            ],
        )


def _bare_releases(params: RpcHostsParams, workers: list[RpcWorker], prepare: Any) -> tuple[Any, list[Any]]:
    from llamaforge.deploy.release import ReleaseSpec
    from llamaforge.deploy.targets import get_target
    from llamaforge.deploy.targets.rpc import RpcServerTarget

    spec = ReleaseSpec("", Path(), "", Path(), "", 0)
    layout = params.layout()
    head = prepare(spec, layout, get_target("systemd"))
    return head, [
        prepare(spec, layout, RpcServerTarget(worker.address, worker.port, params.rpc_threads))
        for worker in workers
    ]


def _worker_memory(params: RpcDeployParams, workers: list[RpcWorker]) -> list[RpcWorker]:
    """Workers with their memory: given, or each one's MemAvailable rounded down to GiB (CPU workers)."""
    if all(worker.memory_bytes for worker in workers):
        return workers
    from llamaforge.serve.fit import GiB

    with open_runners([worker.host for worker in workers], Access(params.accept_new_host_keys)) as runners:
        sizes = []
        for runner in runners:
            line = runner.run(
                ["grep", "MemAvailable", "/proc/meminfo"], what=f"reading {runner.host.address}'s memory"
            )
            sizes.append(max(1, int(line.stdout.split()[1]) * 1024 // GiB) * GiB)
    return [replace(worker, memory_bytes=size) for worker, size in zip(workers, sizes, strict=True)]


def _prepare(params: RpcDeployParams, ctx: OperationContext) -> tuple[list[RpcWorker], Any, list[Any], Any]:
    """Checks, the split plan and the releases of head and workers; no host changes."""
    from llamaforge.build.store import build_dir, find_build
    from llamaforge.deploy.ops import DeployParams, _releases
    from llamaforge.deploy.rollout import prepare_release
    from llamaforge.deploy.targets import get_target
    from llamaforge.deploy.targets.rpc import RpcServerTarget
    from llamaforge.deploy.topology import check_builds, check_rpc_build
    from llamaforge.serve.fit import Settings, parse_size
    from llamaforge.serve.split import SplitDevice, parse_tensor_split, plan_split

    workers = params.workers(params.worker_memory)
    head_key = str(find_build(params.build)["key"])
    worker_key = str(find_build(params.worker_build)["key"]) if params.worker_build else head_key
    check_builds(params.head, head_key, {worker.host.address: worker_key for worker in workers})
    check_rpc_build(head_key, build_dir(head_key))
    parse_head(params.head, workers)
    workers = _worker_memory(params, workers)
    head_params = DeployParams(
        hosts=params.head,
        build=head_key,
        model=params.model,
        port=params.port,
        name=params.name,
        root=params.root,
    )
    head = _releases(head_params, head_params.host_list(), ctx)[0]
    devices = [
        SplitDevice(f"RPC {worker.endpoint}", worker.memory_bytes or 0, worker.endpoint) for worker in workers
    ]
    if params.head_gpu_memory:
        devices.append(SplitDevice("head GPU0", parse_size(params.head_gpu_memory)))
    plan = plan_split(
        head.spec.model,
        devices,
        Settings(params.ctx, params.parallel),
        tensor_split=parse_tensor_split(params.tensor_split) if params.tensor_split else None,
        margin_bytes=parse_size(params.margin),
    )
    flags = _plan_flags(plan.flags, params.threads)
    spec = replace(head.spec, flags=flags)
    head = prepare_release(spec, params.layout(), get_target("systemd"), head.checks, probe=head.probe)
    worker_spec = replace(
        spec, model=Path(), model_sha256="", model_size=0, port=params.rpc_port, flags=type(flags)()
    )
    releases = [
        prepare_release(
            worker_spec,
            params.layout(),
            RpcServerTarget(worker.address, worker.port, params.rpc_threads),
            probe=head.probe,
        )
        for worker in workers
    ]
    pairs = [
        {"endpoint": worker.endpoint, "release": release.id}
        for worker, release in zip(workers, releases, strict=True)
    ]
    # what a rollback pairs the head with, and what the plan expected on each device (smoke compares it)
    head = replace(head, record={**head.record, "rpc_workers": pairs, "rpc_split": _split_rows(plan)})
    return workers, head, releases, plan


def _plan_flags(flags: tuple[str, ...], threads: int | None) -> Any:
    """The split plan's flags as :class:`LlamaFlags` (the same text llama-server gets)."""
    from llamaforge.serve.launcher import LlamaFlags

    values = dict(zip(flags[::2], flags[1::2], strict=False))
    return LlamaFlags(
        n_gpu_layers=int(values["-ngl"]),
        ctx=int(values["-c"]),
        parallel=int(values["--parallel"]),
        cache_type_k=values["-ctk"],
        cache_type_v=values["-ctv"],
        flash_attn=values["-fa"],  # type: ignore[arg-type]
        fit="off",
        threads=threads,
        rpc=tuple(values["--rpc"].split(",")),
        log_verbosity=int(values["-lv"]),
        tensor_split=tuple(float(part) for part in values["-ts"].split(",")),
    )


def _split_rows(plan: Any) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {
            "device": share.name,
            "endpoint": share.endpoint,
            "layers": share.layer_range,
            "output": share.output,
            "weights": share.memory.weights,
            "kv_cache": share.memory.kv_cache,
            "compute": share.memory.compute,
            "bytes": share.memory.total,
            "fits": share.fits,
        }
        for share in plan.devices
    ]
    host = plan.head_host
    rows.append(
        {
            "device": "head",
            "endpoint": None,
            "layers": "-",
            "output": False,
            "weights": host.weights,
            "kv_cache": host.kv_cache,
            "compute": host.compute,
            "bytes": host.total,
            "fits": True,
        }
    )
    return rows


def _options(params: RpcHostsParams, ctx: OperationContext, **more: Any) -> Any:
    from llamaforge.deploy.rollout import RolloutOptions

    return RolloutOptions(
        gate_timeout_s=params.gate_timeout_s, reporter=ctx.reporter, cancel=ctx.cancel, **more
    )


def _failed(what: str, report: TopologyReport) -> OperationFailed:
    bad = [
        f"{host.host} {host.status}"
        for host in [*report.workers, report.head]
        if host.status not in ("updated", "unchanged", "rolled back")
    ]
    return OperationFailed(
        f"{what} did not finish on every host: " + ", ".join(bad),
        result=report,
        exit_code=_DEPLOY_FAILED,
        hint="the report says where each host was left and why",
    )


@operation("topology.deploy", RpcDeployParams, read_only=False, destructive=True, long_running=True)
def deploy_rpc_op(params: RpcDeployParams, ctx: OperationContext) -> TopologyReport:
    """Deploy one model over RPC workers and a head: workers first (RPC HELLO), then the head (health + completion)."""
    import time

    started = time.monotonic()
    workers, head_release, worker_releases, plan = _prepare(params, ctx)
    if not plan.fits:
        short = ", ".join(share.name for share in plan.devices if not share.fits)
        raise OperationFailed(
            f"the split does not fit on {short}",
            result=_plan_result(plan),
            exit_code=ExitCode.DOES_NOT_FIT,
            hint="add a worker, give --tensor-split, or lower --ctx",
        )
    with _members(params, workers, head_release, worker_releases) as (head, members):
        worker_reports, head_report = deploy_topology(head, members, _options(params, ctx, keep=params.keep))
    report = TopologyReport(
        name=params.name,
        head=head_report,
        workers=worker_reports,
        flags=list(plan.flags),
        split=_split_rows(plan),
        passed=topology_passed(worker_reports, head_report),
        wall_s=elapsed(started),
    )
    if not report.passed:
        raise _failed(f"topology.deploy of {head_release.id}", report)
    return report


def _plan_result(plan: Any) -> ModelSplitResult:
    return ModelSplitResult.model_validate(plan.to_json())


@operation("topology.plan", RpcDeployParams, read_only=True)
def deploy_rpc_plan_op(params: RpcDeployParams, ctx: OperationContext) -> ModelSplitResult:
    """The split plan of a topology deploy (blocks and memory per worker, the head's flags); nothing changes."""
    _workers, _head, _releases, plan = _prepare(params, ctx)
    return _plan_result(plan)


@operation("topology.status", RpcHostsParams, read_only=True)
def deploy_rpc_status_op(params: RpcHostsParams, ctx: OperationContext) -> TopologyStatus:
    """The head (release, /health) and each worker (RPC server unit, build, reachable from the head)."""
    with _members(params, params.workers()) as (head, members):
        status = topology_status(head, members)
    if not status.healthy:
        raise OperationFailed(
            f"topology {params.name} is not serving: {status.detail}",
            result=status,
            exit_code=_DEPLOY_FAILED,
            hint="restart the worker named, then check again",
        )
    return status


class RpcRollbackParams(RpcHostsParams):
    """Parameters of ``topology.rollback``."""

    release: str | None = Field(
        None, description="The head's release to go back to (default: its previous one)"
    )


@operation("topology.rollback", RpcRollbackParams, read_only=False, destructive=True, long_running=True)
def deploy_rpc_rollback_op(params: RpcRollbackParams, ctx: OperationContext) -> TopologyReport:
    """Put every worker, then the head, back on its previous release, each gated."""
    import time

    started = time.monotonic()
    with _members(params, params.workers()) as (head, members):
        worker_reports, head_report = rollback_topology(head, members, params.release, _options(params, ctx))
    report = TopologyReport(
        name=params.name,
        head=head_report,
        workers=worker_reports,
        flags=[],
        passed=topology_passed(worker_reports, head_report, rollback=True),
        wall_s=elapsed(started),
    )
    if not report.passed:
        raise _failed("topology.rollback", report)
    return report


class RpcSmokeParams(RpcHostsParams):
    """Parameters of ``topology.smoke``."""

    single_host: str | None = Field(None, description="A host serving the same model alone (user@host:port)")
    single_name: str | None = Field(None, description="The single host's deployment name")
    n_predict: int = Field(32, ge=1, description="Tokens each timed completion generates")
    runs: int = Field(3, ge=1, le=20, description="Timed completions per server")


class RpcSmokeReport(Result):
    """The head's greedy tokens and tok/s beside a single host's, and each device's buffers: planned vs
    allocated (llama.cpp's load log on the head)."""

    name: str
    head: dict[str, Any]
    single: dict[str, Any] | None
    same_tokens: bool | None = Field(description="The head's greedy tokens equal the single host's")
    devices: list[dict[str, Any]] = Field(
        description="Per device: planned and allocated weights, kv_cache and compute bytes"
    )


def _serve_figures(runner: Any, port: int, params: RpcSmokeParams) -> dict[str, Any]:
    from llamaforge.runners.ssh.forward import forward_local
    from llamaforge.smoke.through import figures_json, measure

    with forward_local(runner, port) as local:
        return figures_json(
            measure(f"http://127.0.0.1:{local}", n_predict=params.n_predict, runs=params.runs)
        )


def _device_rows(planned: list[dict[str, Any]], allocated: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    by_endpoint = {
        name.partition("[")[2].rstrip("]"): sizes for name, sizes in allocated.items() if "[" in name
    }
    rows = []
    for row in planned:
        got = (
            allocated.get("head", {})
            if row["device"] == "head"
            else by_endpoint.get(str(row["endpoint"]), {})
        )
        kinds = ("weights", "kv_cache", "compute")
        rows.append(
            {
                "device": row["device"],
                "layers": row["layers"],
                **{f"planned_{kind}": row[kind] for kind in kinds},
                **{f"allocated_{kind}": got.get(kind, 0) for kind in kinds},
            }
        )
    return rows


@operation("topology.smoke", RpcSmokeParams, read_only=True)
def deploy_rpc_smoke_op(params: RpcSmokeParams, ctx: OperationContext) -> RpcSmokeReport:
    """Smoke a topology through its head: greedy tokens and tok/s beside a single host, buffers per device."""
    from llamaforge.deploy.hosts import parse_host
    from llamaforge.deploy.remote import host_state
    from llamaforge.smoke.through import load_log_devices

    with _members(params, params.workers()) as (head, _workers):
        layout = head.release.layout
        record = host_state(head.runner, layout).record or {}
        figures = _serve_figures(head.runner, int(record.get("port", DEFAULT_PORT)), params)
        allocated = load_log_devices(head.release.target.logs(head.runner, layout, lines=5000))
    single = None
    if params.single_host:
        key, known = params._paths()
        host = parse_host(params.single_host, key_file=key, known_hosts=known, origin="--single-host")
        with open_runners([host], Access(params.accept_new_host_keys)) as (runner,):
            other = host_state(runner, Layout(params.single_name or params.name, params.root)).record or {}
            single = _serve_figures(runner, int(other.get("port", DEFAULT_PORT)), params)
    return RpcSmokeReport(
        name=params.name,
        head=figures,
        single=single,
        same_tokens=figures["tokens"] == single["tokens"] if single else None,
        devices=_device_rows(list(record.get("rpc_split") or []), allocated),
    )
