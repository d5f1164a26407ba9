"""Operations ``deploy``, ``deploy.plan``, ``deploy.status`` and ``deploy.rollback`` over SSH hosts.

``deploy`` and ``deploy.rollback`` change hosts (destructive: fronts confirm them and hide them when
read-only); ``deploy.plan`` and ``deploy.status`` only read. A rollout or rollback that leaves a host anything
but healthy raises :class:`OperationFailed` with the full per-host report.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from llamaforge.core.errors import Cancelled, ExitCode, InvalidOption, LlamaforgeError, OperationFailed
from llamaforge.core.events import null_reporter
from llamaforge.core.registry import OperationContext, Params, operation, path_field
from llamaforge.core.validation import suggest
from llamaforge.deploy.hosts import Access, DeployHost, deploy_hosts, open_runners, parse_hosts
from llamaforge.deploy.manage import unanswered
from llamaforge.deploy.probe import ProbeModel
from llamaforge.deploy.release import (
    DEFAULT_PORT,
    DEFAULT_ROOT,
    KEEP_RELEASES,
    LOOPBACK,
    DeployRoot,
    Layout,
    ReleaseSpec,
)
from llamaforge.deploy.report import DeployPlan, DeployStatus, RolloutReport
from llamaforge.deploy.rollout import Release, RolloutOptions, plan_host, prepare_release, rollout
from llamaforge.deploy.targets import get_target, targets
from llamaforge.models.recipes import TINY_MODEL, AnswerCheck
from llamaforge.serve.launcher import CACHE_TYPES, LlamaFlags

SWARM = "swarm"  # not a host target: the service lives on a Docker Swarm (llamaforge.deploy.swarm)


def target_names() -> list[str]:
    """Every value of ``--target``: the host targets of the registry, then swarm."""
    return [*targets(), SWARM]


class DeployFailed(LlamaforgeError):
    """A rollout or rollback left a host failed, rolled back or unreachable."""

    exit_code = ExitCode.DEPLOY


class HostsParams(Params):
    """Where a deployment lives: hosts, how to reach them, its name, root and target."""

    hosts: str | None = Field(
        None,
        description="Hosts as user@host:port, comma-separated, in rollout order (not for swarm); with "
        "--inventory, the names of the inventory's hosts to deploy to (default: all of them)",
    )
    inventory: str | None = path_field(
        None,
        description="Host inventory: recipes/hosts/NAME.toml by name, or a path (hosts in rollout order, "
        "users, ports, keys, its own known_hosts, each host's GPU for the fit plan)",
    )
    ssh_key: str | None = path_field(None, description="Private key file (default: the SSH agent)")
    known_hosts: str | None = path_field(
        None, description="The hosts' known_hosts file (read with ~/.ssh/known_hosts; new keys go here)"
    )
    accept_new_host_keys: bool = Field(
        False, description="Record the key of a host never seen before (a changed key is always refused)"
    )
    name: str = Field("default", description="Deployment name: the service llamaforge-NAME, root ROOT/NAME")
    root: DeployRoot = Field(DEFAULT_ROOT, description="Directory on the hosts that holds the deployments")
    target: str = Field(
        "systemd",
        description="How the release runs: systemd (on the hosts), docker (a container from the build's "
        "runtime image on each host's own Docker engine), or swarm (a service on this engine's Docker Swarm, no hosts)",
    )
    gate_timeout_s: float | None = Field(
        None, gt=0, description="Seconds /health may take (default: scaled to the model size, capped)"
    )

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        known = target_names()
        if value not in known:
            raise ValueError(
                f"unknown deploy target {value!r}; {suggest(value, known, end=' ')}known: {', '.join(known)}"
            )
        return value

    def access(self) -> Access:
        """How every host is reached."""
        return Access(accept_new_host_keys=self.accept_new_host_keys)

    def host_list(self) -> list[DeployHost]:
        """The hosts: the inventory's (those named in --hosts) or the parsed --hosts."""
        key_file = Path(self.ssh_key).expanduser() if self.ssh_key else None
        known = Path(self.known_hosts).expanduser() if self.known_hosts else None
        if self.inventory:
            from llamaforge.deploy.inventory import inventory_hosts

            return inventory_hosts(self.inventory, self.hosts, key_file=key_file, known_hosts=known)
        if not self.hosts:
            raise InvalidOption("no hosts given", hint="--hosts user@host:port,… or --inventory NAME|PATH")
        return deploy_hosts(parse_hosts(self.hosts, key_file=key_file, known_hosts=known, origin="--hosts"))

    def layout(self) -> Layout:
        """The deployment's layout on the hosts."""
        return Layout(self.name, self.root)


