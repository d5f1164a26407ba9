"""The resumable download engine of ``models.fetch``: HTTP(S) with Range resume, or a ``file://`` copy, into a
``.part`` file whose sha256 is computed as the bytes arrive.

Network trouble (a reset, a short read, a 5xx) is retried from the bytes the ``.part`` holds. Trouble on this
machine (the disk full, an I/O error) is not: it ends the download at once, naming the file and the free space,
and the ``.part`` is cut back to the bytes that were counted, so a later run resumes from a consistent prefix.
Before a byte is written the free space is checked against the announced size, and a download without a sha256
pin may bring at most :func:`~llamaforge.models.urls.max_unpinned_bytes`. A download whose first bytes are not
the GGUF magic ends at once (an HTML error page, a wrong file). Progress events count bytes (``unit="bytes"``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from llamaforge.core.errors import FetchError, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter
from llamaforge.core.http import NETWORK_ERRORS, Transient, content_range, range_request, retrying, transient
from llamaforge.core.paths import read_json_object
from llamaforge.gguf.header import GGUF_MAGIC
from llamaforge.models.hubs import scrub
from llamaforge.models.urls import MAX_UNPINNED_ENV, check_model_url, human_bytes, max_unpinned_bytes, opener

_CHUNK = 1 << 20


@dataclass(frozen=True)
class DownloadTarget:
    """What to download and what it must turn out to be."""

    identity: str  # source + revision: the key of the resumable .part and of the offline index
    display: str  # redacted, for messages and manifests
    filename: str
    url: str
    expected_sha256: str | None
    expected_size: int | None
    revision: str | None = None
    commit: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    private_headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Header values that must never be printed."""
        return tuple(value for value in self.private_headers.values() if value)


@dataclass
class _Progress:
    """The bytes in the .part so far and their running sha256 (updated in place, even by a failed attempt)."""

    digest: Any
    done: int

    def restart(self, part: Path) -> None:
        """Forget everything: empty .part, fresh hash."""
        part.write_bytes(b"")
        self.digest, self.done = hashlib.sha256(), 0


def load_sidecar(path: Path) -> dict[str, Any]:
    """The resume state kept beside a ``.part`` (its URL key and ETag); empty when there is none."""
    return read_json_object(path) or {}  # a damaged state is no state: the download starts over


def save_sidecar(path: Path, state: dict[str, Any]) -> None:
    """Write the resume state beside a ``.part``."""
    path.write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")


def _append(writer: BinaryIO, chunk: bytes) -> None:
    """Write all of ``chunk`` to the (unbuffered) ``.part``: a short write is continued, an error raised with
    whatever part of the chunk already reached the file."""
    view = memoryview(chunk)
    while view:
        written = writer.write(view)
        view = view[written or 0 :]


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _write_failed(target: DownloadTarget, part: Path, done: int, error: OSError) -> FetchError:
    """The fatal error for a failed local write; cuts ``part`` back to the ``done`` bytes that were counted."""
    try:
        if part.stat().st_size > done:
            os.truncate(part, done)
    except OSError:
        pass  # the next run hashes whatever the .part holds before resuming
    free = _free_bytes(part.parent)
    where = f"{human_bytes(free)} free in {part.parent}" if free is not None else f"in {part.parent}"
    reason = error.strerror or str(error)
    code = errno.errorcode.get(error.errno or 0, "")
    return FetchError(
        f"writing {part.name} for {target.display} failed at byte {done}: {reason}"
        f"{f' ({code})' if code else ''}, {where}; nothing was published",
        hint=f"free space (or fix the disk) under {part.parent} and fetch again: the {done} bytes kept "
        "are hashed and the download resumes after them",
    )


def _check_room(
    target: DownloadTarget, part: Path, done: int, total: int | None, *, capped: bool = True
) -> None:
    """Refuse before writing when ``total`` is beyond the unpinned cap (when ``capped``) or the disk cannot take
    the rest."""
    if total is None:
        return
    if capped and target.expected_sha256 is None and total > (cap := max_unpinned_bytes()):
        raise FetchError(
            f"{target.display} is {human_bytes(total)}, more than the {human_bytes(cap)} a download without a "
            f"sha256 pin may bring ({MAX_UNPINNED_ENV})",
            hint=f"pin the file's sha256 in the model recipe, or raise {MAX_UNPINNED_ENV} (e.g. 512G)",
        )
    free = _free_bytes(part.parent)
    if free is not None and total - done > free:
        raise FetchError(
            f"{target.filename} needs {human_bytes(total - done)} more but {part.parent} has "
            f"{human_bytes(free)} free; nothing was written",
            hint="free space there, or set LLAMAFORGE_HOME to a disk with room, and fetch again",
        )


