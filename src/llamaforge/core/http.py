"""HTTP(S) downloads: an opener that trusts ``SSL_CERT_FILE`` and asks again at every redirect, and the one
range-and-retry client.

Model downloads, remote header reads and source archives use the same opener; each brings its own check of a
redirect target (the model URL rules, or the host guard alone). Model downloads (a resume from the bytes on
disk) and remote header reads (a prefix that grows) ask for byte ranges with :func:`range_request`, read the
answer's ``Content-Range`` with :func:`content_range`, and retry network trouble with :func:`retrying`: one
notion of a failure worth retrying (:class:`Transient`), one backoff, a wait that a cancel cuts short. Import
this module where a download starts, not at the top of a module a cache hit loads: it imports urllib and ssl.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from http.client import HTTPMessage
from typing import IO, Final, TypeVar

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.events import CancelToken

T = TypeVar("T")

#: HTTP statuses that say "try again later", not "this will never work".
RETRYABLE_STATUS: Final = frozenset({408, 425, 429, 500, 502, 503, 504})
#: The longest wait between two attempts.
MAX_BACKOFF_S: Final = 30.0
#: Network failures: the connection refused, reset or timed out, a malformed or cut-short answer.
NETWORK_ERRORS: Final = (urllib.error.URLError, OSError, http.client.HTTPException)

_CONTENT_RANGE: Final = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

RedirectCheck = Callable[[str, str], None]
"""Called with a redirect's source (redacted) and target URL before it is followed; raises a LlamaforgeError to
refuse it."""


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment (where signed URLs and tokens hide)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects that never leave ``https`` (refused with ``error``) and whose every target passes ``check``."""

    def __init__(self, check: RedirectCheck, *, error: type[LlamaforgeError]) -> None:
        super().__init__()
        self._check = check
        self._error = error

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        """Check ``newurl`` before following it."""
        try:
            source = redact_url(req.full_url)
            leaves_https = not newurl.lower().startswith("https:")
            if urllib.parse.urlsplit(req.full_url).scheme.lower() == "https" and leaves_https:
                raise self._error(
                    f"{source} redirects to {redact_url(newurl)}, leaving https",
                    hint="the server (or someone between) downgrades the download; use a URL that stays on https",
                )
            self._check(source, newurl)
        except LlamaforgeError:
            fp.close()  # urllib closes a redirect's response only when it follows the redirect
            raise
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def checked_opener(check: RedirectCheck, *, error: type[LlamaforgeError]) -> urllib.request.OpenerDirector:
    """An HTTP(S) opener that trusts the CA bundle ``SSL_CERT_FILE`` names (the system's when unset) and checks
    every redirect (see :class:`CheckedRedirects`)."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as failure:  # FileNotFoundError, or a file that holds no certificate
        raise error(
            f"SSL_CERT_FILE={cafile} cannot be used as a CA bundle: {failure}",
            hint="point SSL_CERT_FILE at a PEM bundle (e.g. /etc/ssl/certs/ca-certificates.crt), or unset it",
        ) from None
    return urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=context), CheckedRedirects(check, error=error)
    )


# ------------------------------------------------------------------------------------ ranges and retries


class Transient(Exception):
    """A failure worth another attempt: network trouble or a retryable HTTP status; ``cause`` is the error that
    was caught, if any (an ``HTTPError`` says which status)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def transient(error: BaseException) -> Transient | None:
    """``error`` as a :class:`Transient` when another attempt may succeed (a network error, a status in
    :data:`RETRYABLE_STATUS`), else None. An ``HTTPError`` is closed here: it holds the open response."""
    if isinstance(error, urllib.error.HTTPError):
        error.close()
        return Transient(f"HTTP {error.code}", error) if error.code in RETRYABLE_STATUS else None
    if isinstance(error, NETWORK_ERRORS):
        return Transient(str(getattr(error, "reason", None) or error), error)
    return None


_URL_SAFE = (
    "/%:@!$&'()*+,;=-._~"  # RFC 3986's reserved and unreserved characters, and '%' of an existing escape
)


def ascii_url(url: str) -> str:
    """``url`` as HTTP sends it: a path or query with other than ASCII (``/ünï.gguf``) percent-encoded as
    UTF-8, a host name in IDNA; an ASCII URL is unchanged."""
    if url.isascii():
        return url
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = (
        parts.netloc.replace(host, host.encode("idna").decode("ascii"))
        if not host.isascii()
        else parts.netloc
    )
    return urllib.parse.urlunsplit(
        (
            parts.scheme,
            netloc,
            urllib.parse.quote(parts.path, safe=_URL_SAFE),
            urllib.parse.quote(parts.query, safe=_URL_SAFE + "?"),
            "",
        )
    )


def range_request(
    url: str,
    start: int = 0,
    end: int | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    private_headers: Mapping[str, str] | None = None,
    if_range: str | None = None,
) -> urllib.request.Request:
    """A GET of bytes ``start`` to ``end`` (inclusive; the rest of the file when None; the whole file, with no
    Range header, from 0 to the end), never compressed so that offsets are the file's. ``private_headers``
    (tokens) are never forwarded to a redirect target (a hub redirects to a CDN); ``if_range`` (an ETag) makes
    the server send the whole file when it changed."""
    wire = ascii_url(url)
    request = urllib.request.Request(wire, headers={**(headers or {}), "Accept-Encoding": "identity"})  # noqa: S310 - callers check the URL
    if start or end is not None:
        request.add_header("Range", f"bytes={start}-{'' if end is None else end}")
        if if_range:
            request.add_header("If-Range", if_range)
    for name, value in (private_headers or {}).items():
        request.add_unredirected_header(name, value)
    return request


def content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of a ``Content-Range`` header (``bytes 100-199/200``; total None for ``*``),
    None when there is none or it cannot be read."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if not match:
        return None
    first, last, total = match.groups()
    return int(first), int(last), None if total == "*" else int(total)


def wait_seconds(attempt: int, backoff_s: float) -> float:
    """The wait before retry ``attempt`` (1-based): doubling from ``backoff_s``, at most :data:`MAX_BACKOFF_S`."""
    return min(backoff_s * float(1 << min(max(attempt - 1, 0), 16)), MAX_BACKOFF_S)


def sleep(seconds: float, cancel: CancelToken) -> None:
    """Sleep, but wake up at once (and raise) when the operation is cancelled."""
    woken = threading.Event()
    remove = cancel.on_cancel(woken.set)
    try:
        woken.wait(seconds)
    finally:
        remove()
    cancel.raise_if_cancelled()


def retrying(
    attempt: Callable[[], T],
    *,
    retries: int,
    backoff_s: float,
    cancel: CancelToken,
    on_retry: Callable[[Transient, int, float], None],
    progress: Callable[[], int] | None = None,
) -> T:
    """``attempt()``'s result, calling it again after each :class:`Transient` it raises, up to ``retries``
    failures in a row; the last one is raised. ``on_retry(error, failures, wait)`` is told before each wait
    (:func:`wait_seconds`). With ``progress`` (bytes so far), an attempt that brought bytes restarts the count:
    only stalls exhaust the retries."""
    failures = 0
    while True:
        cancel.raise_if_cancelled()
        before = progress() if progress is not None else 0
        try:
            return attempt()
        except Transient as error:
            moved = progress is not None and progress() > before
            failures = 1 if moved else failures + 1
            if failures > retries:
                raise
            delay = wait_seconds(failures, backoff_s)
            on_retry(error, failures, delay)
            sleep(delay, cancel)
