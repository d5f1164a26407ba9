"""What a release is, without any host: its inputs, its id, its files and ``release.json``, and the layout of
releases on a host.

A release id is a digest of everything that decides what runs (build key and manifest, model sha256, flags,
port, the rendered service files), so deploying the same inputs again finds the release already current and
does nothing. The time is recorded in ``release.json`` but is no part of the id.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.guard import is_loopback
from llamaforge.runners.process import LOCAL, ProcessRunner
from llamaforge.serve.launcher import FIELD_FLAGS, SERVER_FLAGS, LlamaFlags, server_argv

DEFAULT_ROOT = "/opt/llamaforge"
DEFAULT_PORT = 8080
KEEP_RELEASES = 5
SERVICE_USER = "llamaforge"
RELEASE_JSON = "release.json"
MODEL_LINK = "model.gguf"
PROBE_LINK = "probe.gguf"  # the model the release was proven with on the host (deploy.probe), in models/
API_KEY_FILE = "api-key"  # in the release, mode 0600, owned by the service user; never in release.json
LOOPBACK = "127.0.0.1"
#: The llama-server flags a deployment writes itself (one name of each option) and what sets each: refused in
#: --server-args (llamaforge.serve.server_args).
OWNED_FLAGS = dict(
    zip(
        SERVER_FLAGS,
        ("--model", "--listen", "--port", "deployed servers run without the web UI"),
        strict=True,
    )
) | {
    FIELD_FLAGS[field]: why
    for field, why in (
        ("ctx", "--ctx (or the fit plan)"),
        ("parallel", "--parallel"),
        ("threads", "--threads"),
        ("n_gpu_layers", "--n-gpu-layers (or the fit plan)"),
        ("n_cpu_moe", "the fit plan"),
        ("flash_attn", "the fit plan"),
        ("cache_type_k", "--cache-type"),
        ("cache_type_v", "--cache-type"),
        ("repack", "--no-repack"),
    )
}
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,39}[a-z0-9])?$")  # also a Kubernetes name as llamaforge-NAME
# A deployment root reaches unit files, scripts run as root and `install -d -o`: plain path characters only.
_ROOT = re.compile(r"^/[A-Za-z0-9._/-]{1,200}$")
# Trees of the system that a deployment may neither be put in place of nor re-own.
SYSTEM_DIRS = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/share",
        "/var",
        "/var/lib",
        "/var/log",
        "/var/run",
        "/var/tmp",
    }
)
# Libraries every glibc system has; anything else the binaries need travels with the release.
_SYSTEM_LIBRARIES = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|linux-vdso)\.so")
# The C library the build compiled against, from its toolchain's packages (``libc6-dev=2.36-9+deb12u14``).
_BUILD_GLIBC = re.compile(r"\blibc6-dev=(\d+)\.(\d+)")
# The glibc symbol versions a shared object needs or defines (``GLIBC_2.38``): its newest is its glibc floor.
_GLIBC_VERSION = re.compile(rb"GLIBC_(\d+)\.(\d+)")


ROOT_HINT = (
    f"an absolute path of letters, digits, '.', '_', '-' and '/', not a system tree (default {DEFAULT_ROOT}); "
    "each deployment lives in ROOT/NAME"
)


def root_problem(base: str, name: str | None = None) -> str | None:
    """Why ``base`` (with deployment ``name``) may not hold a deployment, or None: it reaches unit files, scripts
    run as root and ``install -d -o``, so it is a plain absolute path, no system tree, and ROOT/NAME is none
    either."""
    normal = posixpath.normpath(base) if base.startswith("/") else base
    if not _ROOT.fullmatch(base) or ".." in base.split("/") or normal in SYSTEM_DIRS - {"/opt", "/srv"}:
        return f"--root {base!r} is not a directory a deployment may live in"
    if name is not None and posixpath.join(normal, name) in SYSTEM_DIRS:
        return f"--root {base!r} with --name {name!r} is the system directory {posixpath.join(normal, name)}"
    return None


def _checked_root(base: str) -> str:
    problem = root_problem(base)
    if problem:
        raise ValueError(f"{problem}; {ROOT_HINT}")
    return base


#: A ``root`` option, checked when the options are read (before any build, model or host is looked at).
DeployRoot = Annotated[str, AfterValidator(_checked_root)]


_RELEASE_ID = re.compile(r"[0-9a-f]{16}")


def _checked_release(value: str) -> str:
    if not _RELEASE_ID.fullmatch(value):
        raise ValueError(
            f"{value!r} is no release id (16 hex digits, as `deploy.status` lists them); leave it out for the "
            "previous release"
        )
    return value


#: A ``release`` option of a rollback: a release id as :func:`release_id` makes them, checked before any host
#: is dialled (an empty one is not "the previous release").
ReleaseId = Annotated[str, AfterValidator(_checked_release)]


@dataclass(frozen=True)
class Layout:
    """Where one deployment (``name``) lives on a host: ``<base>/<name>/{releases,models,current,history}``."""

    name: str
    base: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise InvalidOption(
                f"deployment name {self.name!r} is not valid",
                hint="use lower-case letters, digits and '-', at most 41, starting and ending with a letter or digit",
            )
        problem = root_problem(self.base, self.name)
        if problem:
            raise InvalidOption(problem, hint=ROOT_HINT)

    @property
    def root(self) -> str:
        """The deployment's directory."""
        return posixpath.join(self.base, self.name)

    @property
    def releases(self) -> str:
        """Where releases live, one directory each."""
        return posixpath.join(self.root, "releases")

    @property
    def models(self) -> str:
        """Content-addressed models, shared by the deployment's releases."""
        return posixpath.join(self.root, "models")

    @property
    def current(self) -> str:
        """The symlink to the release that runs."""
        return posixpath.join(self.root, "current")

    @property
    def history(self) -> str:
        """Release ids in the order they became current (one a line; a rollback drops the last)."""
        return posixpath.join(self.root, "history")

    def release(self, release_id: str) -> str:
        """The directory of release ``release_id``."""
        return posixpath.join(self.releases, release_id)

    def model(self, sha256: str) -> str:
        """The host path of the model with ``sha256``."""
        return posixpath.join(self.models, f"{sha256}.gguf")