def local_source(target: DownloadTarget) -> Path:
    """The local file a ``file://`` target names."""
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(target.url).path))


def copy_local(
    target: DownloadTarget, part: Path, reporter: Reporter, cancel: CancelToken
) -> tuple[str, int]:
    """Copy a ``file://`` source into ``part``, hashing it; returns ``(sha256, size)``."""
    source = local_source(target)
    if not source.is_file():
        raise FetchError(f"{source} does not exist", hint="fix the file:// path")
    digest = hashlib.sha256()
    total = source.stat().st_size
    _check_room(target, part, 0, total, capped=False)  # a local file: no network to be wary of
    done = 0
    try:
        writer = part.open("wb", buffering=0)
    except OSError as error:
        raise _write_failed(target, part, done, error) from None
    with source.open("rb") as reader, writer:
        while chunk := reader.read(_CHUNK):
            cancel.raise_if_cancelled()
            try:
                _append(writer, chunk)
            except OSError as error:
                raise _write_failed(target, part, done, error) from None
            digest.update(chunk)
            done += len(chunk)
            reporter(
                Event(
                    "progress",
                    f"copying {source.name}",
                    stage="fetch",
                    completed=done,
                    total=total,
                    unit="bytes",
                )
            )
    return digest.hexdigest(), done


def hash_file(path: Path, message: str, reporter: Reporter, cancel: CancelToken) -> tuple[Any, int]:
    """The sha256 object and byte count of ``path`` as it is on disk (``message`` labels the progress)."""
    digest = hashlib.sha256()
    done = 0
    try:
        total = path.stat().st_size
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                cancel.raise_if_cancelled()
                digest.update(chunk)
                done += len(chunk)
                reporter(Event("progress", message, stage="fetch", completed=done, total=total, unit="bytes"))
    except OSError as error:
        raise FetchError(
            f"cannot read {path} at byte {done}: {error.strerror or error}",
            hint="check the disk; deleting the file makes the next fetch start afresh",
        ) from None
    return digest, done


def download(
    target: DownloadTarget,
    part: Path,
    sidecar: Path,
    state: dict[str, Any],
    reporter: Reporter,
    cancel: CancelToken,
    retries: int,
    backoff_s: float,
) -> tuple[str, int]:
    """Download ``target`` into ``part`` (resuming what it holds); returns the sha256 and size received.

    ``retries`` bounds consecutive failed attempts without progress; waits double from ``backoff_s``.
    """
    progress = _Progress(hashlib.sha256(), 0)
    if part.is_file() and (target.expected_size is None or part.stat().st_size <= target.expected_size):
        progress.digest, progress.done = hash_file(part, "hashing the partial download", reporter, cancel)
        if progress.done:
            reporter(Event("info", f"resuming {target.display} at byte {progress.done}", stage="fetch"))
    else:
        progress.restart(part)
    web = opener(plain_http_ok=target.expected_sha256 is not None)

    def told(error: Transient, _failures: int, delay: float) -> None:
        reporter(
            Event("warning", f"{error}; resuming at byte {progress.done} in {delay:.1f} s", stage="fetch")
        )

    try:
        retrying(
            lambda: _attempt(target, part, sidecar, state, progress, web, reporter, cancel),
            retries=retries,
            backoff_s=backoff_s,
            cancel=cancel,
            on_retry=told,
            progress=lambda: progress.done,
        )
    except Transient as error:
        raise FetchError(
            f"downloading {target.display} failed after {retries} retries: {scrub(str(error), target.secrets)}",
            hint=f"{progress.done} bytes are kept in {part}; fetch again to resume",
        ) from None
    return progress.digest.hexdigest(), progress.done


