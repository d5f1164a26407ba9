"""Operations ``deploy``, ``deploy.plan``, ``deploy.status`` and ``deploy.rollback`` over SSH hosts.

``deploy`` and ``deploy.rollback`` change hosts (destructive: fronts confirm them and hide them when
read-only); ``deploy.plan`` and ``deploy.status`` only read. A rollout or rollback that leaves a host anything
but healthy raises :class:`OperationFailed` with the full per-host report.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llamaforge.core.errors import InvalidOption
from llamaforge.core.registry import MAX_WAIT_S, Int32, OperationContext, Params, Slots, operation, path_field
from llamaforge.core.validation import check_target_options, suggest
from llamaforge.deploy.hosts import service
from llamaforge.deploy.hosts.access import Access, DeployHost, deploy_hosts, ssh_files
from llamaforge.deploy.release import (
    DEFAULT_PORT,
    DEFAULT_ROOT,
    KEEP_RELEASES,
    LOOPBACK,
    DeployRoot,
    Layout,
    ReleaseId,
    ReleaseRequest,
)
from llamaforge.deploy.report import DeployFailed, DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.deploy.targets import (
    TARGETS,
    Deployment,
    DeployTargetName,
    RolloutSettings,
    deploy_target_names,
    get_target,
)
from llamaforge.runners.ssh import parse_hosts
from llamaforge.serve.launcher import CacheType

__all__ = ["DeployFailed", "DeployParams", "DeployRollbackParams", "HostsParams", "target_names"]


def target_names() -> list[str]:
    """Every value of ``--target``: the deploy targets of the registry."""
    return deploy_target_names()


def _target_help() -> str:
    return ", ".join(f"{name} ({TARGETS[name].summary})" for name in deploy_target_names())


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
    target: DeployTargetName = Field("systemd", description="How the release runs: " + _target_help())
    gate_timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S,
        description="Seconds /health may take (default: scaled to the model size, capped)",
    )

    @field_validator("target", mode="before")
    @classmethod
    def _known_target(cls, value: object) -> object:
        known = target_names()
        if value not in known:
            raise ValueError(
                f"unknown deploy target {value!r}; {suggest(str(value), known, end=' ')}known: {', '.join(known)}"
            )
        return value

    def access(self) -> Access:
        """How every host is reached."""
        return Access(accept_new_host_keys=self.accept_new_host_keys)

    def host_list(self) -> list[DeployHost]:
        """The hosts: the inventory's (those named in --hosts) or the parsed --hosts."""
        key_file, known = ssh_files(self.ssh_key, self.known_hosts)
        if self.inventory:
            from llamaforge.deploy.hosts.inventory import inventory_hosts

            return inventory_hosts(
                self.inventory, self.hosts, key_file=key_file, known_hosts=known, check_files=True
            )
        if not self.hosts:
            raise InvalidOption("no hosts given", hint="--hosts user@host:port,… or --inventory NAME|PATH")
        return deploy_hosts(parse_hosts(self.hosts, key_file=key_file, known_hosts=known, origin="--hosts"))

    def layout(self) -> Layout:
        """The deployment's layout on the hosts."""
        return Layout(self.name, self.root)

    def deployment(self) -> Deployment:
        """Where the deployment lives, for the domain service."""
        return Deployment(
            self.name, self.root, self.hosts, self.host_list, self.access(), self.gate_timeout_s
        )


