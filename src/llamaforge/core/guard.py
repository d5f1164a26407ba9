"""What this process allows beyond its arguments: the host guard.

A front that serves callers it does not trust (the MCP server) installs a :class:`HostGuard` once at start.
The core consults it wherever a value it did not receive as a checked argument leads to this machine's file
system, the network or a child process: a path named inside a recipe, manifest, inventory or series file; a URL
about to be fetched; an SSH host about to be dialled; the environment a child process inherits; a write or a
program run while the front is read-only. Without a guard installed (the CLI, notebooks, tests) the permissive
default applies, except that link-local and cloud-metadata addresses are never fetched unless allowed by name.

Refusals raise :class:`PolicyRefused` naming the value, where it came from and the server flag that allows it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llamaforge.core.errors import ExitCode, LlamaforgeError


class PolicyRefused(LlamaforgeError):
    """The running front's policy does not allow this (a path, host, URL, write or program)."""

    exit_code = ExitCode.POLICY_REFUSED


PathCheck = Callable[[str, str], None]
"""``check(what, path)``: raise :class:`PolicyRefused` when ``path`` (named by ``what``, e.g. "recipe
foo.toml: patches") leaves what the front allows."""

# Names of cloud metadata services, refused like the link-local addresses they resolve to.
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})
_METADATA_ADDRESSES = frozenset({"100.100.100.200", "fd00:ec2::254"})

# Variables a child process needs to run at all; everything else is dropped under a minimal environment.
_CHILD_ENV_KEEP = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "SHELL",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "SSH_AUTH_SOCK",
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "DOCKER_CERT_PATH",
        "DOCKER_TLS_VERIFY",
        "XDG_CACHE_HOME",
        "XDG_RUNTIME_DIR",
    }
)
_CHILD_ENV_PREFIXES = ("LC_", "LLAMAFORGE_")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE|AUTH", re.IGNORECASE)
# Secret shapes worth masking even when they did not come from this environment (a hub token in a log line).
_SECRET_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}\b|\bsk-[A-Za-z0-9_-]{20,}\b|\bgh[pousr]_[A-Za-z0-9]{20,}\b"
)
MASK = "***"


@dataclass(frozen=True)
class HostGuard:
    """One process's policy. The defaults allow everything a local user may do."""

    read_only: bool = False
    minimal_env: bool = False
    path_check: PathCheck | None = None
    url_hosts: frozenset[str] | None = None  # None: any host (link-local/metadata still refused)
    ssh_hosts: frozenset[str] | None = None  # None: any host
    allow_flag_hint: str = (
        ""  # how to allow more, in the front's words (e.g. "start the server with --allow-…")
    )


_guard = HostGuard()


def install(guard: HostGuard) -> None:
    """Make ``guard`` this process's policy (a front does it once, before serving)."""
    global _guard  # noqa: PLW0603 - one policy per process, set by its front at start
    _guard = guard


def current() -> HostGuard:
    """This process's policy."""
    return _guard


def _hint(default: str) -> str:
    return f"{default}; {_guard.allow_flag_hint}" if _guard.allow_flag_hint else default


def check_file_path(what: str, path: str | Path) -> None:
    """Refuse ``path``, named inside a file (``what`` says which file and field), when the front's path policy
    would refuse it as an argument. Without a policy every path is allowed."""
    if _guard.path_check is not None:
        _guard.path_check(what, str(path))


def refuse_if_read_only(action: str) -> None:
    """Raise when the front is read-only: ``action`` says what would have been written or run."""
    if _guard.read_only:
        raise PolicyRefused(
            f"refused: this server is read-only, and this call would {action}",
            hint="run it through a server started without --read-only, or from the command line",
        )


# What a read-only front still runs: llamaforge's own probes, which read and print. argv[0]'s name -> the
# arguments allowed after it (None: any). Any program asked only for its version is a probe too (doctor).
# `llama-server --help` of a build: --server-args are checked against it by plans and renders too.
_READ_ONLY_PROBES: dict[str, tuple[str, ...] | None] = {
    "cat": ("/proc/cpuinfo",),
    "ldd": None,
    "llama-server": ("--help",),
}


