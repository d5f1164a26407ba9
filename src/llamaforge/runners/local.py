"""Build on this host: the same script as in Docker, with paths passed through LLAMAFORGE_* variables."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import BuildFailed, InvalidOption
from llamaforge.core.events import Reporter
from llamaforge.core.paths import home
from llamaforge.runners import RunRequest
from llamaforge.runners.process import LOCAL, ProcessRunner

_TOOLS = ("cmake", "ninja", "cc", "c++")


class LocalExecutor:
    """Executor that runs the build script directly on this machine (no Docker)."""

    name = "local"

    def __init__(self, runner: ProcessRunner = LOCAL) -> None:
        self.runner = runner

    def environment_id(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Fingerprint of the host toolchain (tool versions), standing in for a builder image id."""
        if plan.backend == "cuda" and shutil.which("nvcc") is None:
            raise InvalidOption(
                "the local executor needs nvcc for CUDA builds", hint="install a CUDA toolkit"
            )
        versions: list[str] = []
        for tool in (*_TOOLS, "ccache", "nvcc") if plan.backend == "cuda" else (*_TOOLS, "ccache"):
            path = shutil.which(tool)
            if path is None:
                if tool == "ccache":
                    continue
                raise InvalidOption(
                    f"the local executor needs {tool!r} on PATH",
                    hint="install cmake, ninja-build and a C/C++ compiler, or use --executor docker",
                )
            first = self.runner.run([path, "--version"], warn=True).stdout.splitlines()
            versions.append(f"{tool}={first[0] if first else '?'}")
        return "local:" + hashlib.sha256("\n".join(versions).encode()).hexdigest()[:32]

    def run(self, request: RunRequest) -> None:
        """Run the build script as a host process (through the process runner, which kills its whole process
        group on cancel or Ctrl-C)."""
        with tempfile.TemporaryDirectory(prefix="llamaforge-build-") as scratch:
            script = Path(scratch) / "build.sh"
            script.write_text(request.plan.build_script, encoding="utf-8")
            environment = {
                "LLAMAFORGE_SRC": str(request.source_tree),
                "LLAMAFORGE_BUILD": str(Path(scratch) / "build"),
                "LLAMAFORGE_OUT": str(request.out_dir),
                "CCACHE_DIR": str(home() / "ccache"),
            }
            if request.jobs:
                environment["LLAMAFORGE_JOBS"] = str(request.jobs)
            if not request.use_ccache:
                environment["CCACHE_DISABLE"] = "1"
            command = ["bash", str(script)]
            result = self.runner.run(
                command,
                env=environment,
                merge_stderr=True,
                on_line=request.log,
                cancel=request.cancel,
                warn=True,
            )
            if result.exit_code != 0:
                raise BuildFailed(
                    f"the build failed on this host (exit code {result.exit_code})",
                    command=command,
                    returncode=result.exit_code,
                    tail=list(request.log.tail),
                    log_path=str(request.log.path),
                    hint="read the full log; a compiler error usually points at a patch or a cmake option",
                )