def _attempt(
    target: DownloadTarget,
    part: Path,
    sidecar: Path,
    state: dict[str, Any],
    progress: _Progress,
    web: urllib.request.OpenerDirector,
    reporter: Reporter,
    cancel: CancelToken,
) -> None:
    """One HTTP request appending to ``part``; returns when the file is complete, raises Transient if not."""
    if target.expected_size is not None and progress.done == target.expected_size:
        return  # a complete .part from an earlier run: only the checks are left
    check_model_url(
        target.url,
        plain_http_ok=target.expected_sha256 is not None,
        what=f"download of {target.display}",
        token=bool(target.secrets),
    )
    request = range_request(
        target.url,
        progress.done,
        headers=target.headers,
        private_headers=target.private_headers,
        if_range=str(state["etag"]) if state.get("etag") else None,
    )
    try:
        response = web.open(request, timeout=60)
    except urllib.error.HTTPError as error:
        error.close()  # an HTTPError holds the open response
        _http_error(target, error, progress, part)
        return
    except NETWORK_ERRORS as error:
        raise transient(error) or Transient(str(error)) from None
    with response:
        if progress.done and response.status == 200:
            # The server ignored the range (or the file changed, per If-Range): start over.
            reporter(
                Event("warning", f"{target.display}: the server sent the whole file; restarting", "fetch")
            )
            progress.restart(part)
        elif progress.done and response.status == 206:
            answered = content_range(response.headers.get("Content-Range"))
            start = answered[0] if answered else None
            if start != progress.done:
                raise Transient(f"asked for byte {progress.done}, got a range from {start}")
        etag = response.headers.get("ETag")
        if etag and not etag.startswith("W/") and etag != state.get("etag"):
            state["etag"] = etag
            save_sidecar(sidecar, state)
        length = response.headers.get("Content-Length")
        # Where this response says the file ends: http.client does not raise on a short body, we must check.
        announced = progress.done + int(length) if length and length.isdigit() else None
        total = target.expected_size or announced
        _check_room(target, part, progress.done, total)
        _receive(target, part, response, progress, total, reporter, cancel)
    end = target.expected_size if target.expected_size is not None else announced
    if end is not None and progress.done < end:
        raise Transient(f"the server closed the transfer at byte {progress.done} of {end}")


def _receive(
    target: DownloadTarget,
    part: Path,
    response: Any,
    progress: _Progress,
    total: int | None,
    reporter: Reporter,
    cancel: CancelToken,
) -> None:
    """Append the response body to ``part``: a network error is transient, a local write error fatal."""
    cap = None if target.expected_sha256 is not None else max_unpinned_bytes()
    try:
        writer = part.open("ab", buffering=0)
    except OSError as error:
        raise _write_failed(target, part, progress.done, error) from None
    with writer:
        while True:
            try:
                chunk = response.read(_CHUNK)
            except NETWORK_ERRORS as error:
                raise Transient(f"connection lost at byte {progress.done} ({type(error).__name__})") from None
            if not chunk:
                return
            cancel.raise_if_cancelled()
            if progress.done == 0 and len(chunk) >= len(GGUF_MAGIC) and not chunk.startswith(GGUF_MAGIC):
                part.unlink(missing_ok=True)
                part.with_suffix(".json").unlink(missing_ok=True)  # its resume state
                raise ModelError(
                    f"{target.display} is not a GGUF model: it starts with {chunk[:8]!r}, not the bytes "
                    "'GGUF'; nothing was kept",
                    hint="check the URL: it must name a .gguf file (a hub serves an HTML page for some paths)",
                )
            try:
                _append(writer, chunk)
            except OSError as error:  # this machine, not the network: never retried
                raise _write_failed(target, part, progress.done, error) from None
            progress.digest.update(chunk)
            progress.done += len(chunk)
            if target.expected_size is not None and progress.done > target.expected_size:
                return  # too many bytes: the size check rejects the file
            if cap is not None and progress.done > cap:
                raise FetchError(
                    f"{target.display} sent more than the {human_bytes(cap)} a download without a sha256 "
                    f"pin may bring ({MAX_UNPINNED_ENV}); {progress.done} bytes are kept in {part}",
                    hint=f"pin the file's sha256 in the model recipe, or raise {MAX_UNPINNED_ENV}",
                )
            reporter(
                Event(
                    "progress",
                    f"downloading {target.filename}",
                    stage="fetch",
                    completed=progress.done,
                    total=total,
                    unit="bytes",
                )
            )


def _http_error(
    target: DownloadTarget, error: urllib.error.HTTPError, progress: _Progress, part: Path
) -> None:
    if error.code == 416 and progress.done:
        # The range starts at or past the end: complete if the server's length is what we have.
        total = (error.headers.get("Content-Range") or "").rpartition("/")[2]
        if total.isdigit() and int(total) == progress.done:
            return
        progress.restart(part)
        raise Transient("the server rejected the resume range; starting over")
    if (retry := transient(error)) is not None:
        raise retry
    hints = {
        401: "the server wants credentials: for Hugging Face set HF_TOKEN, for ModelScope MODELSCOPE_API_TOKEN",
        403: "access denied: a gated or private model needs a token with access (HF_TOKEN / MODELSCOPE_API_TOKEN)",
        404: "not found: check the source URL, repository, file name and revision",
    }
    raise FetchError(f"{target.display}: HTTP {error.code} {error.reason}", hint=hints.get(error.code))
