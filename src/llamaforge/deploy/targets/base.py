"""What a deploy target is: the :class:`Target` base class, whose hooks have defaults, and the small records
its hooks take.

A target is one way a release runs. Most run on SSH hosts as a service (systemd, docker, rpc-server) and
override the host hooks; swarm runs on a Docker Swarm instead (``on_hosts = False``) and overrides the service
hooks; compose and kubernetes only render manifests (``renders = True``, :meth:`Target.manifests`). The
registry in :mod:`llamaforge.deploy.targets` lists them; a new target is one module with one subclass, added
to that registry.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from llamaforge.core.errors import InvalidOption
from llamaforge.core.exits import signal_words
from llamaforge.deploy.release import Layout

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from llamaforge.core.events import CancelToken, Reporter
    from llamaforge.deploy.hosts.access import Access, DeployHost
    from llamaforge.deploy.manifests.files import ManifestInputs
    from llamaforge.deploy.release import ReleaseRequest, ReleaseSpec
    from llamaforge.deploy.report import DeployResult, DeployStatusResult
    from llamaforge.runners.ssh import SshProcessRunner


@dataclass(frozen=True)
class ServiceState:
    """What the host's service manager says about the deployment's service."""

    active: str  # active, activating, failed, inactive, unknown
    restarts: int  # times the manager restarted it since it was last started by us
    # The signal that ended its main process last, when the manager still says so.
    killed_by: signal.Signals | None = None

    @property
    def crash(self) -> str | None:
        """``killed by SIGILL (illegal instruction)`` when a signal ended the main process last, else None."""
        return None if self.killed_by is None else f"killed by {signal_words(self.killed_by)}"


@dataclass(frozen=True)
class Deployment:
    """Where a deployment lives: its name and root, its hosts (``hosts`` as given, ``host_list`` parses them
    or reads the inventory when asked) and how they are reached."""

    name: str
    root: str
    hosts: str | None
    host_list: Callable[[], list[DeployHost]]
    access: Access
    gate_timeout_s: float | None = None

    @property
    def layout(self) -> Layout:
        """The deployment's layout on the hosts."""
        return Layout(self.name, self.root)


@dataclass(frozen=True)
class RolloutSettings:
    """How a deploy rolls out: canary and batches, failures allowed, releases kept, the probe and the fit check;
    for a target that is no host (swarm) the replicas and the published port."""

    canary: int = 1
    batch: int = 1
    max_fail_percent: float = 0
    keep: int = 5
    probe: bool = True
    force: bool = False
    replicas: int = 1
    publish: int | None = None


