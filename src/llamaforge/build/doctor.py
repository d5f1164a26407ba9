"""``doctor``: is this machine ready to build? Each check says what is wrong and what to do next."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamaforge.build.images import DEFAULT_TAG
from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.paths import home
from llamaforge.runners.engine import LABEL, engine_status
from llamaforge.runners.process import LOCAL, ProcessRunner

Status = Literal["ok", "warn", "fail"]
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
MIN_FREE_GIB = 10.0


@dataclass(frozen=True)
class Check:
    """One readiness check."""

    name: str
    status: Status
    detail: str
    hint: str = ""


def _docker_checks() -> list[Check]:
    try:
        engine = engine_status()
    except LlamaforgeError as error:
        return [Check("docker", "fail", error.message, error.hint or "")]
    checks = [Check("docker", "ok", f"engine {engine.version} (API {engine.api_version})")]
    if DEFAULT_TAG in engine.image_tags:
        checks.append(Check("base image", "ok", f"{DEFAULT_TAG} present"))
    else:
        checks.append(
            Check(
                "base image", "warn", f"{DEFAULT_TAG} missing", "run `invoke images.bootstrap` (needs root)"
            )
        )
    if engine.leftover_containers:
        names = ", ".join(engine.leftover_containers)
        checks.append(Check("containers", "warn", f"leftover llamaforge containers: {names}",
                            f"remove them with `docker rm -f` (they are labelled {LABEL})"))  # fmt: skip
    return checks


def _tool(runner: ProcessRunner, name: str, purpose: str, hint: str, required: bool = False) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, "fail" if required else "warn", f"not found ({purpose})", hint)
    first = runner.run([path, "--version"], warn=True)
    lines = (first.stdout or first.stderr).strip().splitlines()
    return Check(name, "ok", lines[-1] if name == "nvcc" and lines else (lines[0] if lines else path))


def run_doctor(runner: ProcessRunner = LOCAL) -> list[Check]:
    """Run every check; never raises for an unhealthy machine (that is what the checks report); ``runner``
    asks each tool its version."""
    checks = _docker_checks()
    root = home()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free / 2**30
    checks.append(
        Check("disk", "ok" if free >= MIN_FREE_GIB else "warn", f"{free:.1f} GiB free at {root}",
              "" if free >= MIN_FREE_GIB else f"a build needs about {MIN_FREE_GIB:.0f} GiB; set LLAMAFORGE_HOME")
    )  # fmt: skip
    if SYSTEM_CA_BUNDLE.is_file():
        checks.append(Check("ca bundle", "ok", f"{SYSTEM_CA_BUNDLE} (pass --ca-bundle behind a TLS proxy)"))
    else:
        checks.append(Check("ca bundle", "warn", f"{SYSTEM_CA_BUNDLE} missing", "install ca-certificates"))
    checks.append(
        _tool(runner, "git", "git sources and patch application", "apt-get install git", required=True)
    )
    checks.append(_tool(runner, "debootstrap", "images.bootstrap", "apt-get install debootstrap"))
    checks.append(_tool(runner, "cmake", "local executor", "apt-get install cmake"))
    checks.append(_tool(runner, "ninja", "local executor", "apt-get install ninja-build"))
    checks.append(_tool(runner, "ccache", "local executor cache", "apt-get install ccache"))
    checks.append(
        _tool(runner, "nvcc", "CUDA compile checks", "pip install nvidia-cuda-nvcc (or a CUDA toolkit)")
    )
    return checks
