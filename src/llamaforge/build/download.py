"""A checked download of one file: the URL passes the running front's URL policy
(:func:`llamaforge.core.guard.check_url`), and so does every redirect it answers with; an https download never
continues over plain http. Source archives and the package index's sdists come through here."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llamaforge.core.errors import SourceError
from llamaforge.core.events import CancelToken, Event, Reporter
from llamaforge.core.guard import check_url

_CHUNK = 1 << 20


def check_redirect(source: str, target: str) -> None:
    """A redirect's target passes the URL policy, as the URL it came from did."""
    check_url(target, what=f"redirect of {source} to")


def download_url(url: str, target: Path, reporter: Reporter, cancel: CancelToken | None) -> None:
    """Download ``url`` (checked by the URL policy, as is every redirect) to ``target``."""
    import urllib.error  # here, not at the top: a cached source (every cache hit) never downloads

    from llamaforge.core.http import checked_opener

    check_url(url, what="source archive URL")
    web = checked_opener(check_redirect, error=SourceError)
    try:
        with web.open(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            done = 0
            with target.open("wb") as handle:
                while chunk := response.read(_CHUNK):
                    if cancel:
                        cancel.raise_if_cancelled()
                    handle.write(chunk)
                    done += len(chunk)
                    reporter(
                        Event("progress", f"downloading {url}", stage="source", completed=done, total=total)
                    )
    except OSError as error:
        if isinstance(error, urllib.error.HTTPError):
            error.close()  # an HTTPError holds the open response
        raise SourceError(
            f"cannot download {url}: {error}",
            hint="check the network or put the archive in a mirror directory (LLAMAFORGE_SOURCE_MIRROR)",
        ) from None


def sha256_file(path: Path, cancel: CancelToken | None = None) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            if cancel:
                cancel.raise_if_cancelled()
            digest.update(chunk)
    return digest.hexdigest()
