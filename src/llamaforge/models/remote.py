"""A remote GGUF read through HTTP range requests: a prefix that grows until the header parses.

``models.inspect --remote`` reads only a model's header this way, so users can plan before downloading
gigabytes. The requests, the ``Content-Range`` reading and the retries are the one range-and-retry client of
:mod:`llamaforge.core.http` that model downloads use too.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.http import NETWORK_ERRORS, Transient, content_range, range_request, retrying, transient
from llamaforge.models.urls import check_model_url, opener, redact_url


def resolve_remote_url(source: str, revision: str | None = None) -> tuple[str, dict[str, str]]:
    """The HTTP(S) URL for ``source`` and the headers to send (``hf://`` gets ``HF_TOKEN`` as a bearer).

    ``hf://owner/repo/path`` maps to ``${HF_ENDPOINT:-https://huggingface.co}/owner/repo/resolve/REV/path``.
    """
    if source.startswith(("https://", "http://")):
        return source, {}
    match = re.fullmatch(r"hf://([^/]+)/([^/]+)/(.+)", source)
    if match:
        owner, repo, path = match.groups()
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        rev = urllib.parse.quote(revision or "main", safe="")
        url = f"{endpoint}/{owner}/{repo}/resolve/{rev}/{urllib.parse.quote(path)}"
        token = os.environ.get("HF_TOKEN")
        return url, ({"Authorization": f"Bearer {token}"} if token else {})
    raise InvalidOption(
        f"cannot read {source!r} remotely",
        hint="remote inspect reads https://, http:// and hf://owner/repo/path",
    )


class HttpRangeSource:
    """A remote file read through HTTP range requests: a prefix that grows (doubling) as the parser needs it."""

    preferred_chunk = 4096  # the parser's read window: small, so only what the header needs is fetched

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        initial_bytes: int = 64 << 10,
        max_bytes: int = 512 << 20,
        timeout: float = 30.0,
        attempts: int = 3,
        reporter: Reporter = null_reporter,
        cancel: CancelToken | None = None,
    ) -> None:
        self.url = url
        self.name = redact_url(url)
        self._secret_headers = dict(headers or {})
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._attempts = attempts
        self._reporter = reporter
        self._cancel = cancel or CancelToken()
        self._data = bytearray()
        self.requests = 0
        self._size = -1
        # A header read stores nothing and trusts nothing it reads: plain http is allowed, a redirect that
        # leaves https is not, and the host guard is asked before the first request and at every redirect.
        check_model_url(url, plain_http_ok=True, what="remote model", token=bool(self._secret_headers))
        self._opener = opener(plain_http_ok=True)
        self._fetch(0, initial_bytes)

    @property
    def size(self) -> int:
        """Total size of the remote file (from Content-Range)."""
        return self._size

    @property
    def bytes_fetched(self) -> int:
        """Bytes downloaded so far."""
        return len(self._data)

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``, fetching more of the prefix when needed."""
        end = min(offset + length, self._size)
        while end > len(self._data):
            self._cancel.raise_if_cancelled()
            grow_to = min(self._size, max(end, 2 * len(self._data)))
            self._fetch(len(self._data), grow_to - len(self._data))
        return bytes(self._data[offset:end])

    def _fetch(self, start: int, length: int) -> None:
        if start + length > self._max_bytes:
            raise ModelError(
                f"{self.name}: the header is not complete after {self._max_bytes} bytes",
                hint="this is not a GGUF model, or one with an enormous header; download it instead",
            )

        def told(_error: Transient, failures: int, _delay: float) -> None:
            self._reporter(
                Event("log", f"retrying range request {failures}/{self._attempts}", stage="inspect")
            )

        try:
            retrying(
                lambda: self._fetch_once(start, length),
                retries=self._attempts - 1,
                backoff_s=0.2,
                cancel=self._cancel,
                on_retry=told,
            )
        except Transient as error:
            if isinstance(error.cause, urllib.error.HTTPError):
                raise self._http_error(error.cause) from None
            raise ModelError(
                f"{self.name}: cannot fetch: {error}",
                hint="check the URL and the network (HTTPS_PROXY, SSL_CERT_FILE)",
            ) from None

    def _http_error(self, error: urllib.error.HTTPError) -> ModelError:
        hint = {
            401: "set HF_TOKEN for gated or private hub files",
            403: "set HF_TOKEN for gated hub files",
            404: "check the repository, revision and file name",
            416: "the server refused the byte range",
        }.get(error.code)
        return ModelError(f"{self.name}: HTTP {error.code} {error.reason}", hint=hint)

    def _fetch_once(self, start: int, length: int) -> None:
        """One range request; network trouble and a retryable status raise Transient, any other status the
        ModelError that says what it means."""
        self.requests += 1
        request = range_request(
            self.url,
            start,
            start + length - 1,
            headers={"User-Agent": "llamaforge"},
            private_headers=self._secret_headers,  # a hub redirects to a CDN host that must not see the token
        )
        try:
            self._read_range(request, start, length)
        except urllib.error.HTTPError as error:
            raise transient(error) or self._http_error(error) from None
        except NETWORK_ERRORS as error:
            raise Transient(str(getattr(error, "reason", None) or error), error) from None

    def _read_range(self, request: urllib.request.Request, start: int, length: int) -> None:
        with self._opener.open(request, timeout=self._timeout) as response:
            if response.status != 206:
                raise ModelError(
                    f"{self.name}: the server ignored the Range request (HTTP {response.status})",
                    hint="remote inspect needs a server with HTTP range support; download the file instead",
                )
            first, last, total = content_range(response.headers.get("Content-Range")) or (0, 0, None)
            if total is None:
                raise ModelError(f"{self.name}: range response without a usable Content-Range header")
            if first != start or last < first or last >= total or (self._size >= 0 and total != self._size):
                raise ModelError(
                    f"{self.name}: the server answered bytes {first}-{last}/{total} "
                    f"to a request for {start}-{start + length - 1}"
                )
            body = response.read(last - first + 1)
        if len(body) != last - first + 1:
            raise ModelError(f"{self.name}: short range response ({len(body)} of {last - first + 1} bytes)")
        self._size = total
        self._data += body
        self._reporter(
            Event(
                "progress",
                f"fetched {len(self._data)} bytes of the header",
                stage="inspect",
                completed=len(self._data),
                total=None,
            )
        )
