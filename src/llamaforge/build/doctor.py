"""``doctor``: is this machine ready to build? Each check says what is wrong and what to do next."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamaforge.build.images import DEFAULT_TAG
from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.paths import home

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
    from llamaforge.runners.engine import docker_client

    try:
        client = docker_client()
    except LlamaforgeError as error:
        return [Check("docker", "fail", error.message, error.hint or "")]
    version = client.version()
    checks = [Check("docker", "ok", f"engine {version.get('Version')} (API {version.get('ApiVersion')})")]
    tags = {tag for image in client.images.list() for tag in image.tags}
    if DEFAULT_TAG in tags:
        checks.append(Check("base image", "ok", f"{DEFAULT_TAG} present"))
    else:
        checks.append(
            Check(
                "base image", "warn", f"{DEFAULT_TAG} missing", "run `invoke images.bootstrap` (needs root)"
            )
        )
    leftovers = client.containers.list(all=True, filters={"label": "org.llamaforge.owned"})
    if leftovers:
        names = ", ".join(container.short_id for container in leftovers)
        checks.append(Check("containers", "warn", f"leftover llamaforge containers: {names}",
                            "remove them with `docker rm -f` (they are labelled org.llamaforge.owned)"))  # fmt: skip
    return checks


def _tool(name: str, purpose: str, hint: str, required: bool = False) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, "fail" if required else "warn", f"not found ({purpose})", hint)
    first = subprocess.run([path, "--version"], capture_output=True, text=True, errors="replace")
    lines = (first.stdout or first.stderr).strip().splitlines()
    return Check(name, "ok", lines[-1] if name == "nvcc" and lines else (lines[0] if lines else path))


def run_doctor() -> list[Check]:
    """Run every check; never raises for an unhealthy machine (that is what the checks report)."""
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
    checks.append(_tool("git", "git sources and patch application", "apt-get install git", required=True))
    checks.append(_tool("debootstrap", "images.bootstrap", "apt-get install debootstrap"))
    checks.append(_tool("cmake", "local executor", "apt-get install cmake"))
    checks.append(_tool("ninja", "local executor", "apt-get install ninja-build"))
    checks.append(_tool("ccache", "local executor cache", "apt-get install ccache"))
    checks.append(_tool("nvcc", "CUDA compile checks", "pip install nvidia-cuda-nvcc (or a CUDA toolkit)"))
    return checks
