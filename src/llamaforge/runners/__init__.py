"""Executors run a BuildPlan's script on prepared source: in Docker, or on this host.

Callers pass an ``Executor`` instance (``make_executor`` makes one from a name and settings); a new target
(a cloud builder) is a module with a factory registered in ``EXECUTORS``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Event, Reporter

if TYPE_CHECKING:
    # Only for annotations: build modules import runners.process, so runners must not import build at load.
    from llamaforge.build.plan import BuildPlan
    from llamaforge.platforms import HostTool
    from llamaforge.runners.process import ProcessRunner

TAIL_LINES = 40


@dataclass
class LogSink:
    """Writes every build line to a log file, forwards it as an event and keeps the last lines."""

    path: Path
    reporter: Reporter
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8", buffering=1)

    def __call__(self, line: str) -> None:
        self._handle.write(line + "\n")
        self.tail.append(line)
        stage = "build"
        if line.startswith("llamaforge: "):
            self.reporter(Event("stage", line.removeprefix("llamaforge: "), stage=stage))
        elif line.startswith("[") and "/" in line.split("]", 1)[0]:
            done, _, total = line[1:].split("]", 1)[0].partition("/")
            if done.strip().isdigit() and total.strip().isdigit():
                self.reporter(Event("progress", line, stage=stage, completed=int(done), total=int(total)))
                return
        self.reporter(Event("log", line, stage=stage))

    def close(self) -> None:
        """Flush and close the log file."""
        self._handle.close()


@dataclass(frozen=True)
class RunRequest:
    """One execution of a plan's build script."""

    plan: BuildPlan
    source_tree: Path
    out_dir: Path
    log: LogSink
    cancel: CancelToken
    use_ccache: bool = True
    jobs: int | None = None

    def script_environment(self) -> dict[str, str]:
        """What every executor sets for the build script besides its paths: the job count when one is given, and
        ccache's mode. ccache is off for a reproducibility rebuild; otherwise it runs in depend mode, which hashes
        the compiler's own ``-MD`` dependency list instead of running the preprocessor a second time, so a miss
        (every unit of a cold build) costs little more than the compile. Neither changes an output (the
        reproducibility check compares a ccache build with a build without it), so neither is part of the build
        key; ccache falls back to its preprocessor mode by itself for a compiler without ``-MD``."""
        environment = {"LLAMAFORGE_JOBS": str(self.jobs)} if self.jobs else {}
        environment.update({"CCACHE_DEPEND": "1"} if self.use_ccache else {"CCACHE_DISABLE": "1"})
        return environment


class Executor(Protocol):
    """Runs a plan's build script somewhere: prepares the plan's environment, then runs the script in it."""

    name: str

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        """Id of the plan's environment if it is ready (the builder image exists, the host has the tools),
        else None; prepares nothing."""
        ...

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Make the plan's environment ready (build the builder image, check the host's tools); return its id."""
        ...

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        """Provenance of the prepared environment for the build manifest (``image`` block)."""
        ...

    def run(self, request: RunRequest) -> None:
        """Run the plan's script; artifacts land in ``request.out_dir``. Raises BuildFailed / Cancelled."""
        ...


def tool_versions(runner: ProcessRunner, tools: Sequence[HostTool], where: str) -> list[str]:
    """``NAME=<first line of NAME --version>`` for each of ``tools`` on ``runner``'s host (a host executor's
    toolchain fingerprint); a missing required tool is an InvalidOption naming ``where`` and the tool."""
    versions: list[str] = []
    for tool in tools:
        found = runner.run(["sh", "-c", 'command -v "$0"', tool.name], warn=True)
        if not found.ok:
            if tool.optional:
                continue
            raise InvalidOption(
                f"{where} has no {tool.name!r} on PATH", hint=tool.hint or f"install {tool.name}"
            )
        first = runner.run([found.stdout.strip(), "--version"], warn=True).stdout.splitlines()
        versions.append(f"{tool.name}={first[0] if first else '?'}")
    return versions


ExecutorFactory = Callable[[Mapping[str, str]], Executor]
"""Makes an executor from its settings (strings, e.g. ``{"url": "ssh://builder@host"}`` for docker)."""


def _docker(settings: Mapping[str, str]) -> Executor:
    from llamaforge.runners.docker import DockerExecutor
    from llamaforge.runners.engine import EngineConfig

    return DockerExecutor(EngineConfig.from_settings(settings))


def _local(settings: Mapping[str, str]) -> Executor:
    from llamaforge.runners.local import LocalExecutor

    if settings:
        raise InvalidOption(
            f"the local executor takes no settings (got {', '.join(sorted(settings))})", hint="drop them"
        )
    return LocalExecutor()


def _ssh(settings: Mapping[str, str]) -> Executor:
    from llamaforge.runners.ssh_build import SshBuildExecutor

    return SshBuildExecutor.from_settings(settings)


# Every executor, by the name users pick with --executor. Settings each one reads:
#   docker: url (DOCKER_HOST form: unix://, tcp://HOST:2376, ssh://USER@HOST), tls_verify, cert_path
#   local:  none
#   ssh:    host (user@host:port), key, known_hosts, accept_new_host_keys, work_root
EXECUTORS: dict[str, ExecutorFactory] = {"docker": _docker, "local": _local, "ssh": _ssh}


def make_executor(name: str, settings: Mapping[str, str] | None = None) -> Executor:
    """The executor ``name`` configured with ``settings`` (see ``EXECUTORS``); connects to nothing yet."""
    factory = EXECUTORS.get(name)
    if factory is None:
        choices = " or ".join(f"--executor {known}" for known in EXECUTORS)
        raise InvalidOption(f"unknown executor {name!r}", hint=f"use {choices}")
    return factory(dict(settings or {}))
