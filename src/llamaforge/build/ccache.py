"""A compiler cache shared by builders: ccache's remote storage (ccache >= 4.4 ``remote_storage``, a Redis server
or an HTTP server that every builder reaches), and what ccache did in one build.

The storage is named by a URL without a password (``redis://HOST:PORT``, ``redis://USER@HOST:PORT/DB``,
``http://HOST/PATH``, ``http://USER@HOST/PATH``), optionally followed by ccache's attributes
(``|read-only=true|connect-timeout=500``); the password lives in a file. The docker executor writes the full URL
into the build container's ``/etc/ccache.conf`` (never onto a command line, into an environment variable, a log,
the manifest or an image), and gives that container the engine host's network so it reaches the storage at the
address the host would. ccache counts each compilation in a stats log; the executor turns that log into
:class:`CacheStats` for the manifest's ``ccache`` block.

ccache changes no output (the reproducibility check compares a ccache build with one without it), so neither the
storage nor its hits are part of the build key. When the storage cannot be reached or refuses the password,
ccache goes on with its local cache: the build still succeeds, with a warning from the probe before the build and
the count of failed remote lookups after it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit

from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import check_file_path, check_url

SCHEMES = ("redis", "http", "https")
# What the builder's ccache reads: the system configuration file of a Debian ccache.
CONFIG_PATH = "/etc/ccache.conf"
# ccache appends one line per counter it bumps, per compilation, to this file in the build container.
STATS_LOG = "/tmp/llamaforge-ccache.stats"
# The record the docker executor writes beside the artifacts; execute.py moves it into the manifest.
CCACHE_RECORD = "ccache.json"
_ATTRIBUTE = re.compile(r"^[a-z][a-z0-9-]*=[^\s|]*$")
_HINT_FORMS = "use redis://HOST:PORT, redis://HOST:PORT/DB or http(s)://HOST[:PORT]/PATH"


def _hidden(url: str) -> str:
    """``url`` with whatever sits before ``@`` in its authority replaced by ``****`` (for messages)."""
    return re.sub(r"^([a-z+]*://)[^/@]*@", r"\1****@", url)


@dataclass(frozen=True)
class RemoteCache:
    """ccache remote storage: ``url`` (no password; ccache attributes after ``|`` kept) and the file holding its
    password; ``origin`` names where it was given (``--ccache-remote``, a fleet file's ``[ccache]``)."""

    url: str
    password_file: Path | None = None
    origin: str = "--ccache-remote"

    @classmethod
    def parse(
        cls, url: str, password_file: str | Path | None = None, *, origin: str = "--ccache-remote"
    ) -> RemoteCache:
        """The checked storage: a known scheme, a host, a port that is a number, no password in the URL (ccache
        reads ``redis://SECRET@HOST`` as a password), a readable password file when one is named;
        InvalidOption naming ``origin`` otherwise. The password file is read here and again when a build
        starts."""
        secret_file = Path(password_file).expanduser() if password_file else None
        text = check_storage_url(url, has_password_file=secret_file is not None, origin=origin)
        # The front's URL policy: an allow-list of hosts (MCP), never a link-local or cloud-metadata address.
        check_url(text.split("|")[0], what=origin)
        if secret_file is not None:
            check_file_path(f"{origin}: password file", secret_file.absolute())
        cache = cls(text, secret_file, origin)
        cache.password()  # a missing, unreadable or empty file is refused before any build starts
        return cache

    @property
    def host(self) -> str:
        """The storage's host name or address."""
        return str(urlsplit(self.url.split("|")[0]).hostname)

    @property
    def port(self) -> int:
        """The storage's port (Redis 6379, HTTP 80, HTTPS 443 when the URL names none)."""
        parts = urlsplit(self.url.split("|")[0])
        return parts.port or {"redis": 6379, "http": 80, "https": 443}[parts.scheme]

    def password(self) -> str | None:
        """The password from the file (its first line, without the line break), or None without a file;
        InvalidOption naming the file when it is missing, unreadable, empty or not one line."""
        if self.password_file is None:
            return None
        where = f"{self.origin}: password file {self.password_file}"
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidOption(
                f"{where} does not exist",
                hint="create it with the storage's password on one line (mode 0600), or fix the path",
            ) from None
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "it is not UTF-8 text"
            raise InvalidOption(
                f"{where} cannot be read: {reason}", hint="make it readable by this user"
            ) from None
        secret = text.removesuffix("\n").removesuffix("\r")
        if not secret or "\n" in secret or "\x00" in secret:
            raise InvalidOption(
                f"{where} is {'empty' if not secret else 'not one line'}",
                hint="write the password alone on the first line",
            )
        return secret

    def storage_url(self) -> str:
        """The URL ccache is given: the password inserted, percent-encoded. ccache decodes the user part before
        it splits USER:PASSWORD, so a password holding ':' gets Redis's ``default`` user in front of it (Redis
        >= 6 knows that user)."""
        secret = self.password()
        if secret is None:
            return self.url
        base, bar, attributes = self.url.partition("|")
        scheme, rest = base.split("://", 1)
        user, at, host = rest.rpartition("@")
        if not at:
            user = "default" if ":" in secret else ""
        login = f"{quote(user, safe='')}:{quote(secret, safe='')}" if user else quote(secret, safe="")
        return f"{scheme}://{login}@{host}{bar}{attributes}"

    def config_text(self) -> str:
        """The ccache configuration file that names the storage (holds the password: written only inside the
        build container)."""
        return f"remote_storage = {self.storage_url()}\n"

    def secrets(self) -> list[str]:
        """The strings a log line must never show: the password, raw and encoded, and the full URL."""
        secret = self.password()
        return (
            []
            if secret is None
            else sorted({secret, quote(secret, safe=""), self.storage_url()}, key=len)[::-1]
        )


def check_storage_url(url: str, *, has_password_file: bool, origin: str = "--ccache-remote") -> str:
    """``url`` stripped, once it is a storage URL ccache takes (see :meth:`RemoteCache.parse`; ``has_password_file``
    tells whether a ``USER@`` is a user or, to ccache, a password); InvalidOption naming ``origin`` otherwise."""
    text = url.strip()
    if not text or re.search(r"[\s\x00-\x1f]", text):
        raise InvalidOption(
            f"{origin} {_hidden(text)!r} is not a remote storage URL (empty, or it holds spaces)",
            hint=_HINT_FORMS,
        )
    base, *attributes = text.split("|")
    for attribute in attributes:
        if not _ATTRIBUTE.match(attribute):
            raise InvalidOption(
                f"{origin}: {attribute!r} is not a ccache storage attribute KEY=VALUE",
                hint="e.g. redis://HOST:PORT|read-only=true|connect-timeout=500",
            )
    parts = _split(base, origin)
    if parts.password is not None or (parts.username is not None and not has_password_file):
        raise InvalidOption(
            f"{origin} {_hidden(text)} holds a password before '@' (ccache reads redis://SECRET@HOST as "
            "one); the URL is logged and recorded",
            hint="put the password in a file and name it with --ccache-password-file (a fleet's "
            "[ccache] password_file); keep only USER@ in the URL, if the server has users",
        )
    if parts.scheme != "redis" and has_password_file and parts.username is None:
        raise InvalidOption(
            f"{origin} {text}: an HTTP storage's password needs a user name",
            hint="write the URL as http://USER@HOST/PATH; the password comes from the file",
        )
    return text


def _split(base: str, origin: str) -> SplitResult:
    """``base`` split, with a known scheme, a host, a numeric port and a Redis database number."""
    parts = urlsplit(base)
    if parts.scheme not in SCHEMES or "://" not in base:
        raise InvalidOption(
            f"{origin} {_hidden(base)}: scheme {parts.scheme or '(none)'!r} is not one ccache's remote storage "
            f"takes here ({', '.join(SCHEMES)})",
            hint=_HINT_FORMS,
        )
    try:
        if parts.port == 0:  # urlsplit takes it; no server listens there
            raise ValueError(parts.port)
    except ValueError:
        raise InvalidOption(
            f"{origin} {_hidden(base)}: the port is not a number 1-65535", hint=_HINT_FORMS
        ) from None
    if not parts.hostname:
        raise InvalidOption(f"{origin} {_hidden(base)} names no host", hint=_HINT_FORMS)
    if parts.scheme == "redis" and (
        parts.query or parts.fragment or not re.fullmatch(r"(/\d*)?", parts.path)
    ):
        raise InvalidOption(
            f"{origin} {_hidden(base)}: a Redis URL ends with the host, the port or /DB (a number)",
            hint=_HINT_FORMS,
        )
    return parts


@dataclass(frozen=True)
class CacheStats:
    """What ccache did in one build, counted from its stats log."""

    calls: int
    hits: int
    misses: int
    local_hits: int
    remote_hits: int
    remote_misses: int
    remote_errors: int
    remote_writes: int
    uncacheable: int

    @classmethod
    def from_log(cls, lines: Iterable[str]) -> CacheStats:
        """Counts from a ccache stats log (``# FILE`` lines, then one counter name per line)."""
        count = Counter(line.strip() for line in lines if line.strip() and not line.startswith("#"))
        hits = count["direct_cache_hit"] + count["preprocessed_cache_hit"]
        misses = count["cache_miss"]
        counted = {
            "direct_cache_hit",
            "preprocessed_cache_hit",
            "cache_miss",
            "direct_cache_miss",
            "preprocessed_cache_miss",
        }
        storage = ("local_storage", "remote_storage")
        uncacheable = sum(
            value for name, value in count.items() if name not in counted and not name.startswith(storage)
        )
        return cls(
            calls=hits + misses,
            hits=hits,
            misses=misses,
            local_hits=count["local_storage_hit"],
            remote_hits=count["remote_storage_hit"],
            remote_misses=count["remote_storage_miss"],
            remote_errors=count["remote_storage_error"] + count["remote_storage_timeout"],
            remote_writes=count["remote_storage_write"],
            uncacheable=uncacheable,
        )

    @property
    def hit_rate(self) -> float | None:
        """Hits per cacheable compilation, or None when there was none."""
        return self.hits / self.calls if self.calls else None

    @property
    def remote_hit_rate(self) -> float | None:
        """Remote hits per cacheable compilation, or None when there was none."""
        return self.remote_hits / self.calls if self.calls else None

    def summary(self) -> str:
        """One line for a person: ``ccache: 12 of 12 compilations hit (12 remote)``."""
        if not self.calls:
            return "ccache: no cacheable compilation"
        remote = f", {self.remote_hits} from the remote storage" if self.remote_hits else ""
        return f"ccache: {self.hits} of {self.calls} compilations were hits ({self.local_hits} local{remote})"

    def to_json(self) -> dict[str, Any]:
        """The counts and rates for the manifest's ``ccache`` block."""
        data: dict[str, Any] = dict(self.__dict__)
        data["hit_rate"] = None if self.hit_rate is None else round(self.hit_rate, 4)
        data["remote_hit_rate"] = None if self.remote_hit_rate is None else round(self.remote_hit_rate, 4)
        return data


PROBE_SCRIPT = r"""
set -u
compiler=""
for candidate in cc gcc x86_64-w64-mingw32-gcc; do
  if command -v "$candidate" >/dev/null; then compiler="$candidate"; break; fi
done
if [ -z "$compiler" ]; then echo "llamaforge-probe: no compiler"; exit 0; fi
printf 'int llamaforge_ccache_probe;\n' > /tmp/llamaforge-ccache-probe.c
if timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; then
  echo "llamaforge-probe: connected"
else
  echo "llamaforge-probe: no connection"
fi
CCACHE_REMOTE_ONLY=1 CCACHE_STATSLOG=/tmp/llamaforge-ccache-probe.stats \
  ccache "$compiler" -c /tmp/llamaforge-ccache-probe.c -o /tmp/llamaforge-ccache-probe.o || exit $?
cat /tmp/llamaforge-ccache-probe.stats
"""
"""Run in the build container before the build with the storage's host and port: one compilation through
ccache with only the remote storage (it leaves the local cache alone) by the image's C compiler (the mingw image
has only the cross compiler), and a plain TCP connection to tell an unreachable storage from one that refuses the
password."""


def probe_command(cache: RemoteCache) -> list[str]:
    """The probe's command line (host and port only: the password stays in ccache's configuration file)."""
    return ["bash", "-c", PROBE_SCRIPT, "llamaforge-ccache-probe", cache.host, str(cache.port)]


def probe_verdict(cache: RemoteCache, lines: list[str]) -> str | None:
    """None when the probe's compilation reached the storage, else a warning for the person who started the
    build (ccache goes on with its local cache)."""
    stats = CacheStats.from_log(lines)
    if stats.remote_errors == 0:
        return None
    where = f"{cache.host}:{cache.port}"
    if "llamaforge-probe: no connection" in lines:
        cause = f"nothing answers at {where} from the build container"
        hint = "start the storage, or check the address: the container has the engine host's network"
    else:
        cause = f"{where} answers but refused ccache (a wrong password, or not a {urlsplit(cache.url).scheme} server)"
        hint = "check the password file and the server's requirepass / users"
    return (
        f"remote compiler cache {cache.url} ({cache.origin}) cannot be used: {cause}; ccache goes on with the "
        f"local cache only ({hint})"
    )
