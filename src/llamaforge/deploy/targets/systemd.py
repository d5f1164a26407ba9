"""The systemd target: a hardened unit rendered from ``templates/deploy/llama-server.service.j2``, shipped in
each release and installed from ``current/`` as ``/etc/systemd/system/llamaforge-<name>.service`` as root (the
deploy user root, or sudo: :func:`~llamaforge.deploy.hosts.access.as_root`).

The unit runs llama-server as a dedicated system user in the sandbox of ``templates/deploy/sandbox.service.j2``
(``systemd-analyze security`` rates it "OK"): no capabilities, ``NoNewPrivileges``, ``ProtectSystem=strict`` (so
the release and the model are read-only to it), ``ProtectHome``, ``PrivateTmp``, the kernel, clock, hostname and
other processes out of reach, only the ``@system-service`` system calls and IP and local sockets, /dev closed
but for the build's GPU nodes (and for a CPU build no writable, executable memory), and, when it listens on
loopback, no address but localhost and its RPC workers. It restarts on failure. Every value in the unit passes
a systemd quoting filter (:mod:`llamaforge.core.templates`); a ``%`` (a specifier) is refused rather than
escaped, since no path or flag llamaforge writes has one and a probe hands the settings to ``systemd-run``.
"""

from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.exits import exec_main_signal, systemd_signal
from llamaforge.core.guard import is_loopback
from llamaforge.core.templates import render
from llamaforge.deploy.hosts.access import as_root, deploy_user
from llamaforge.deploy.hosts.probe import PROBE_BINARY, PROBE_LIMIT_S
from llamaforge.deploy.release import SERVICE_USER, Layout, ReleaseSpec
from llamaforge.deploy.targets.base import ServiceState, Target

if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping
    from pathlib import Path

    from llamaforge.core.events import CancelToken, Reporter
    from llamaforge.deploy.manifests.files import ManifestInputs
    from llamaforge.runners.ssh import SshProcessRunner

UNIT_FILE = "llama-server.service"
UNIT_DIR = "/etc/systemd/system"
# [Service] settings a probe does not take from the unit: it runs llama-bench once, not the server.
_NOT_FOR_PROBE = (
    "ExecStart",
    "ExecStartPre",
    "ExecStartPost",
    "ExecStop",
    "ExecStopPost",
    "ExecReload",
    "Restart",
    "RestartSec",
)


def unit_name(layout: Layout) -> str:
    """The unit's name on the host."""
    return f"llamaforge-{layout.name}.service"


def check_command(argv: Sequence[str], program: str) -> None:
    """Refuse a command line a unit cannot hold as it is: its first word is an absolute path (systemd reads
    prefixes such as ``+`` — run as root — from it after unquoting), and no word has a ``%`` (the unit quotes
    it, but a probe passes the unit's settings to ``systemd-run``, which would not)."""
    if not argv or not argv[0].startswith("/"):
        raise InvalidOption(
            f"{program}'s path {argv[0] if argv else ''!r} is not absolute",
            hint="deployments live under an absolute --root",
        )
    if any("%" in part for part in argv):
        raise InvalidOption(
            f"a % in {program}'s command line would be a systemd specifier",
            hint="use paths and flag values without %",
        )


def loopback_allow(spec: ReleaseSpec) -> list[str]:
    """``IPAddressAllow=`` of a llama-server that listens on loopback only: localhost and the addresses of its
    RPC workers (it connects to them). Empty — no IP restriction — beyond loopback, or when a worker is named
    by something other than an IP address."""
    if not is_loopback(spec.listen):
        return []
    allowed = ["localhost"]
    for endpoint in spec.flags.rpc or ():
        try:
            allowed.append(str(ipaddress.ip_address(endpoint.rpartition(":")[0].strip("[]"))))
        except ValueError:
            return []
    return allowed


def render_unit(spec: ReleaseSpec, layout: Layout, *, user: str = SERVICE_USER) -> str:
    """The unit file for ``spec`` (no release id in it: the id is a digest of this text): llama-server in the
    sandbox of ``templates/deploy/sandbox.service.j2``, which opens the build's GPU devices only and, on
    loopback, no other address."""
    argv = spec.server_argv(layout)
    check_command(argv, "llama-server")
    return render(
        "deploy/llama-server.service.j2",
        name=layout.name,
        user=user,
        current=layout.current,
        root=layout.root,
        argv=argv,
        rpc=bool(spec.flags.rpc),
        backend=spec.backend,
        ip_allow=loopback_allow(spec),
    )