@dataclass(frozen=True)
class ReleaseSpec:
    """The inputs of a release: build, model, llama-server flags and port."""

    build_key: str
    build_dir: Path
    manifest_sha256: str
    model: Path
    model_sha256: str
    model_size: int
    flags: LlamaFlags = field(default_factory=LlamaFlags)
    port: int = DEFAULT_PORT
    listen: str = LOOPBACK
    backend: str = "cpu"  # the build's: which devices the unit opens (cpu: none)

    @property
    def api_key(self) -> bool:
        """Whether the release carries an API key: it does whenever llama-server listens beyond loopback."""
        return not is_loopback(self.listen)

    def server_argv(self, layout: Layout) -> list[str]:
        """llama-server's command line on the host: from ``current/``, on ``listen`` (127.0.0.1 by default);
        beyond loopback with ``--api-key-file`` (the key itself is never on a command line)."""
        current = Path(layout.current)
        argv = server_argv(
            current / "bin" / "llama-server",
            current / MODEL_LINK,
            self.flags,
            port=self.port,
            host=self.listen,
        )
        return [*argv, "--api-key-file", str(current / API_KEY_FILE)] if self.api_key else argv

    def identity(self) -> dict[str, Any]:
        """What decides the release id (with the rendered service files)."""
        return {
            "build_key": self.build_key,
            "manifest_sha256": self.manifest_sha256,
            "model_sha256": self.model_sha256,
            "flags": self.flags.args(),
            "port": self.port,
            "listen": self.listen,
            "api_key_file": API_KEY_FILE if self.api_key else None,
        }


