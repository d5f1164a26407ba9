"""Build on a build host over SSH: a Linux box, a Mac (Metal), or a Windows machine whose OpenSSH server runs a
POSIX shell (Git for Windows' bash as ``DefaultShell``) — the same transport for all three.

The patched source travels as one tarball (sent with the SSH runner's sha256-verified, resumable transfer, and
skipped when the host already has it), the plan's script runs with the platform's interpreter (``bash`` for
Linux and macOS, PowerShell for Windows) and ``LLAMAFORGE_SRC/BUILD/OUT`` pointing into a work directory on the
host, every output line streams into the build log, and ``out/`` comes back as a tarball that is unpacked into
the build's staging directory. Host keys follow deploy's policy: unknown hosts and changed keys are refused
unless new keys are accepted explicitly.
"""

from __future__ import annotations

import gzip
import hashlib
import posixpath
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from llamaforge.build.executors.base import HostExecutor, RunRequest, tool_versions
from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import Event, Reporter
from llamaforge.core.validation import suggest
from llamaforge.runners.ssh import SshHost, SshProcessRunner, file_sha256, parse_host

WORK_ROOT = ".cache/llamaforge"  # under the build user's home on the host
SETTINGS = ("host", "key", "known_hosts", "accept_new_host_keys", "work_root")


def _flag(settings: Mapping[str, str], name: str) -> bool:
    value = settings.get(name, "").strip().lower()
    if value not in ("", "0", "1", "false", "true", "no", "yes"):
        raise InvalidOption(f"executor setting {name}={value!r} is not true/false", hint=f"{name}=true")
    return value in ("1", "true", "yes")


