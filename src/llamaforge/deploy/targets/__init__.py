"""Service targets: how a release runs on a host. One module per target, registered here and nowhere else."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llamaforge.core.errors import InvalidOption
from llamaforge.core.validation import suggest

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from llamaforge.core.events import CancelToken, Reporter
    from llamaforge.deploy.release import Layout, ReleaseSpec
    from llamaforge.runners.ssh import SshProcessRunner


@dataclass(frozen=True)
class ServiceState:
    """What the host's service manager says about the deployment's service."""

    active: str  # active, activating, failed, inactive, unknown
    restarts: int  # times the manager restarted it since it was last started by us
    # The signal that ended its main process last, when the manager still says so.
    killed_by: signal.Signals | None = None


class Target(Protocol):
    """A way to run a release as a service on a host."""

    name: str

    def for_spec(self, spec: ReleaseSpec, reporter: Reporter) -> Target:
        """The target as a release of ``spec`` runs it (the docker target: with its runtime image made here)."""
        ...

    def files(self, spec: ReleaseSpec) -> list[tuple[Path, str]]:
        """(local file, path inside the release) the release ships besides its service files."""
        ...

    def check(self, runner: SshProcessRunner) -> None:
        """Refuse (a LlamaforgeError naming the host and the next step) a host that cannot run the target;
        asked while planning, before any host changes."""
        ...

    def deliver(self, runner: SshProcessRunner, layout: Layout, cancel: CancelToken | None = None) -> int:
        """Put on the host what the release runs beyond its files (the docker target's image), before the
        switch; returns the bytes sent."""
        ...

    def pending(self, runner: SshProcessRunner) -> str:
        """What :meth:`deliver` would send to the host, in words for ``deploy.plan`` (empty: nothing); it only
        reads."""
        ...

    def listens(self, spec: ReleaseSpec) -> tuple[str, int] | None:
        """The address and port a release of ``spec`` binds on the host, checked while planning: a port another
        program holds there refuses the host (None: not checked)."""
        ...

    def service_files(self, spec: ReleaseSpec, layout: Layout) -> dict[str, str]:
        """The rendered service files, by file name inside the release (part of the release id)."""
        ...

    def prepare(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Make the host ready for releases (service user, directories); safe to repeat."""
        ...

    def prune(self, runner: SshProcessRunner, layout: Layout, removed: Sequence[str]) -> None:
        """Remove the releases ``removed`` from the host, with what the target put there for them alone (the
        docker target: the images no release left on the host runs)."""
        ...

    def activate(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Install the service files of ``current`` and (re)start the service."""
        ...

    def activation(self, layout: Layout) -> list[str]:
        """The host command :meth:`activate` runs as root, without ``sudo`` (the caller adds it for a deploy user
        who is not root: :func:`~llamaforge.deploy.hosts.as_root`); run after the switch in the same command, so
        a lost connection cannot separate them."""
        ...

    def stop(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Stop the service (it stays installed)."""
        ...

    def state(self, runner: SshProcessRunner, layout: Layout) -> ServiceState:
        """The service's state on the host."""
        ...

    def logs(self, runner: SshProcessRunner, layout: Layout, lines: int = 20) -> list[str]:
        """The service's last log lines on the host."""
        ...

    def probe_command(
        self, layout: Layout, rid: str, service_files: Mapping[str, str], model: str, args: Sequence[str]
    ) -> list[str]:
        """The host command that runs release ``rid``'s llama-bench with ``args`` (on ``model``, a host path) as
        the release's service would run (its user, environment, sandbox or image), before ``current`` points at
        it; llama-bench's stdout and stderr come back as the command's. A command for root, without ``sudo`` (the
        caller adds it: :func:`~llamaforge.deploy.hosts.as_root`)."""
        ...

    def probe_signal(self, code: int, stderr: Sequence[str]) -> signal.Signals | None:
        """The signal that ended :meth:`probe_command`'s llama-bench, from the command's exit ``code`` and
        ``stderr`` (None: none did)."""
        ...


def targets() -> dict[str, Target]:
    """Every target by name."""
    from llamaforge.deploy.targets.docker import DockerTarget
    from llamaforge.deploy.targets.systemd import SystemdTarget

    return {target.name: target for target in (SystemdTarget(), DockerTarget())}


def get_target(name: str) -> Target:
    """The target called ``name``; InvalidOption with "did you mean" otherwise."""
    known = targets()
    if name not in known:
        raise InvalidOption(
            f"unknown deploy target {name!r}",
            hint=suggest(name, known, end=" ") + "known: " + ", ".join(known),
        )
    return known[name]
