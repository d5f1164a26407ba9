"""The server's options (what its command line allows) and the checks every call meets before it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.guard import HostGuard
from llamaforge.core.jobs import JobManager
from llamaforge.core.registry import Operation, Params
from llamaforge.fronts.mcp.hostpolicy import HOST_RUN, DeployTargets, Places, host_runs, refuse_host_runs
from llamaforge.fronts.mcp.output import Output
from llamaforge.fronts.mcp.policy import ConfirmPolicy, PathPolicy, default_roots
from llamaforge.fronts.mcp.progress import HEARTBEAT_SECONDS

DEFAULT_MAX_JOBS = 4


@dataclass(frozen=True)
class ServerOptions:
    """Policy of one server process: what its command line allows (docs/security.md lists the flags)."""

    read_only: bool = False
    project_dir: Path = field(default_factory=Path.cwd)
    allow_roots: tuple[Path, ...] = ()
    confirm: ConfirmPolicy = "elicit"
    allow_host_builds: bool = False
    deploy_hosts: tuple[str, ...] = ()
    inventories: tuple[Path, ...] = ()
    url_hosts: tuple[str, ...] | None = None  # None: any host (link-local and metadata addresses refused)
    ssh_hosts: tuple[str, ...] | None = None  # None: any host
    max_jobs: int = DEFAULT_MAX_JOBS
    secrets: tuple[str, ...] = ()  # masked in every output besides the environment's (the HTTP bearer token)
    heartbeat_seconds: float = HEARTBEAT_SECONDS  # longest silence between a call's progress notifications


def path_policy(options: ServerOptions) -> PathPolicy:
    """The roots path parameters (and paths named inside files) must stay in."""
    # Relative paths are resolved by the core against the working directory, so they are checked there.
    return PathPolicy(default_roots(options.project_dir, options.allow_roots), Path.cwd().resolve())


def host_guard(options: ServerOptions) -> HostGuard:
    """The process-wide guard of a server with ``options``: children get a minimal environment, paths named
    inside files meet the path policy, URL and SSH hosts the lists, and read-only refuses writes and programs."""

    def hosts(names: tuple[str, ...] | None) -> frozenset[str] | None:
        return None if names is None else frozenset(name.lower() for name in names)

    return HostGuard(
        read_only=options.read_only,
        minimal_env=True,
        path_check=path_policy(options).check_file_path,
        url_hosts=hosts(options.url_hosts),
        ssh_hosts=hosts(options.ssh_hosts),
        allow_flag_hint="the person who starts the server allows more with --allow-url-host HOST, "
        "--allow-ssh-host HOST or --allow-root DIR",
    )


@dataclass(frozen=True)
class CallPolicy:
    """Every check a call meets before it runs, from one server's options."""

    options: ServerOptions
    paths: PathPolicy
    places: Places
    targets: DeployTargets
    output: Output

    @classmethod
    def of(cls, options: ServerOptions) -> CallPolicy:
        """The checks of a server started with ``options``."""
        return cls(
            options,
            path_policy(options),
            Places(options.project_dir),
            DeployTargets.of(options.deploy_hosts, options.inventories),
            Output(options.secrets),
        )

    def check(self, tool: str, op: Operation, arguments: dict[str, Any]) -> None:
        """Raise ``ToolError`` for a path outside the roots, a host build the server does not allow, or a
        destructive call to a host or inventory off its lists."""
        self.paths.check(op, arguments)
        try:
            reasons = host_runs(op, arguments, self.places)
            if reasons and not self.options.allow_host_builds:
                refuse_host_runs(tool, reasons)
            self.targets.check(tool, op, arguments)
        except LlamaforgeError as error:
            raise self.output.error(error.render()) from None

    def confirms(self, op: Operation) -> bool:
        """Whether calls of ``op`` may need a person's agreement."""
        return (
            op.destructive
            or op.destructive_when is not None
            or (self.options.allow_host_builds and op.name in HOST_RUN)
        )

    def needs_confirmation(self, op: Operation, arguments: dict[str, Any]) -> str | None:
        """Why this call needs a person's agreement, or None."""
        if op.destroys(arguments):
            return f"is destructive: {op.summary}"
        reasons = host_runs(op, arguments, self.places)
        return f"runs on this host: {'; '.join(reasons)}" if reasons else None

    def start_job(self, jobs: JobManager, tool: str, op: Operation, params: Params) -> str:
        """Start ``op`` as a job, unless the server already runs as many as it may."""
        running = len(jobs.running())
        if running >= self.options.max_jobs:
            raise self.output.error(
                f"{tool} was not started: {running} jobs are running, the most this server runs at once "
                f"(--max-jobs {self.options.max_jobs}); wait for one to finish (job_status) or stop one "
                "(job_cancel), then call again"
            )
        try:
            return jobs.start(op.name, params)
        except LlamaforgeError as error:
            raise self.output.error(error.render()) from None