def service_properties(unit: str, current: str, directory: str) -> list[str]:
    """The ``[Service]`` settings of ``unit`` (its text) as ``systemd-run`` properties, but those that start
    and restart the server, with every ``current`` path pointing at the release ``directory`` instead: the
    user, group, environment (``LD_LIBRARY_PATH``) and sandbox the service gets once ``current`` points there."""
    section, properties = "", []
    for raw in unit.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]" and key not in _NOT_FOR_PROBE:
            properties.append(f"{key}={value.replace(current, directory)}")
    return properties


class RootNotOwned(LlamaforgeError):
    """A deployment directory on a host exists and is not the deploy user's (or is no directory): it is never
    re-owned."""

    exit_code = ExitCode.ROOT_NOT_OWNED


NOT_OWNED_EXIT = 3
# $1 the service user, $2 the deploy user, $3 the deployment's directory. `install -d -o` would re-own a
# directory that exists, so it only creates: one that exists must be a directory (no symlink) of the deploy user.
PREPARE_SCRIPT = r"""
id -u "$1" >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$1" \
  || exit 1
owner=$(id -u "$2") || exit 1
for dir in "$3" "$3/releases" "$3/models"; do
  if [ -L "$dir" ] || { [ -e "$dir" ] && [ ! -d "$dir" ]; }; then
    echo "llamaforge: $dir is there and is no directory" >&2
    exit 3
  elif [ -d "$dir" ]; then
    if [ "$(stat -c %u "$dir")" != "$owner" ]; then
      echo "llamaforge: $dir is there, owned by $(stat -c %U "$dir"), not by the deploy user $2" >&2
      exit 3
    fi
  else
    install -d -m 0755 -o "$2" -g "$2" "$dir" || exit 1
  fi
done
"""


