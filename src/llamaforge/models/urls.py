"""Which URLs a model download or a remote header read may reach, and an HTTP opener that asks again at every
redirect.

Every URL is first put to the host guard (:func:`llamaforge.core.guard.check_url`: the front's allow-list,
link-local and cloud-metadata addresses). A download over plain ``http://`` is refused unless its content is
pinned by a sha256 (the bytes are then checked whatever the network did to them) or its host is this machine
(a loopback mirror). A redirect goes through the same checks, and one that leaves ``https`` is refused.
"""

from __future__ import annotations

import os
import re
import urllib.parse
import urllib.request
from typing import Final

from llamaforge.core import guard
from llamaforge.core.errors import FetchError, InvalidOption
from llamaforge.core.guard import is_loopback
from llamaforge.core.http import checked_opener, redact_url

__all__ = [
    "DEFAULT_MAX_UNPINNED",
    "MAX_UNPINNED_ENV",
    "check_model_url",
    "file_url_host",
    "human_bytes",
    "max_unpinned_bytes",
    "opener",
    "redact_url",
]

MAX_UNPINNED_ENV: Final = "LLAMAFORGE_MAX_UNPINNED_DOWNLOAD"
DEFAULT_MAX_UNPINNED: Final = 256 << 30
_SIZE: Final = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS: Final = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def file_url_host(url: str) -> str | None:
    """The other machine a ``file://`` URL names, None when it names this one: ``file://relative/x.gguf``
    names /x.gguf on a host called "relative", a slip for a relative path that a model source cannot be."""
    netloc = urllib.parse.urlsplit(url).netloc
    return None if netloc in ("", "localhost") else netloc


def check_model_url(url: str, *, plain_http_ok: bool, what: str = "model URL", token: bool = False) -> None:
    """Refuse fetching ``url`` when the host guard refuses it, when it is no ``https://`` or ``http://`` URL,
    or when it is plain ``http://`` to another machine and either not ``plain_http_ok`` (a download whose
    sha256 is pinned, or a read that stores nothing) or the request would carry a ``token``."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise FetchError(
            f"unsupported {what} {redact_url(url)}", hint="use hf://, ms://, https:// or file://"
        )
    guard.check_url(url, what=what)
    if scheme != "http" or is_loopback(parts.hostname or ""):
        return
    if token:
        raise FetchError(
            f"{what} {redact_url(url)} is plain http:// and the request would carry a token in clear",
            hint="use https://, or unset HF_TOKEN / MODELSCOPE_API_TOKEN for this mirror",
        )
    if not plain_http_ok:
        raise FetchError(
            f"{what} {redact_url(url)} is plain http:// and nothing pins its content: anyone on the network "
            "could change what arrives",
            hint="use https://, or pin the file's sha256 in the model recipe (then a plain http:// mirror is fine)",
        )


def opener(*, plain_http_ok: bool) -> urllib.request.OpenerDirector:
    """An HTTP(S) opener that honours ``SSL_CERT_FILE`` and checks every redirect like the first URL: never from
    ``https`` to ``http``, and never where :func:`check_model_url` would refuse to go."""

    def check(source: str, target: str) -> None:
        check_model_url(target, plain_http_ok=plain_http_ok, what=f"redirect target of {source}")

    return checked_opener(check, error=FetchError)


def max_unpinned_bytes() -> int:
    """The most bytes a download without a sha256 pin may bring: ``LLAMAFORGE_MAX_UNPINNED_DOWNLOAD`` (bytes,
    or with a unit: ``500G``, ``2TiB``), 256 GiB by default."""
    raw = os.environ.get(MAX_UNPINNED_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_UNPINNED
    match = _SIZE.fullmatch(raw)
    if not match:
        raise InvalidOption(
            f"{MAX_UNPINNED_ENV}={raw!r} is no size", hint="give bytes, or a number with K, M, G or T (500G)"
        )
    return int(match.group(1)) << _UNITS[match.group(2).upper()]


def human_bytes(count: int) -> str:
    """``count`` in the largest binary unit that keeps it at least 1 (``3.5 GiB``)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
