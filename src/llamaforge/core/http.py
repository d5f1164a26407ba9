"""HTTP(S) downloads: an opener that trusts ``SSL_CERT_FILE`` and asks again at every redirect.

Model downloads, remote header reads and source archives use the same opener; each brings its own check of a
redirect target (the model URL rules, or the host guard alone). Import this module where a download starts, not
at the top of a module a cache hit loads: it imports urllib and ssl.
"""

from __future__ import annotations

import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPMessage
from typing import IO

from llamaforge.core.errors import LlamaforgeError

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
