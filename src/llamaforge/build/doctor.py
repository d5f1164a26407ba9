"""``doctor``: is this machine ready to build? Each check says what is wrong and what to do next."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from llamaforge.backends import BACKENDS
from llamaforge.build.ca_bundle import find_host_bundle
from llamaforge.build.images import DEFAULT_TAG
from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.paths import home
from llamaforge.runners.engine import LABEL, OwnedContainer, engine_status
from llamaforge.runners.process import LOCAL, ProcessRunner

Status = Literal["ok", "warn", "fail"]
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
    return checks + _container_checks(engine.containers)


def _container_checks(containers: Sequence[OwnedContainer]) -> list[Check]:
    """Stopped llamaforge containers are leftovers, safe to remove; running ones may be a build in progress
    and are named as running, with the safe way to stop them (never `docker rm -f`, which kills a live build)."""
    checks = []
    stopped = [c for c in containers if not c.running]
    running = [c for c in containers if c.running]
    if stopped:
        ids = " ".join(c.short_id for c in stopped)
        checks.append(
            Check(
                "containers",
                "warn",
                f"stopped llamaforge containers left behind: {_names(stopped)}",
                f"remove them with `docker rm {ids}` (they are labelled {LABEL})",
            )
        )
    if running:
        ids = " ".join(c.short_id for c in running)
        checks.append(
            Check(
                "running containers",
                "ok",
                f"llamaforge containers running now: {_names(running)}",
                "a build or smoke in progress uses them: let it finish, or stop it with Ctrl-C (or cancel its job), "
                f"which removes its container; only if no llamaforge process is left, `docker stop {ids}`",
            )
        )
    return checks


def _names(containers: Sequence[OwnedContainer]) -> str:
    return ", ".join(f"{c.short_id} ({c.role or 'container'} {c.name}, {c.state})" for c in containers)


def _ca_bundle_check() -> Check:
    """The CA bundle the host's settings name, which builds install in builder images that download over TLS
    (see :mod:`llamaforge.build.ca_bundle`)."""
    try:
        found = find_host_bundle()
    except LlamaforgeError as error:  # a pip config file that cannot be read
        return Check("ca bundle", "warn", error.message, error.hint or "")
    if found is None:
        return Check(
            "ca bundle",
            "ok",
            "none set (PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, pip's global.cert)",
            "behind a TLS-intercepting proxy, set PIP_CERT to the bundle that trusts it, or pass --ca-bundle PATH",
        )
    if not found.exists:
        return Check(
            "ca bundle",
            "warn",
            f"{found.path} from {found.origin} {found.absence}",
            f"point {found.setting} at a CA bundle file or unset it (builds refuse it), or build with --no-ca-bundle",
        )
    try:
        certificates = found.path.read_bytes().count(b"-----BEGIN CERTIFICATE-----")
    except OSError as error:
        return Check(
            "ca bundle",
            "warn",
            f"{found.path} from {found.origin} cannot be read: {error.strerror}",
            "make it readable, or build with --no-ca-bundle",
        )
    counted = f"{certificates} certificate{'' if certificates == 1 else 's'}"
    return Check(
        "ca bundle",
        "ok",
        f"{found.path} from {found.origin} ({counted}): builder images that download over TLS "
        "(CUDA) install it",
        "--no-ca-bundle builds without it, --ca-bundle PATH picks another",
    )


def _tool(runner: ProcessRunner, name: str, purpose: str, hint: str, required: bool = False) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, "fail" if required else "warn", f"not found ({purpose})", hint)
    first = runner.run([path, "--version"], warn=True)
    lines = (first.stdout or first.stderr).strip().splitlines()
    return Check(name, "ok", lines[-1] if name == "nvcc" and lines else (lines[0] if lines else path))


def _disk_check() -> Check:
    """Free space where builds and models go; a home that is a file, or cannot be made, fails the check."""
    root = home()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file there (FileExistsError), or a parent this user cannot write
        what = "is a file, not a directory" if root.is_file() else f"cannot be made: {error.strerror}"
        return Check(
            "disk",
            "fail",
            f"{root}, where builds and models go, {what}",
            "point LLAMAFORGE_HOME at a directory this user can write",
        )
    free = shutil.disk_usage(root).free / 2**30
    return Check(
        "disk",
        "ok" if free >= MIN_FREE_GIB else "warn",
        f"{free:.1f} GiB free at {root}",
        "" if free >= MIN_FREE_GIB else f"a build needs about {MIN_FREE_GIB:.0f} GiB; set LLAMAFORGE_HOME",
    )


def run_doctor(runner: ProcessRunner = LOCAL) -> list[Check]:
    """Run every check; never raises for an unhealthy machine (that is what the checks report); ``runner``
    asks each tool its version."""
    checks = _docker_checks()
    checks.append(_disk_check())
    checks.append(_ca_bundle_check())
    checks.append(
        _tool(runner, "git", "git sources and patch application", "apt-get install git", required=True)
    )
    checks.append(_tool(runner, "debootstrap", "images.bootstrap", "apt-get install debootstrap"))
    checks.append(_tool(runner, "cmake", "local executor", "apt-get install cmake"))
    checks.append(_tool(runner, "ninja", "local executor", "apt-get install ninja-build"))
    checks.append(_tool(runner, "ccache", "local executor cache", "apt-get install ccache"))
    checks += [
        _tool(runner, name, purpose, hint)
        for backend in BACKENDS.values()
        for name, purpose, hint in backend.doctor_tools
    ]
    return checks
