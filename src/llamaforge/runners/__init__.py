"""Executors run a BuildPlan's script on prepared source: in Docker, or on this host.

Callers only see the ``Executor`` protocol; new targets (SSH build hosts) slot in here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Event, Reporter

if TYPE_CHECKING:
    # Only for annotations: build modules import runners.process, so runners must not import build at load.
    from llamaforge.build.plan import BuildPlan

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


class Executor(Protocol):
    """Runs build scripts somewhere."""

    name: str

    def environment_id(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Identify the build environment (builder image id, host toolchain); prepares it if needed."""
        ...

    def run(self, request: RunRequest) -> None:
        """Run the plan's script; artifacts land in ``request.out_dir``. Raises BuildFailed / Cancelled."""
        ...


def get_executor(name: str) -> Executor:
    """The executor called ``name`` (``docker`` or ``local``)."""
    if name == "docker":
        from llamaforge.runners.docker import DockerExecutor

        return DockerExecutor()
    if name == "local":
        from llamaforge.runners.local import LocalExecutor

        return LocalExecutor()
    raise InvalidOption(f"unknown executor {name!r}", hint="use --executor docker or --executor local")