class SystemdTarget(Target):
    """llama-server as a systemd service (see the module docstring)."""

    name = "systemd"
    summary = "on the hosts"
    renders = True  # deploy.render --target systemd: the unit this target installs
    heads_topology = True
    unit_file = UNIT_FILE  # the unit's file name inside a release

    def unit(self, layout: Layout) -> str:
        """The unit's name on the host."""
        return unit_name(layout)

    def for_spec(self, spec: ReleaseSpec, reporter: Reporter) -> SystemdTarget:
        """This target: every release runs the same way."""
        return self

    def files(self, spec: ReleaseSpec) -> list[tuple[Path, str]]:
        """The build's binaries and the libraries they need (:func:`~llamaforge.deploy.release.release_files`)."""
        from llamaforge.deploy.release import release_files

        return release_files(spec)

    def check(self, runner: SshProcessRunner) -> None:
        """Nothing to check beyond root access, which planning checks for every target
        (:func:`~llamaforge.deploy.hosts.access.check_root_access`)."""

    def deliver(self, runner: SshProcessRunner, layout: Layout, cancel: CancelToken | None = None) -> int:
        """Nothing beyond the release's files."""
        return 0

    def pending(self, runner: SshProcessRunner) -> str:
        """Nothing beyond the release's files."""
        return ""

    def listens(self, spec: ReleaseSpec) -> tuple[str, int] | None:
        """llama-server's ``--host`` and ``--port``."""
        return spec.listen, spec.port

    def service_files(self, spec: ReleaseSpec, layout: Layout) -> dict[str, str]:
        """The unit, as ``llama-server.service`` inside the release."""
        return {UNIT_FILE: render_unit(spec, layout)}

    def prepare(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Create the service user (a system user without a home or a shell) and the deployment's directories,
        owned by the deploy user so releases upload as that user. A directory that is there already is never
        re-owned: one the deploy user does not own, or that is no directory (a symlink included), refuses the
        host (:class:`RootNotOwned`)."""
        deployer = deploy_user(runner)[1]
        script = ["sh", "-c", PREPARE_SCRIPT, "sh", SERVICE_USER, deployer, layout.root]
        result = runner.run(
            as_root(runner, script), warn=True, what=f"preparing {layout.root} on {runner.host.host}"
        )
        if result.exit_code == NOT_OWNED_EXIT:
            said = (result.stderr.strip().splitlines() or ["a directory is not the deploy user's"])[-1]
            raise RootNotOwned(
                f"{runner.host.address}: {said.removeprefix('llamaforge: ')}",
                hint="deploy with another --root or --name; llamaforge re-owns no directory it did not make "
                "(if it is this deployment's, give it to the deploy user there yourself); nothing was changed",
            )
        if not result.ok:
            raise RootNotOwned(
                f"{runner.host.address}: preparing {layout.root} failed: {result.stderr.strip()[-300:]}",
                hint="deploy as root there, or give the deploy user passwordless sudo",
            )

    def prune(self, runner: SshProcessRunner, layout: Layout, removed: Sequence[str]) -> None:
        """Remove the releases' directories (the unit installed is ``current``'s, never theirs)."""
        runner.run(["rm", "-rf", "--", *(layout.release(rid) for rid in removed)])

    def activation(self, layout: Layout) -> list[str]:
        """Install ``current``'s unit, reload systemd and restart the service (a command for root)."""
        unit = self.unit(layout)
        script = (
            'install -m 0644 -o root -g root "$1" "$2" && systemctl daemon-reload && systemctl reset-failed "$3"'
            ' 2>/dev/null; systemctl enable --quiet "$3" && systemctl restart "$3"'
        )
        source = posixpath.join(layout.current, self.unit_file)
        return ["sh", "-c", script, "sh", source, posixpath.join(UNIT_DIR, unit), unit]

    def activate(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Run :meth:`activation` on the host, as root."""
        runner.run(
            as_root(runner, self.activation(layout)),
            what=f"restarting {self.unit(layout)} on {runner.host.host}",
        )

    def stop(self, runner: SshProcessRunner, layout: Layout) -> None:
        """``systemctl stop`` the unit."""
        runner.run(as_root(runner, ["systemctl", "stop", self.unit(layout)]), warn=True)

    def state(self, runner: SshProcessRunner, layout: Layout) -> ServiceState:
        """``ActiveState``, ``NRestarts`` and the signal ``ExecMainCode``/``ExecMainStatus`` name (a main process
        that was killed, until it is started again) from ``systemctl show``."""
        shown = runner.run(
            [
                "systemctl",
                "show",
                "-p",
                "ActiveState",
                "-p",
                "NRestarts",
                "-p",
                "ExecMainCode",
                "-p",
                "ExecMainStatus",
                self.unit(layout),
            ],
            warn=True,
        ).stdout
        values = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        restarts = values.get("NRestarts", "0")
        return ServiceState(
            values.get("ActiveState", "unknown"),
            int(restarts) if restarts.isdigit() else 0,
            exec_main_signal(values.get("ExecMainCode", ""), values.get("ExecMainStatus", "")),
        )

    def logs(self, runner: SshProcessRunner, layout: Layout, lines: int = 20) -> list[str]:
        """The unit's last journal lines."""
        result = runner.run(
            as_root(
                runner, ["journalctl", "-u", self.unit(layout), "-n", str(lines), "--no-pager", "-o", "cat"]
            ),
            warn=True,
        )
        return result.stdout.splitlines()

    def probe_command(
        self, layout: Layout, rid: str, service_files: Mapping[str, str], model: str, args: Sequence[str]
    ) -> list[str]:
        """``systemd-run --wait --pipe`` of the release's llama-bench as a transient unit with the settings of
        the release's own unit (:func:`service_properties`), stopped by systemd after
        :data:`~llamaforge.deploy.hosts.probe.PROBE_LIMIT_S`; systemd-run's summary names a signal that ended it (a
        command for root)."""
        directory = layout.release(rid)
        properties = service_properties(service_files[self.unit_file], layout.current, directory)
        name = f"{self.unit(layout).removesuffix('.service')}-probe-{rid}"
        command = [
            "systemd-run",
            "--wait",
            "--pipe",
            "--collect",
            f"--unit={name}",
            f"--property=RuntimeMaxSec={PROBE_LIMIT_S}",
        ]
        command += [f"--property={item}" for item in properties]
        return [*command, "--", posixpath.join(directory, "bin", PROBE_BINARY), *args]

    def probe_signal(self, code: int, stderr: Sequence[str]) -> signal.Signals | None:
        """The signal in systemd-run's summary (``code=killed/status=ILL``; its own exit is then 255)."""
        return systemd_signal(stderr) if code != 0 else None

    def verify(self, runner: SshProcessRunner, layout: Layout) -> list[str]:
        """``systemd-analyze verify`` of the installed unit on the host: its complaints (empty when clean)."""
        result = runner.run(
            ["systemd-analyze", "verify", posixpath.join(UNIT_DIR, self.unit(layout))],
            warn=True,
            merge_stderr=True,
        )
        return (
            [line for line in result.stdout.splitlines() if line.strip()]
            if not result.ok or result.stdout
            else []
        )

    def manifests(self, spec: ReleaseSpec, inputs: ManifestInputs, layout: Layout) -> dict[str, str]:
        """The unit this target installs, for hosts deployed with other tools."""
        return {unit_name(layout): render_unit(spec, layout)}