# The health gate's wait for /health (deploy.hosts.health; the manifests' and Swarm's start period too).
GATE_BASE_S = 30.0
GATE_PER_GIB_S = 30.0  # loading reads the file once: ~30 s a GiB leaves room for a slow disk
GATE_CAP_S = 900.0


def gate_timeout_s(model_size: int) -> float:
    """How long the gate waits for ``/health``: 30 s plus 30 s a GiB of model, at most 15 minutes."""
    return min(GATE_CAP_S, GATE_BASE_S + GATE_PER_GIB_S * model_size / 2**30)


@dataclass(frozen=True)
class ReleaseRequest:
    """What a caller asks a release to be, before anything is looked up: the build (key or prefix), the model
    (recipe, file, URL or ``tiny``), llama-server's flags, port and address
    (:func:`~llamaforge.deploy.inputs.release_spec` turns it into a :class:`ReleaseSpec`)."""

    build: str
    model: str
    port: int = DEFAULT_PORT
    ctx: int | None = None
    threads: int | None = None
    parallel: int | None = None
    n_gpu_layers: int | None = None
    cache_type: str | None = None
    repack: bool = True
    server_args: str | None = None
    listen: str = LOOPBACK
    api_key: bool = True


def ip_address_of(text: str, option: str) -> str:
    """``text`` as an IP address (IPv4 or IPv6, brackets allowed), written the standard way; InvalidOption
    naming ``option`` otherwise (a name, a newline or anything else that could reach a file as more than one
    address)."""
    try:
        if "%" in text:  # an IPv6 scope id, which Python takes with any characters in it
            raise ValueError(text)
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise InvalidOption(
            f"{option} {text!r} is not an IP address",
            hint="give an IPv4 or IPv6 address, e.g. 127.0.0.1, 0.0.0.0 or 10.0.0.5",
        ) from None


def listen_address(text: str, *, api_key: bool) -> str:
    """``--listen`` checked: an IP address; beyond loopback only with an API key (InvalidOption otherwise)."""
    address = "localhost" if text == "localhost" else ip_address_of(text, "--listen")
    if not is_loopback(address) and not api_key:
        raise InvalidOption(
            f"--listen {address} exposes llama-server beyond the hosts' loopback, which needs an API key",
            hint="drop --no-api-key (a key is generated per deploy and stored on each host with mode 0600, "
            "passed with --api-key-file) or listen on 127.0.0.1",
        )
    return address


