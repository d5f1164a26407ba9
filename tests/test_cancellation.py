"""Cancellation is reported as cancelled, never as a compile failure: SIGTERM to ``invoke build`` while it
compiles stops the build (its container is removed, or its host process group killed) and exits 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, marked_containers, mini_recipe

pytestmark = pytest.mark.quick

# Other processes on this machine may build concurrently: this test's containers carry this compile-job count.
MARK_JOBS = 5


def _sigterm_while_compiling(recipe: Path, env: dict[str, str], executor: str) -> tuple[int, str]:
    """Start ``invoke build --force``, send SIGTERM while ninja runs (the slow target takes a minute); exit code
    and stderr."""
    command = [
        sys.executable,
        "-m",
        "invoke",
        "build",
        "--force",
        "--verbose",
        "--recipe",
        str(recipe),
        "--executor",
        executor,
        "--jobs",
        str(MARK_JOBS),
    ]
    with subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        seen: list[str] = []
        for line in process.stderr:
            seen.append(line)
            if "Linking C executable" in line:  # ninja is compiling; the slow target runs beside it
                break
        else:
            pytest.fail("the build ended before it compiled:\n" + "".join(seen[-30:]))
        time.sleep(2)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        code = process.wait(timeout=60)
    assert time.monotonic() - started < 30, "SIGTERM must stop the running build, not wait for it"
    return code, rest


def _assert_reported_as_cancelled(code: int, output: str) -> None:
    assert code == 143, output
    assert "cancelled" in output and "SIGTERM" in output, output
    assert "compiler error" not in output and "build failed" not in output, output
    assert "ninja: build stopped" not in output, output


@pytest.mark.docker
def test_sigterm_during_a_docker_build_is_cancelled_and_removes_the_container(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str
) -> None:
    from llamaforge.build.store import list_builds

    before = marked_containers(docker_engine, MARK_JOBS)
    recipe = mini_recipe(tmp_path, ["llama-cli", "llama-slow"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    code, output = _sigterm_while_compiling(recipe, env, "docker")
    _assert_reported_as_cancelled(code, output)
    assert marked_containers(docker_engine, MARK_JOBS) - before == set(), (
        "the build container was left behind"
    )
    assert list_builds() == []


def test_sigterm_during_a_local_build_is_cancelled(tmp_path: Path, lf_home: Path) -> None:
    from conftest import require
    from llamaforge.build.store import list_builds

    require(all(map(_on_path, ("cmake", "ninja", "cc"))), "the local executor needs cmake, ninja and cc")
    recipe = mini_recipe(tmp_path, ["llama-cli", "llama-slow"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    code, output = _sigterm_while_compiling(recipe, env, "local")
    _assert_reported_as_cancelled(code, output)
    assert list_builds() == []


def _on_path(tool: str) -> bool:
    import shutil

    return shutil.which(tool) is not None