class DeployParams(HostsParams):
    """Parameters of ``deploy`` and ``deploy.plan``."""

    build: str = Field(description="Build key (or unique prefix) from the build store")
    model: str = path_field(
        description="Model recipe name or .toml, a GGUF file or a URL, or `tiny` (`tiny-q4_k_m`): the "
        "random-weight tiny qwen3 smoke model, written here on first use (it serves, but answers nothing useful); "
        "a recipe's [[answers]] are checked by the health gate"
    )
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="llama-server's port on the hosts' 127.0.0.1")
    ctx: Int32 | None = Field(None, ge=1, description="llama-server -c (total context)")
    threads: Int32 | None = Field(None, ge=1, description="llama-server -t")
    parallel: Slots | None = Field(None, description="llama-server --parallel (slots), at most 256")
    n_gpu_layers: Int32 | None = Field(
        None, ge=0, description="llama-server -ngl (default: from the fit plan)"
    )
    # it reaches the unit's ExecStart and the release id: only llama.cpp's own type names
    cache_type: CacheType | None = Field(None, description="KV cache type of K and V (-ctk/-ctv), e.g. q8_0")
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
        "user, environment, sandbox or image; on Swarm a job on every node) on a tiny Q4_0 model; a crash or "
        "failure refuses the host (--no-probe: switch without it)",
    )
    replicas: Int32 = Field(
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

    @model_validator(mode="after")
    def _options_of_the_target(self) -> DeployParams:
        # what Swarm alone reads would be dropped without a word by the host targets
        check_target_options(self, self.target, {"replicas": "swarm", "publish": "swarm"})
        return self

    def request(self) -> ReleaseRequest:
        """What the release is asked to be."""
        return ReleaseRequest(
            build=self.build,
            model=self.model,
            port=self.port,
            ctx=self.ctx,
            threads=self.threads,
            parallel=self.parallel,
            n_gpu_layers=self.n_gpu_layers,
            cache_type=self.cache_type,
            repack=self.repack,
            server_args=self.server_args,
            listen=self.listen,
            api_key=self.api_key,
        )

    def settings(self) -> RolloutSettings:
        """How the rollout proceeds."""
        return RolloutSettings(
            canary=self.canary,
            batch=self.batch,
            max_fail_percent=self.max_fail,
            keep=self.keep,
            probe=self.probe,
            force=self.force,
            replicas=self.replicas,
            publish=self.publish,
        )


@operation(
    "deploy",
    DeployParams,
    read_only=False,
    destructive=True,
    long_running=True,
    cli="llamaforge.deploy.hosts.render:rollout_cli",
)
def deploy_op(params: DeployParams, ctx: OperationContext) -> DeployResult:
    """Deploy a build and a model to hosts as a release: canary, batches, health gate, rollback on failure."""
    return service.deploy(
        get_target(params.target),
        params.deployment(),
        params.request(),
        params.settings(),
        ctx.reporter,
        ctx.cancel,
    )


@operation("deploy.plan", DeployParams, read_only=True, cli="llamaforge.deploy.hosts.render:plan_cli")
def deploy_plan_op(params: DeployParams, ctx: OperationContext) -> DeployPlanResult:
    """What a deploy would change on each host (upload, model, flags, restart); nothing runs.

    Exits 14 (naming each host and why) when a host did not answer: unreachable, its key refused, its host key
    unknown; the plan of the hosts that answered is still shown."""
    return service.plan(
        get_target(params.target),
        params.deployment(),
        params.request(),
        params.settings(),
        ctx.reporter,
        ctx.cancel,
    )


@operation("deploy.status", HostsParams, read_only=True, cli="llamaforge.deploy.hosts.render:status_cli")
def deploy_status_op(params: HostsParams, ctx: OperationContext) -> DeployStatusResult:
    """Per host: current release, service state, health, build key, model sha256 and flags.

    Exits 14 (naming each host and why) when a host did not answer: unreachable, its key refused, its host key
    unknown; the hosts that answered are still reported. A host that answers with a stopped or unhealthy
    service is reported as such, not failed."""
    return service.deploy_status(get_target(params.target), params.deployment())


class DeployRollbackParams(HostsParams):
    """Parameters of ``deploy.rollback``."""

    release: ReleaseId | None = Field(
        None, description="Release id to go back to (default: the previous one)"
    )


@operation(
    "deploy.rollback",
    DeployRollbackParams,
    read_only=False,
    destructive=True,
    long_running=True,
    cli="llamaforge.deploy.hosts.render:rollout_cli",
)
def deploy_rollback_op(params: DeployRollbackParams, ctx: OperationContext) -> DeployResult:
    """Put every host back on its previous release (or --release ID), health-gated, one host at a time."""
    return service.deploy_rollback(
        get_target(params.target), params.deployment(), params.release, ctx.reporter, ctx.cancel
    )