def release_id(spec: ReleaseSpec, service_files: Mapping[str, str]) -> str:
    """The release's id: 16 hex digits of the sha256 of its inputs and rendered service files."""
    payload = json.dumps({**spec.identity(), "service_files": dict(service_files)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def release_record(
    spec: ReleaseSpec, rid: str, target: str, *, now: datetime | None = None
) -> dict[str, Any]:
    """The content of ``release.json``."""
    moment = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"schema": 1, "id": rid, "target": target, **spec.identity(), "time": moment}


class ReleaseCannotRun(LlamaforgeError):
    """A release cannot run: its binaries crashed or failed on a host before it was switched there (the probe,
    :mod:`llamaforge.deploy.hosts.probe`; ``logs`` are its last lines), or, found before any host is touched, a
    library it would carry cannot load on the build's system (:class:`LibraryTooNew`)."""

    exit_code = ExitCode.RELEASE_CANNOT_RUN

    def __init__(self, message: str, *, hint: str | None = None, logs: Sequence[str] = ()) -> None:
        super().__init__(message, hint=hint)
        self.logs = tuple(logs)


class LibraryTooNew(ReleaseCannotRun):
    """A system library this machine would ship with a release needs a newer glibc than the build's system has,
    so no host of the build's system could start the release (found before any host is touched)."""


def build_glibc(build_dir: Path) -> tuple[int, int] | None:
    """The glibc version the build compiled against, from its manifest's toolchain packages; None when the
    manifest does not say (a build made before the packages were recorded, or not on a glibc system)."""
    try:
        manifest = json.loads((build_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    toolchain = manifest.get("toolchain") if isinstance(manifest, dict) else None
    found = _BUILD_GLIBC.search(str(toolchain.get("packages", ""))) if isinstance(toolchain, dict) else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def glibc_floor(path: Path) -> tuple[int, int] | None:
    """The newest ``GLIBC_x.y`` symbol version ``path`` names: the oldest glibc that can load it."""
    versions = [(int(major), int(minor)) for major, minor in _GLIBC_VERSION.findall(path.read_bytes())]
    return max(versions) if versions else None


def _check_glibc(build_dir: Path, libraries: Mapping[str, Path]) -> None:
    """Refuse (:class:`LibraryTooNew`) the first of ``libraries`` (resolved on this machine) that needs a newer
    glibc than the build's."""
    build = build_glibc(build_dir)
    if build is None:
        return
    for name, path in sorted(libraries.items()):
        needs = glibc_floor(path)
        if needs is not None and needs > build:
            raise LibraryTooNew(
                f"{name} on this machine ({path}) needs GLIBC_{needs[0]}.{needs[1]}, but the build was made "
                f"against glibc {build[0]}.{build[1]}: a host of the build's system could not load it, so no "
                "host would start the release",
                hint=(
                    "deploy from a machine of the build's distribution (its manifest's toolchain names it), or put "
                    "LD_LIBRARY_PATH on a folder of that distribution's copy of the library: the release takes "
                    "the libraries the build does not carry from what `ldd` finds here"
                    if (build_dir / "lib").is_dir()
                    else "build again: a Linux build copies its compiler's runtime libraries (libstdc++, "
                    "libgcc_s, libgomp) into lib/ from the system it is made on, and a release takes those; "
                    "this build has no lib/ (it was made before builds carried one)"
                ),
            )


def _is_library(path: Path) -> bool:
    return path.name.endswith(".so") or ".so." in path.name


def release_files(spec: ReleaseSpec, runner: ProcessRunner = LOCAL) -> list[tuple[Path, str]]:
    """(local file, path inside the release) for the build's ``bin/``: its binaries and its own shared libraries
    and backend modules stay together in ``bin/`` (the binaries find the libraries through RPATH $ORIGIN, and
    ggml looks for backend modules in the executable's directory). ``lib/`` (the unit's LD_LIBRARY_PATH) gets
    the build's own ``lib/`` (the compiler's runtime libraries, copied from the system the build was made on),
    then any other system library the binaries need that a bare host may lack, resolved with ``ldd`` here.
    Such a library must be one the build's system can load: one that needs a newer glibc than the build
    compiled against (this machine runs a newer distribution than the build's, say) is refused with
    :class:`LibraryTooNew` before any host is touched, since every host would fail to start the release."""
    own = sorted(path for path in (spec.build_dir / "bin").iterdir() if path.is_file())
    files = [(path, f"bin/{path.name}") for path in own]
    names = {path.name for path in own}
    libraries: dict[str, Path] = {}
    if (spec.build_dir / "lib").is_dir():
        libraries.update(
            {path.name: path for path in (spec.build_dir / "lib").iterdir() if _is_library(path)}
        )
    from_build = set(libraries)  # the build's own lib/, made with it: not this machine's
    # one ldd for every file (it prints each one's libraries under its name): a process per file cost a second
    result = runner.run(["ldd", *(str(binary) for binary in own)], warn=True) if own else None
    for line in result.stdout.splitlines() if result else []:
        parts = line.split()
        found = len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/")
        if found and not _SYSTEM_LIBRARIES.match(parts[0]) and parts[0] not in names | set(libraries):
            libraries[parts[0]] = Path(parts[2]).resolve()
    _check_glibc(spec.build_dir, {name: path for name, path in libraries.items() if name not in from_build})
    return files + [(path, f"lib/{name}") for name, path in sorted(libraries.items())]