def _is_probe(argv: Sequence[str]) -> bool:
    if len(argv) == 2 and argv[1] == "--version":
        return True
    name = Path(argv[0]).name if argv else ""
    if name not in _READ_ONLY_PROBES:
        return False
    allowed = _READ_ONLY_PROBES[name]
    return allowed is None or tuple(argv[1:]) == allowed


def check_program(argv: Sequence[str]) -> None:
    """Refuse starting ``argv`` when the front is read-only, unless it is one of llamaforge's probes that only
    read and print (``cat /proc/cpuinfo``, ``ldd FILE…``, ``TOOL --version``, ``llama-server --help``)."""
    if _guard.read_only and not _is_probe(argv):
        refuse_if_read_only(f"run {Path(argv[0]).name if argv else 'a program'}")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1, brackets allowed): this machine, not
    the network. Anything else, a name or text that is no address included, is not loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_forbidden_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or str(ip) in _METADATA_ADDRESSES


def _addresses(host: str) -> list[str]:
    try:
        return [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return []  # the fetch itself reports a name that does not resolve


def check_url(url: str, *, what: str = "URL") -> None:
    """Refuse fetching ``url`` when its host is not on the allow-list (if one is set), or when it names or
    resolves to a link-local or cloud-metadata address that the allow-list does not name."""
    parts = urlsplit(url)
    if parts.scheme.lower() in ("", "file"):
        return
    host = (parts.hostname or "").lower()
    allowed = _guard.url_hosts
    if allowed is not None and host not in allowed:
        raise PolicyRefused(
            f"{what} {url!r} is refused: host {host!r} is not on this server's list of URL hosts "
            f"({', '.join(sorted(allowed)) or 'none'})",
            hint=_hint("use a host on the list"),
        )
    if allowed is not None and host in allowed:
        return
    if (
        host in METADATA_HOSTS
        or _is_forbidden_address(host)
        or any(map(_is_forbidden_address, _addresses(host)))
    ):
        raise PolicyRefused(
            f"{what} {url!r} is refused: {host!r} is a link-local or cloud-metadata address",
            hint=_hint(
                "these hold instance credentials and are never fetched unless their host is allowed by name"
            ),
        )


def check_ssh_host(host: str, *, what: str = "SSH host") -> None:
    """Refuse dialling ``host`` when an allow-list of SSH hosts is set and does not name it."""
    allowed = _guard.ssh_hosts
    if allowed is not None and host.lower() not in allowed:
        raise PolicyRefused(
            f"{what} {host!r} is refused: it is not on this server's list of SSH hosts "
            f"({', '.join(sorted(allowed)) or 'none'})",
            hint=_hint("use a host on the list"),
        )


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: the whole environment normally; under a minimal environment only
    what programs need to run (PATH, HOME, locale, library paths, LLAMAFORGE_* settings that are no secrets),
    then ``extra``."""
    if _guard.minimal_env:
        env = {
            key: value
            for key, value in os.environ.items()
            if (key in _CHILD_ENV_KEEP or key.startswith(_CHILD_ENV_PREFIXES)) and not SECRET_NAME.search(key)
        }
    else:
        env = dict(os.environ)
    if extra:
        env.update(extra)
    return env


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-looking variables (``*TOKEN*``, ``*PASSWORD*``, ``*API_KEY*``…) long enough to mask."""
    source = os.environ if environ is None else environ
    values = {value for key, value in source.items() if SECRET_NAME.search(key) and len(value.strip()) >= 6}
    return sorted(values, key=len, reverse=True)


def mask(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every secret-looking environment value, every value in ``extra`` and every known token
    shape (``hf_…``) replaced by ``***``."""
    for value in (*secret_values(), *extra):
        if value:
            text = text.replace(value, MASK)
    return _SECRET_SHAPES.sub(MASK, text)