class DeployParams(HostsParams):
    """Parameters of ``deploy`` and ``deploy.plan``."""

    build: str = Field(description="Build key (or unique prefix) from the build store")
    model: str = path_field(
        description="Model recipe name or .toml, a GGUF file or a URL, or `tiny`: the random-weight tiny qwen3 "
        "smoke model, written here on first use (it serves, but answers nothing useful); a recipe's [[answers]] "
        "are checked by the health gate"
    )
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="llama-server's port on the hosts' 127.0.0.1")
    ctx: int | None = Field(None, ge=1, description="llama-server -c (total context)")
    threads: int | None = Field(None, ge=1, description="llama-server -t")
    parallel: int | None = Field(None, ge=1, description="llama-server --parallel (slots)")
    n_gpu_layers: int | None = Field(None, ge=0, description="llama-server -ngl (default: from the fit plan)")
    cache_type: str | None = Field(None, description="KV cache type of K and V (-ctk/-ctv), e.g. q8_0")
    repack: bool = Field(
        True,
        description="CPU-resident weights in the CPU's repacked/AMX buffers, llama.cpp's default; "
        "--no-repack keeps them in plain buffers (llama-server --no-repack)",
    )
    server_args: str | None = Field(
        None,
        description='More llama-server flags, as one string split like a shell would (e.g. "--jinja --alias '
        "NAME\"): checked against the build's own `llama-server --help`; flags llamaforge sets itself, secrets and "
        "downloads are refused",
    )
    listen: str = Field(
        LOOPBACK,
        description="Address llama-server binds on the hosts; beyond loopback an API key is generated "
        "per deploy, kept on each host (mode 0600, the service user's) and passed with --api-key-file",
    )
    api_key: bool = Field(
        True, description="With --listen beyond loopback, the API key (--no-api-key is refused)"
    )
    force: bool = Field(
        False, description="Deploy even where the fit plan says the model does not fit the GPU"
    )
    canary: int = Field(1, ge=0, description="Hosts deployed and gated first, before any batch")
    batch: int = Field(1, ge=1, description="Hosts deployed together after the canary")
    max_fail: float = Field(
        0,
        ge=0,
        le=100,
        description="Go on after a batch unless MORE than this percent of its hosts failed "
        "(Ansible's max_fail_percentage; 0: stop at the first failure)",
    )
    keep: int = Field(KEEP_RELEASES, ge=1, description="Releases kept on each host")
    probe: bool = Field(
        True,
        description="Before its switch each host runs the release's llama-bench as the service would (its "
        "user, environment, sandbox or image) on a tiny Q4_0 model; a crash or failure refuses the host "
        "(--no-probe: switch without it)",
    )
    replicas: int = Field(
        1, ge=1, description="--target swarm: tasks of the service (--batch: replaced at a time)"
    )
    publish: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="--target swarm: publish the port on EVERY interface of every node "
        "(Swarm cannot bind one address; default: nothing published), with an API key: a Swarm secret, kept in "
        "$LLAMAFORGE_HOME/keys/swarm-NAME.api-key",
    )

    @field_validator("cache_type")
    @classmethod
    def _known_cache_type(cls, value: str | None) -> str | None:
        # it reaches the unit's ExecStart and the release id: only llama.cpp's own type names
        if value is not None and value not in CACHE_TYPES:
            raise ValueError(f"{value!r} is not a KV cache type llama.cpp knows ({', '.join(CACHE_TYPES)})")
        return value


def _model(params: DeployParams, ctx: OperationContext) -> tuple[Path, tuple[AnswerCheck, ...]]:
    if params.model == TINY_MODEL:
        from llamaforge.smoke.run import tiny_smoke_model

        return tiny_smoke_model(ctx.reporter, ctx.cancel), ()
    from llamaforge.models.argument import resolve_model_argument

    m = resolve_model_argument(params.model, reporter=ctx.reporter, cancel=ctx.cancel)
    return m.path, tuple(m.recipe.answers) if m.recipe else ()


