"""Build on this host: the same script as in Docker, with paths passed through LLAMAFORGE_* variables."""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

from llamaforge.build.executors.base import HostExecutor, RunRequest, tool_versions
from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import InvalidOption
from llamaforge.core.paths import home
from llamaforge.runners.process import LOCAL, ProcessRunner

_THIS_PLATFORM = {"linux": "linux", "darwin": "macos", "win32": "windows"}


class LocalExecutor(HostExecutor):
    """Executor that runs the build script directly on this machine (no Docker)."""

    name = "local"

    def __init__(self, runner: ProcessRunner = LOCAL) -> None:
        self.runner = runner

    def location(self) -> str:
        """This host."""
        return "local (this host)"

    def fingerprint(self, plan: BuildPlan) -> str:
        """Tool versions of this host for ``plan``; InvalidOption for a plan of another platform or a missing
        tool."""
        here = _THIS_PLATFORM.get(sys.platform, sys.platform)
        if plan.recipe.platform != here:
            raise InvalidOption(
                f"a {plan.recipe.platform} build cannot run on this {here} host",
                hint=f"build on a {plan.recipe.platform} host: --executor ssh --build-host user@host:port",
            )
        versions = tool_versions(self.runner, plan.environment.host_tools, "this host")
        return "local:" + hashlib.sha256("\n".join(versions).encode()).hexdigest()[:32]

    def run(self, request: RunRequest) -> None:
        """Run the build script as a host process (through the process runner, which kills its whole process
        group on cancel or Ctrl-C)."""
        with tempfile.TemporaryDirectory(prefix="llamaforge-build-") as scratch:
            script = Path(scratch) / request.plan.script.name
            script.write_text(request.plan.script.text, encoding="utf-8")
            environment = {
                "LLAMAFORGE_SRC": str(request.source_tree),
                "LLAMAFORGE_BUILD": str(Path(scratch) / "build"),
                "LLAMAFORGE_OUT": str(request.out_dir),
                "CCACHE_DIR": str(home() / "ccache"),
                **request.script_environment(),
            }
            command = request.plan.script.command(str(script))
            result = self.runner.run(
                command,
                env=environment,
                merge_stderr=True,
                on_line=request.log,
                cancel=request.cancel,
                warn=True,
            )
            if result.exit_code != 0:
                raise request.failed(
                    "on this host",
                    command,
                    result.exit_code,
                    "read the full log; a compiler error usually points at a patch or a cmake option",
                )