class Target:
    """A way to run a release. The host hooks' defaults are those of a service that needs nothing but its
    files; a target overrides what it does differently."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the target's name in a sentence (default: its name)
    summary: ClassVar[str] = ""  # how the release runs, in a few words for --target's help
    on_hosts: ClassVar[bool] = True  # runs on SSH hosts (False: the service hooks below deploy it)
    deploys: ClassVar[bool] = True  # a value of deploy's --target (rpc-server: topology only)
    renders: ClassVar[bool] = False  # a value of deploy.render's --target (:meth:`manifests`)
    heads_topology: ClassVar[bool] = False  # runs a topology's head (llama-server --rpc); one target does

    # --- on SSH hosts ---------------------------------------------------------------------------------------

    def for_spec(self, spec: ReleaseSpec, reporter: Reporter) -> Target:
        """The target as a release of ``spec`` runs it (the docker target: with its runtime image made here)."""
        return self

    def files(self, spec: ReleaseSpec) -> list[tuple[Path, str]]:
        """(local file, path inside the release) the release ships besides its service files."""
        return []

    def check(self, runner: SshProcessRunner) -> None:
        """Refuse (a LlamaforgeError naming the host and the next step) a host that cannot run the target;
        asked while planning, before any host changes."""

    def deliver(self, runner: SshProcessRunner, layout: Layout, cancel: CancelToken | None = None) -> int:
        """Put on the host what the release runs beyond its files (the docker target's image), before the
        switch; returns the bytes sent."""
        return 0

    def pending(self, runner: SshProcessRunner) -> str:
        """What :meth:`deliver` would send to the host, in words for ``deploy.plan`` (empty: nothing); it only
        reads."""
        return ""

    def listens(self, spec: ReleaseSpec) -> tuple[str, int] | None:
        """The address and port a release of ``spec`` binds on the host, checked while planning: a port another
        program holds there refuses the host (None: not checked)."""
        return None

    def service_files(self, spec: ReleaseSpec, layout: Layout) -> dict[str, str]:
        """The rendered service files, by file name inside the release (part of the release id)."""
        return {}

    def prepare(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Make the host ready for releases (service user, directories); safe to repeat."""

    def prune(self, runner: SshProcessRunner, layout: Layout, removed: Sequence[str]) -> None:
        """Remove the releases ``removed`` from the host, with what the target put there for them alone (the
        docker target: the images no release left on the host runs)."""

    def activation(self, layout: Layout) -> list[str]:
        """The host command :meth:`activate` runs as root, without ``sudo`` (the caller adds it for a deploy user
        who is not root: :func:`~llamaforge.deploy.hosts.access.as_root`); run after the switch in the same
        command, so a lost connection cannot separate them."""
        raise self._not_on_hosts()

    def activate(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Install the service files of ``current`` and (re)start the service."""
        raise self._not_on_hosts()

    def stop(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Stop the service (it stays installed)."""
        raise self._not_on_hosts()

    def state(self, runner: SshProcessRunner, layout: Layout) -> ServiceState:
        """The service's state on the host."""
        return ServiceState("unknown", 0)

    def logs(self, runner: SshProcessRunner, layout: Layout, lines: int = 20) -> list[str]:
        """The service's last log lines on the host (none: the target keeps no log)."""
        return []

    def probe_command(
        self, layout: Layout, rid: str, service_files: Mapping[str, str], model: str, args: Sequence[str]
    ) -> list[str]:
        """The host command that runs release ``rid``'s llama-bench with ``args`` (on ``model``, a host path) as
        the release's service would run (its user, environment, sandbox or image), before ``current`` points at
        it; llama-bench's stdout and stderr come back as the command's. A command for root, without ``sudo`` (the
        caller adds it: :func:`~llamaforge.deploy.hosts.access.as_root`)."""
        raise self._not_on_hosts()

    def probe_signal(self, code: int, stderr: Sequence[str]) -> signal.Signals | None:
        """The signal that ended :meth:`probe_command`'s llama-bench, from the command's exit ``code`` and
        ``stderr`` (None: none did). Default: a shell's 128 + signal number."""
        try:
            return signal.Signals(code - 128) if code > 128 else None
        except ValueError:
            return None

    # --- elsewhere (on_hosts = False) ----------------------------------------------------------------------

    def deploy_service(
        self,
        deployment: Deployment,
        request: ReleaseRequest,
        settings: RolloutSettings,
        reporter: Reporter,
        cancel: CancelToken,
    ) -> DeployResult:
        """Deploy a release of ``request`` where the target runs it, when that is not on SSH hosts."""
        raise self._on_hosts()

    def service_status(self, deployment: Deployment) -> DeployStatusResult:
        """The deployment's state, when the target runs it elsewhere than on SSH hosts."""
        raise self._on_hosts()

    def rollback_service(
        self, deployment: Deployment, release: str | None, reporter: Reporter, cancel: CancelToken
    ) -> DeployResult:
        """Go back to the previous release, when the target runs it elsewhere than on SSH hosts."""
        raise self._on_hosts()

    # --- render-only (renders = True) ----------------------------------------------------------------------

    def manifests(self, spec: ReleaseSpec, inputs: ManifestInputs, layout: Layout) -> dict[str, str]:
        """The files a team deploys a release of ``spec`` with, by name (``deploy.render``)."""
        raise InvalidOption(f"deploy.render has no target {self.name!r}", hint="see deploy.render --help")

    def _not_on_hosts(self) -> InvalidOption:
        return InvalidOption(
            f"the {self.name} target runs no service on SSH hosts",
            hint="choose a host target: systemd, docker",
        )

    def _on_hosts(self) -> InvalidOption:
        return InvalidOption(f"the {self.name} target runs on SSH hosts", hint="give --hosts or --inventory")
