"""What the topology operations call: the members (head and workers, each with its runner and target), the
split plan and the releases of a deploy, and deploy, status, rollback and smoke over them. Every input is
checked before any host is reached: the workers' RPC addresses, the build (it has ``ggml-rpc-server``; head and
workers the same), the split (it fits)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llamaforge.core.errors import ExitCode, OperationFailed
from llamaforge.core.events import CancelToken, Reporter
from llamaforge.deploy.hosts.access import Access, deploy_hosts, open_runners
from llamaforge.deploy.hosts.prepared import Release, prepare_release
from llamaforge.deploy.hosts.remote import host_state
from llamaforge.deploy.hosts.rollout import RolloutOptions
from llamaforge.deploy.hosts.service import host_releases
from llamaforge.deploy.release import DEFAULT_PORT, KEEP_RELEASES, Layout, ReleaseRequest
from llamaforge.deploy.report import DeployFailed
from llamaforge.deploy.targets import RolloutSettings, Target, topology_head
from llamaforge.deploy.targets.rpc_server import RpcServerTarget
from llamaforge.deploy.topology.orchestrate import (
    Member,
    TopologyDeployResult,
    TopologyStatusResult,
    deploy_topology,
    elapsed,
    rollback_topology,
    topology_passed,
    topology_status,
)
from llamaforge.deploy.topology.workers import RpcWorker, check_builds, check_rpc_build, parse_head
from llamaforge.models.ops_split import ModelSplitResult
from llamaforge.runners.ssh import parse_host
from llamaforge.serve.launcher import DEFAULT_RPC_PORT, LlamaFlags


@dataclass(frozen=True)
class Topology:
    """A topology as given: the head (``user@host:port``), the parsed workers, how they are reached, the
    deployment's layout, the RPC servers' threads and the gates' time limit."""

    head: str
    workers: list[RpcWorker]
    layout: Layout
    access: Access
    rpc_port: int = DEFAULT_RPC_PORT
    key_file: Path | None = None
    known_hosts: Path | None = None
    rpc_threads: int | None = None
    gate_timeout_s: float | None = None

    def worker_target(self, worker: RpcWorker) -> Target:
        """The RPC server target of ``worker``: its private address, port and threads."""
        return RpcServerTarget(worker.address, worker.port, self.rpc_threads)

    def options(self, reporter: Reporter, cancel: CancelToken, keep: int = KEEP_RELEASES) -> RolloutOptions:
        """How each member is rolled out and gated."""
        return RolloutOptions(gate_timeout_s=self.gate_timeout_s, reporter=reporter, cancel=cancel, keep=keep)


@dataclass(frozen=True)
class SplitRequest:
    """What a topology deploy serves and how the model is split: the release (build and model), the workers'
    build, the head's own GPU, the split's context, slots, proportions and margin, the head's threads."""

    release: ReleaseRequest
    worker_build: str | None = None
    head_gpu_memory: str | None = None
    ctx: int = 4096
    parallel: int = 1
    threads: int | None = None
    tensor_split: str | None = None
    margin: str = "256MiB"
    keep: int = KEEP_RELEASES


@dataclass(frozen=True)
class Prepared:
    """A topology deploy ready to ship: the workers (with their memory), the releases and the split plan."""

    workers: list[RpcWorker]
    head: Release
    releases: list[Release]
    plan: Any  # serve.split's plan


@contextlib.contextmanager
def members(topology: Topology, prepared: Prepared | None = None) -> Iterator[tuple[Member, list[Member]]]:
    """The head and the workers, connected; with ``prepared`` each carries the release a deploy ships."""
    head = parse_head(
        topology.head, topology.workers, key_file=topology.key_file, known_hosts=topology.known_hosts
    )
    with open_runners([head, *(worker.host for worker in topology.workers)], topology.access) as runners:
        yield (
            Member(runners[0], topology.layout, topology_head(), release=prepared.head if prepared else None),
            [
                Member(
                    runner,
                    topology.layout,
                    topology.worker_target(worker),
                    worker.endpoint,
                    prepared.releases[index] if prepared else None,
                )
                for index, (runner, worker) in enumerate(zip(runners[1:], topology.workers, strict=True))
            ],
        )