def _source_tarball(tree: Path, scratch: Path) -> Path:
    """The tree as a reproducible gzip tarball (sorted names, no owners, fixed times) named by its sha256."""
    staged = scratch / "source.tar.gz"

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with (
        staged.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for path in sorted(tree.rglob("*")):
            archive.add(path, arcname=path.relative_to(tree).as_posix(), recursive=False, filter=clean)
    digest = file_sha256(staged)
    named = scratch / f"source-{digest[:16]}.tar.gz"
    staged.rename(named)
    return named


def check_key_file(key: Path, origin: str) -> None:
    """Refuse a private key that is no file: the host's refusal would name a key that was never offered."""
    if not key.is_file():
        what = "is a directory, not a key file" if key.is_dir() else "does not exist"
        raise InvalidOption(
            f"{origin} {key} {what}",
            hint="give the private key file (e.g. ~/.ssh/id_ed25519), or leave it out to use the SSH agent",
        )


class SshBuildExecutor(HostExecutor):
    """Executor that runs the plan's script on a build host over SSH (see the module docstring)."""

    name = "ssh"
    settings = SETTINGS
    runner: SshProcessRunner

    def __init__(
        self, host: SshHost, *, accept_new_host_keys: bool = False, work_root: str = WORK_ROOT
    ) -> None:
        self.host = host
        self.work_root = work_root
        self.runner = SshProcessRunner(host, accept_new_host_keys=accept_new_host_keys)

    def location(self) -> str:
        """The build host, ``user@host:port``."""
        return f"ssh://{self.host.address}"

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Self:
        """The executor from ``--executor ssh`` settings: host (``user@host:port``, required), key,
        known_hosts, accept_new_host_keys, work_root."""
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise InvalidOption(
                f"unknown ssh executor setting {unknown[0]!r}",
                hint=suggest(unknown[0], SETTINGS, end=" ") + "known: " + ", ".join(SETTINGS),
            )
        if not settings.get("host"):
            raise InvalidOption(
                "the ssh executor needs a build host", hint="pass --build-host user@host:port"
            )
        key = Path(settings["key"]).expanduser() if settings.get("key") else None
        if key is not None:
            check_key_file(key, "--ssh-key")
        known = Path(settings["known_hosts"]).expanduser() if settings.get("known_hosts") else None
        if known is not None and known.is_dir():  # read only when a file, so a host key was "unknown"
            raise InvalidOption(
                f"--known-hosts {known} is a directory, not a known_hosts file",
                hint="give a file (it need not exist yet: new host keys are recorded there)",
            )
        return cls(
            parse_host(settings["host"], key_file=key, known_hosts=known),
            accept_new_host_keys=_flag(settings, "accept_new_host_keys"),
            work_root=settings.get("work_root") or WORK_ROOT,
        )

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Fingerprint of the host (its system and the plan's tool versions); a missing tool is an
        InvalidOption naming the host and the tool (llamaforge does not install toolchains on hosts)."""
        reporter(Event("stage", f"checking build host {self.host.address}", stage="environment"))
        return self.fingerprint(plan)

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        """Executor, host and toolchain fingerprint for the manifest."""
        return {"executor": self.name, "host": self.host.address, "environment_id": environment_id}

    def fingerprint(self, plan: BuildPlan) -> str:
        """The host's system, address and tool versions for ``plan``; InvalidOption for a missing tool."""
        lines = [self.runner.run(["uname", "-sm"], warn=True).stdout.strip()]
        lines += tool_versions(self.runner, plan.environment.host_tools, f"build host {self.host.address}")
        digest = hashlib.sha256("\n".join([self.host.address, *lines]).encode()).hexdigest()[:32]
        return f"ssh:{digest}"

    def _home(self) -> str:
        return self.runner.run(["sh", "-c", 'printf %s "$HOME"']).stdout.strip()

    def run(self, request: RunRequest) -> None:
        """Send the source, run the script on the host, fetch ``out/`` back; the host's work directory for this
        build is removed afterwards (the source tarball and ccache stay for the next build)."""
        plan = request.plan
        root = posixpath.join(self._home(), self.work_root)
        work = posixpath.join(root, "work", plan.plan_digest[:16])
        with tempfile.TemporaryDirectory(prefix="llamaforge-ssh-build-") as scratch_name:
            scratch = Path(scratch_name)
            request.log(f"llamaforge: sending source to {self.host.address}")
            tarball = _source_tarball(request.source_tree, scratch)
            remote_tarball = posixpath.join(root, "sources", tarball.name)
            self.runner.put(tarball, remote_tarball, cancel=request.cancel)
            self.runner.run(["rm", "-rf", "--", work])
            self.runner.run(["mkdir", "-p", "--", f"{work}/src", f"{work}/build", f"{work}/out"])
            self.runner.run(["tar", "-xzf", remote_tarball, "-C", f"{work}/src"], cancel=request.cancel)
            script = posixpath.join(work, plan.script.name)
            (scratch / plan.script.name).write_text(plan.script.text, encoding="utf-8", newline="\n")
            self.runner.put(scratch / plan.script.name, script)
            try:
                self._run_script(request, work, script)
                self.runner.run(["tar", "-cf", f"{work}/out.tar", "-C", f"{work}/out", "."])
                self.runner.get(f"{work}/out.tar", scratch / "out.tar", cancel=request.cancel)
            finally:
                self.runner.run(["rm", "-rf", "--", work], warn=True)
            with tarfile.open(scratch / "out.tar") as archive:
                archive.extractall(request.out_dir, filter="data")

    def _run_script(self, request: RunRequest, work: str, script: str) -> None:
        environment = {
            "LLAMAFORGE_SRC": f"{work}/src",
            "LLAMAFORGE_BUILD": f"{work}/build",
            "LLAMAFORGE_OUT": f"{work}/out",
            "CCACHE_DIR": posixpath.join(posixpath.dirname(posixpath.dirname(work)), "ccache"),
            **request.script_environment(),
        }
        command = request.plan.script.command(script)
        result = self.runner.run(
            command, env=environment, merge_stderr=True, on_line=request.log, cancel=request.cancel, warn=True
        )
        if result.exit_code != 0:
            raise request.failed(
                f"on {self.host.address}",
                command,
                result.exit_code,
                "read the full log; the script names a missing toolchain itself (Visual Studio, CUDA, Xcode)",
            )

    def close(self) -> None:
        """Close the SSH connection."""
        self.runner.close()
