"""What every build executor shares: the run request, the build log, the executor base class and the host
toolchain fingerprint of the executors that build on a host (this one, or an SSH build host)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from llamaforge.core.errors import BuildFailed, InvalidOption
from llamaforge.core.events import CancelToken, Event, Reporter

if TYPE_CHECKING:
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

    def failed(self, where: str, command: Sequence[str], exit_code: int, hint: str) -> BuildFailed:
        """The BuildFailed of this run's script (exit code ``exit_code`` ``where``), with the log's tail."""
        return BuildFailed(
            f"the build failed {where} (exit code {exit_code})",
            command=list(command),
            returncode=exit_code,
            tail=list(self.log.tail),
            log_path=str(self.log.path),
            hint=hint,
        )


class Executor(ABC):
    """Runs a plan's build script somewhere: prepares the plan's environment, then runs the script in it.

    A new executor (a cloud builder) subclasses this in a module of its own and is registered in
    :data:`llamaforge.build.executors.EXECUTORS`; the hooks below have defaults where one fits every executor.
    """

    name: ClassVar[str]
    settings: ClassVar[tuple[str, ...]] = ()
    """The settings :meth:`from_settings` reads (``--executor NAME`` options as strings)."""

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Self:
        """The executor configured with ``settings``; the default takes none and refuses any."""
        if settings:
            raise InvalidOption(
                f"the {cls.name} executor takes no settings (got {', '.join(sorted(settings))})",
                hint="drop them",
            )
        return cls()

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        """Id of the plan's environment if it is ready (the builder image exists, the host has the tools),
        else None; prepares nothing. The default knows nothing before preparing: None."""
        return None

    @abstractmethod
    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Make the plan's environment ready (build the builder image, check the host's tools); return its id."""

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        """Provenance of the prepared environment for the build manifest (``image`` block); the default names
        the executor and the environment id."""
        return {"executor": self.name, "environment_id": environment_id}

    @abstractmethod
    def run(self, request: RunRequest) -> None:
        """Run the plan's script; artifacts land in ``request.out_dir``. Raises BuildFailed / Cancelled."""

    def location(self) -> str:
        """Where it builds, for reports and manifests (no secret in it); the default: the executor's name."""
        return self.name


class HostExecutor(Executor):
    """An executor that builds on a host with its own toolchain (no builder image): the environment id is a
    fingerprint of the host's tools, which llamaforge checks but never installs."""

    runner: ProcessRunner

    @abstractmethod
    def fingerprint(self, plan: BuildPlan) -> str:
        """The host's toolchain fingerprint for ``plan`` (from :func:`tool_versions`); InvalidOption when the
        host cannot build it."""

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        """The host's toolchain fingerprint when it has the plan's tools, else None (changes nothing)."""
        try:
            return self.fingerprint(plan)
        except InvalidOption:
            return None

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """The host's toolchain fingerprint, standing in for a builder image id; a missing tool is an
        InvalidOption naming the host and the tool."""
        return self.fingerprint(plan)


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