def release_spec(params: DeployParams, ctx: OperationContext) -> tuple[ReleaseSpec, tuple[AnswerCheck, ...]]:
    """The release's inputs from the parameters (build, model, flags, port, listen) and the model's answer
    checks."""
    from llamaforge.build.store import build_dir, find_build
    from llamaforge.deploy.release import OWNED_FLAGS, listen_address
    from llamaforge.runners.ssh.transfer import file_sha256
    from llamaforge.serve.server_args import server_args_for

    listen = listen_address(params.listen, api_key=params.api_key)
    manifest = find_build(params.build)
    directory = build_dir(str(manifest["key"]))
    # checked before the model is fetched and any host is reached
    extra = server_args_for(
        params.server_args, directory / "bin" / "llama-server", str(manifest["key"]), OWNED_FLAGS
    )
    model, checks = _model(params, ctx)
    given = LlamaFlags(
        ctx=params.ctx,
        threads=params.threads,
        parallel=params.parallel,
        n_gpu_layers=params.n_gpu_layers,
        cache_type_k=params.cache_type,
        cache_type_v=params.cache_type,
        repack=params.repack,
        extra=extra,
    )
    spec = ReleaseSpec(
        build_key=str(manifest["key"]),
        build_dir=directory,
        manifest_sha256=file_sha256(directory / "manifest.json"),
        model=model,
        model_sha256=file_sha256(model),
        model_size=model.stat().st_size,
        flags=given,
        port=params.port,
        listen=listen,
        backend=str(manifest.get("backend") or "cpu"),
    )
    return spec, checks


def release_probe(spec: ReleaseSpec, ctx: OperationContext | None = None) -> ProbeModel:
    """The probe model a release of ``spec`` is proven with on each host; InvalidOption when the build has no
    llama-bench to run it."""
    from llamaforge.deploy.probe import PROBE_BINARY, probe_model

    if not (spec.build_dir / "bin" / PROBE_BINARY).is_file():
        raise InvalidOption(
            f"build {spec.build_key} has no {PROBE_BINARY}, which proves a release on each host before its switch",
            hint="add it to the recipe's targets, or deploy with --no-probe",
        )
    return probe_model(ctx.reporter if ctx else null_reporter, ctx.cancel if ctx else None)


def _releases(params: DeployParams, hosts: list[DeployHost], ctx: OperationContext) -> list[Release]:
    """One release per host: the same one unless the fit plan gives hosts with other GPUs other flags."""
    import secrets

    from llamaforge.deploy.fitplan import fit_for_gpu

    spec, checks = release_spec(params, ctx)
    key = secrets.token_urlsafe(32) if spec.api_key else None
    probe = release_probe(spec, ctx) if params.probe else None
    target = get_target(params.target).for_spec(spec, ctx.reporter)  # docker: the runtime image, made here
    by_gpu: dict[str | None, Release] = {}
    for host in hosts:
        if host.gpu not in by_gpu:
            fit = fit_for_gpu(spec.model, host.gpu, spec.flags, host=host.name, force=params.force)
            by_gpu[host.gpu] = prepare_release(
                replace(spec, flags=fit.flags),
                params.layout(),
                target,
                checks,
                api_key=key,
                fit=fit.summary,
                probe=probe,
            )
    return [by_gpu[host.gpu] for host in hosts]


def _ssh(hosts: list[DeployHost]) -> list[Any]:
    return [host.ssh for host in hosts]


def _options(params: HostsParams, ctx: OperationContext, **more: Any) -> RolloutOptions:
    return RolloutOptions(
        gate_timeout_s=params.gate_timeout_s, reporter=ctx.reporter, cancel=ctx.cancel, **more
    )


def _failed(what: str, report: RolloutReport) -> OperationFailed:
    if report.interrupted:
        where = ", ".join(
            f"{host.host} {host.status} on {host.release or 'unknown'}" for host in report.hosts
        )
        return OperationFailed(
            f"{what} was interrupted: {where}",
            result=report,
            exit_code=Cancelled.exit_code,
            hint="every host runs a whole release; deploy again to finish",
        )
    bad = [
        f"{host.host} {host.status}" for host in report.hosts if host.status not in ("updated", "unchanged")
    ]
    return OperationFailed(
        f"{what} did not finish on every host: " + ", ".join(bad),
        result=report,
        exit_code=DeployFailed.exit_code,
        hint="the report says where each host was left and why",
    )