def worker_memory(topology: Topology) -> list[RpcWorker]:
    """Workers with their memory: given, or each one's MemAvailable rounded down to GiB (CPU workers)."""
    workers = topology.workers
    if all(worker.memory_bytes for worker in workers):
        return workers
    from llamaforge.serve.fit import GiB

    with open_runners([worker.host for worker in workers], topology.access) as runners:
        sizes = []
        for runner in runners:
            line = runner.run(
                ["grep", "MemAvailable", "/proc/meminfo"], what=f"reading {runner.host.address}'s memory"
            )
            sizes.append(max(1, int(line.stdout.split()[1]) * 1024 // GiB) * GiB)
    return [replace(worker, memory_bytes=size) for worker, size in zip(workers, sizes, strict=True)]


def prepare(topology: Topology, request: SplitRequest, reporter: Reporter, cancel: CancelToken) -> Prepared:
    """Checks, the split plan and the releases of head and workers; no host changes."""
    from llamaforge.build.store import build_dir, find_build
    from llamaforge.serve.fit import Settings, parse_size
    from llamaforge.serve.memory import parse_device_memory
    from llamaforge.serve.split import SplitDevice, parse_tensor_split, plan_split

    # the split's own values before any host is dialled
    margin_bytes = parse_size(request.margin, "--margin")
    head_gpu_bytes = (
        parse_device_memory(request.head_gpu_memory, "head GPU memory") if request.head_gpu_memory else 0
    )
    tensor_split = parse_tensor_split(request.tensor_split) if request.tensor_split else None
    head_key = str(find_build(request.release.build)["key"])
    worker_key = str(find_build(request.worker_build)["key"]) if request.worker_build else head_key
    check_builds(topology.head, head_key, {worker.host.address: worker_key for worker in topology.workers})
    check_rpc_build(head_key, build_dir(head_key))
    head_ssh = parse_head(topology.head, topology.workers)
    workers = worker_memory(topology)
    target = topology_head()
    (head,) = host_releases(
        replace(request.release, build=head_key),
        deploy_hosts([head_ssh]),
        topology.layout,
        target,
        RolloutSettings(),
        reporter,
        cancel,
    )
    devices = [
        SplitDevice(f"RPC {worker.endpoint}", worker.memory_bytes or 0, worker.endpoint) for worker in workers
    ]
    if request.head_gpu_memory:
        devices.append(SplitDevice("head GPU0", head_gpu_bytes))
    plan = plan_split(
        head.spec.model,
        devices,
        Settings(request.ctx, request.parallel),
        tensor_split=tensor_split,
        margin_bytes=margin_bytes,
    )
    flags = plan_flags(plan.flags, request.threads)
    spec = replace(head.spec, flags=flags)
    head = prepare_release(spec, topology.layout, target, head.checks, probe=head.probe)
    worker_spec = replace(
        spec, model=Path(), model_sha256="", model_size=0, port=topology.rpc_port, flags=LlamaFlags()
    )
    releases = [
        prepare_release(worker_spec, topology.layout, topology.worker_target(worker), probe=head.probe)
        for worker in workers
    ]
    pairs = [
        {"endpoint": worker.endpoint, "release": release.id}
        for worker, release in zip(workers, releases, strict=True)
    ]
    # what a rollback pairs the head with, and what the plan expected on each device (smoke compares it)
    head = replace(head, record={**head.record, "rpc_workers": pairs, "rpc_split": split_rows(plan)})
    return Prepared(workers, head, releases, plan)


def plan_flags(flags: tuple[str, ...], threads: int | None) -> LlamaFlags:
    """The split plan's flags as :class:`LlamaFlags` (the same text llama-server gets)."""
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


def split_rows(plan: Any) -> list[dict[str, object]]:
    """The plan's devices, then the head, as rows (what ``release.json`` keeps and the report shows)."""
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


def _failed(what: str, report: TopologyDeployResult) -> OperationFailed:
    bad = [
        f"{host.host} {host.status}"
        for host in [*report.workers, report.head]
        if host.status not in ("updated", "unchanged", "rolled back")
    ]
    return OperationFailed(
        f"{what} did not finish on every host: " + ", ".join(bad),
        result=report,
        exit_code=DeployFailed.exit_code,
        hint="the report says where each host was left and why",
    )


def plan_result(plan: Any) -> ModelSplitResult:
    """The split plan as the operations' result."""
    return ModelSplitResult.model_validate(plan.to_json())


def deploy(
    topology: Topology, request: SplitRequest, reporter: Reporter, cancel: CancelToken
) -> TopologyDeployResult:
    """Workers first (RPC HELLO), then the head (health + completion); OperationFailed (exit 13) when the split
    does not fit, with the report when a host is left anything but healthy."""
    started = time.monotonic()
    prepared = prepare(topology, request, reporter, cancel)
    plan = prepared.plan
    if not plan.fits:
        short = ", ".join(share.name for share in plan.devices if not share.fits)
        raise OperationFailed(
            f"the split does not fit on {short}",
            result=plan_result(plan),
            exit_code=ExitCode.DOES_NOT_FIT,
            hint="add a worker, give --tensor-split, or lower --ctx",
        )
    ready = replace(topology, workers=prepared.workers)
    with members(ready, prepared) as (head, workers):
        worker_reports, head_report = deploy_topology(
            head, workers, topology.options(reporter, cancel, keep=request.keep)
        )
    report = TopologyDeployResult(
        name=topology.layout.name,
        head=head_report,
        workers=worker_reports,
        flags=list(plan.flags),
        split=split_rows(plan),
        passed=topology_passed(worker_reports, head_report),
        wall_s=elapsed(started),
    )
    if not report.passed:
        raise _failed(f"topology.deploy of {prepared.head.id}", report)
    return report


def plan(
    topology: Topology, request: SplitRequest, reporter: Reporter, cancel: CancelToken
) -> ModelSplitResult:
    """The split plan of a topology deploy; nothing changes."""
    return plan_result(prepare(topology, request, reporter, cancel).plan)


def status(topology: Topology) -> TopologyStatusResult:
    """The head (release, /health) and each worker; OperationFailed when the topology is not serving."""
    with members(topology) as (head, workers):
        result = topology_status(head, workers)
    if not result.healthy:
        raise OperationFailed(
            f"topology {topology.layout.name} is not serving: {result.detail}",
            result=result,
            exit_code=DeployFailed.exit_code,
            hint="restart the worker named, then check again",
        )
    return result


def rollback(
    topology: Topology, release: str | None, reporter: Reporter, cancel: CancelToken
) -> TopologyDeployResult:
    """Every worker, then the head, back on its previous release (or the head on ``release``), each gated."""
    started = time.monotonic()
    with members(topology) as (head, workers):
        worker_reports, head_report = rollback_topology(
            head, workers, release, topology.options(reporter, cancel)
        )
    report = TopologyDeployResult(
        name=topology.layout.name,
        head=head_report,
        workers=worker_reports,
        flags=[],
        passed=topology_passed(worker_reports, head_report, rollback=True),
        wall_s=elapsed(started),
    )
    if not report.passed:
        raise _failed("topology.rollback", report)
    return report


@dataclass(frozen=True)
class SmokeFigures:
    """What ``topology.smoke`` measured: the head's figures, the single host's, and each device's buffers."""

    head: dict[str, Any]
    single: dict[str, Any] | None
    devices: list[dict[str, Any]]


def _serve_figures(runner: Any, port: int, n_predict: int, runs: int) -> dict[str, Any]:
    from llamaforge.runners.ssh.forward import forward_local
    from llamaforge.smoke.through import figures_json, measure

    with forward_local(runner, port) as local:
        return figures_json(measure(f"http://127.0.0.1:{local}", n_predict=n_predict, runs=runs))


def device_rows(planned: list[dict[str, Any]], allocated: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Per device: the planned and the allocated weights, kv_cache and compute bytes."""
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


def smoke(
    topology: Topology,
    single_host: str | None,
    single_layout: Layout,
    *,
    n_predict: int,
    runs: int,
) -> SmokeFigures:
    """The head's greedy tokens and tok/s beside a single host's, and each device's buffers: planned vs
    allocated (llama.cpp's load log on the head)."""
    from llamaforge.smoke.through import load_log_devices

    with members(topology) as (head, _workers):
        record = host_state(head.runner, head.layout).record or {}
        figures = _serve_figures(head.runner, int(record.get("port", DEFAULT_PORT)), n_predict, runs)
        allocated = load_log_devices(head.target.logs(head.runner, head.layout, lines=5000))
    single = None
    if single_host:
        host = parse_host(
            single_host, key_file=topology.key_file, known_hosts=topology.known_hosts, origin="--single-host"
        )
        with open_runners([host], topology.access) as (runner,):
            other = host_state(runner, single_layout).record or {}
            single = _serve_figures(runner, int(other.get("port", DEFAULT_PORT)), n_predict, runs)
    return SmokeFigures(figures, single, device_rows(list(record.get("rpc_split") or []), allocated))