@operation(
    "deploy",
    DeployParams,
    read_only=False,
    destructive=True,
    long_running=True,
    cli="llamaforge.deploy.render:rollout_cli",
)
def deploy_op(params: DeployParams, ctx: OperationContext) -> RolloutReport:
    """Deploy a build and a model to hosts as a release: canary, batches, health gate, rollback on failure."""
    if params.target == SWARM:
        from llamaforge.deploy.swarm_ops import swarm_deploy

        return swarm_deploy(params, ctx)
    hosts = params.host_list()
    releases = _releases(params, hosts, ctx)
    with open_runners(_ssh(hosts), params.access()) as runners:
        report = rollout(
            runners,
            releases,
            _options(
                params,
                ctx,
                canary=params.canary,
                batch=params.batch,
                max_fail_percent=params.max_fail,
                keep=params.keep,
            ),
        )
    if not report.passed:
        raise _failed(f"deploy of {report.release or 'the releases'}", report)
    return report


@operation("deploy.plan", DeployParams, read_only=True, cli="llamaforge.deploy.render:plan_cli")
def deploy_plan_op(params: DeployParams, ctx: OperationContext) -> DeployPlan:
    """What a deploy would change on each host (upload, model, flags, restart); nothing runs.

    Exits 14 (naming each host and why) when a host did not answer: unreachable, its key refused, its host key
    unknown; the plan of the hosts that answered is still shown."""
    if params.target == SWARM:
        raise InvalidOption(
            "deploy.plan covers SSH hosts; Swarm plans and rolls its own updates",
            hint="`invoke deploy.status --target swarm` shows the service and replicas",
        )
    hosts = params.host_list()
    releases = _releases(params, hosts, ctx)
    with open_runners(_ssh(hosts), params.access()) as runners:
        plans = [plan_host(runner, release)[0] for runner, release in zip(runners, releases, strict=True)]
    first = releases[0]
    plan = DeployPlan(
        release=first.id, target=first.target.name, name=first.layout.name, record=first.record, hosts=plans
    )
    failure = unanswered("deploy.plan", plan)
    if failure is not None:
        raise failure
    return plan


@operation("deploy.status", HostsParams, read_only=True, cli="llamaforge.deploy.render:status_cli")
def deploy_status_op(params: HostsParams, ctx: OperationContext) -> DeployStatus:
    """Per host: current release, service state, health, build key, model sha256 and flags.

    Exits 14 (naming each host and why) when a host did not answer: unreachable, its key refused, its host key
    unknown; the hosts that answered are still reported. A host that answers with a stopped or unhealthy
    service is reported as such, not failed."""
    from llamaforge.deploy.manage import status

    if params.target == SWARM:
        from llamaforge.deploy.swarm_ops import swarm_status

        return swarm_status(params)
    with open_runners(_ssh(params.host_list()), params.access()) as runners:
        result = status(runners, params.layout(), get_target(params.target))
    failure = unanswered("deploy.status", result)
    if failure is not None:
        raise failure
    return result


class RollbackParams(HostsParams):
    """Parameters of ``deploy.rollback``."""

    release: str | None = Field(None, description="Release id to go back to (default: the previous one)")


@operation(
    "deploy.rollback",
    RollbackParams,
    read_only=False,
    destructive=True,
    long_running=True,
    cli="llamaforge.deploy.render:rollout_cli",
)
def deploy_rollback_op(params: RollbackParams, ctx: OperationContext) -> RolloutReport:
    """Put every host back on its previous release (or --release ID), health-gated, one host at a time."""
    from llamaforge.deploy.manage import rollback

    if params.target == SWARM:
        from llamaforge.deploy.swarm_ops import swarm_rollback

        return swarm_rollback(params, ctx)
    with open_runners(_ssh(params.host_list()), params.access()) as runners:
        report = rollback(
            runners, params.layout(), get_target(params.target), params.release, _options(params, ctx)
        )
    if not report.passed:
        raise _failed("rollback", report)
    return report
