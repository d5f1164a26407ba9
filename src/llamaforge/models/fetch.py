"""Fetch a model file into the content-addressed store: hf://, ms://, https:// (resumable), file://.

One pass over the bytes: they are hashed as they arrive (a resumed download first hashes the ``.part`` prefix
it already has, then goes on), written to ``partial/<key>.part`` and published into ``sha256/<hex>/`` by one
rename only once the sha256 and size verify. A mismatch moves the file to quarantine and fails naming both
digests; the store is never touched. ``offline=True`` serves only what the store already has.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from llamaforge.core.errors import FetchError, InvalidOption, ModelChecksumMismatch
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.models import store as modelstore
from llamaforge.models.hubs import HubFile, default_revision, is_commit, parse_hub_source, resolve, scrub
from llamaforge.models.recipes import ModelRecipe, load_model_recipe

_CHUNK = 1 << 20
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class FetchResult:
    """A verified model file in the store."""

    path: Path
    sha256: str
    size: int
    cached: bool
    source: str = ""
    revision: str | None = None
    commit: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the source is already redacted)."""
        return {
            "path": str(self.path), "sha256": self.sha256, "size": self.size, "cached": self.cached,
            "source": self.source, "revision": self.revision, "commit": self.commit,
        }  # fmt: skip


@dataclass(frozen=True)
class _Target:
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
        return tuple(value for value in self.private_headers.values() if value)


class _Transient(Exception):
    """A failure worth retrying (connection reset, short read, 5xx)."""


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment (where signed URLs and tokens hide)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _as_recipe(recipe_or_url: ModelRecipe | str) -> ModelRecipe:
    if isinstance(recipe_or_url, ModelRecipe):
        return recipe_or_url
    if "://" in recipe_or_url:
        try:
            return ModelRecipe(source=recipe_or_url)
        except ValueError as error:
            raise InvalidOption(f"{recipe_or_url!r} is not a model source: {error}") from None
    return load_model_recipe(recipe_or_url)


def fetch_model(
    recipe_or_url: ModelRecipe | str,
    *,
    offline: bool = False,
    revision: str | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    retries: int = DEFAULT_RETRIES,
    backoff_s: float = DEFAULT_BACKOFF_S,
) -> FetchResult:
    """Return the verified file of a model recipe (name, path or object) or URL, downloading it if needed.

    ``revision`` overrides the recipe's hub revision (the recipe's sha256/size pins then no longer apply).
    ``retries`` bounds consecutive failed attempts without progress; waits double from ``backoff_s``.
    """
    from llamaforge.models.lock import apply_lock

    cancel = cancel or CancelToken()
    recipe = apply_lock(_as_recipe(recipe_or_url))
    hub = recipe.source.startswith(("hf://", "ms://"))
    if revision is not None and not hub:
        raise InvalidOption("--revision applies to hf:// and ms:// sources only")
    sha256, size = recipe.sha256, recipe.size
    if revision is not None and revision != recipe.revision:
        if sha256:
            reporter(
                Event(
                    "warning", f"--revision {revision}: the recipe's sha256/size pins do not apply", "fetch"
                )
            )
        sha256 = size = None
    else:
        revision = recipe.revision
    if hub and revision is None:
        revision = default_revision(recipe.source[:2])
    identity = f"{recipe.source}@{revision or ''}"
    display = redact_url(recipe.source) if recipe.source.startswith("http") else recipe.source

    # 1. The store: a pinned sha256, or what this source + revision gave last time. A hub branch moves, so
    #    online it is asked again (one HEAD); offline, or at a commit, the last answer stands. URLs are taken
    #    as immutable (pin their sha256 otherwise); a local file is always hashed afresh.
    moving = hub and not is_commit(revision) and not offline
    use_index = not moving and not recipe.source.startswith("file://")
    cached = _from_cache(sha256, identity if use_index else None, size)
    if cached is not None:
        reporter(Event("info", f"cached: {cached.path}", stage="fetch"))
        return FetchResult(cached.path, cached.sha256, cached.size, True, display, revision,
                           cached.manifest.get("commit"))  # fmt: skip
    if offline and not recipe.source.startswith("file://"):
        raise FetchError(
            f"{display}{'@' + revision if revision else ''} is not in the model cache and --offline forbids "
            "downloading it",
            hint="run once without --offline on a machine that reaches the hub, or copy the file and fetch it "
            "with file://",
        )

    # 2. Resolve the source to a download target.
    target = _resolve_target(recipe.source, revision, sha256, size, identity, display, reporter)
    if target.expected_sha256:
        cached = _from_cache(target.expected_sha256, None, target.expected_size)
        if cached is not None:
            _remember(target, cached)
            reporter(Event("info", f"cached: {cached.path}", stage="fetch"))
            return FetchResult(
                cached.path, cached.sha256, cached.size, True, display, revision, target.commit
            )

    # 3. Download (resuming a .part if one is there), verify, publish.
    stored, reused = _download_and_publish(target, reporter, cancel, retries, backoff_s)
    _remember(target, stored)
    return FetchResult(stored.path, stored.sha256, stored.size, reused, display, revision, target.commit)


def _from_cache(sha256: str | None, identity: str | None, size: int | None) -> modelstore.StoredModel | None:
    if sha256:
        stored = modelstore.lookup(sha256)
        return stored if stored is not None and (size is None or stored.size == size) else None
    if identity:
        known = modelstore.find_source(identity)
        if known is not None:
            return modelstore.lookup(str(known["sha256"]))
    return None


def _remember(target: _Target, stored: modelstore.StoredModel) -> None:
    """Index the file under its source + revision (and + commit), for offline runs and for the lock."""
    data = {
        "source": target.display, "revision": target.revision, "commit": target.commit,
        "sha256": stored.sha256, "size": stored.size, "path": str(stored.path),
    }  # fmt: skip
    modelstore.record_source(target.identity, data)
    if target.commit and target.commit != target.revision:
        source = target.identity.rpartition("@")[0]
        modelstore.record_source(f"{source}@{target.commit}", data)


def _resolve_target(
    source: str,
    revision: str | None,
    sha256: str | None,
    size: int | None,
    identity: str,
    display: str,
    reporter: Reporter,
) -> _Target:
    if source.startswith(("hf://", "ms://")):
        reporter(Event("info", f"resolving {source}@{revision}", stage="fetch"))
        hub_file = resolve(parse_hub_source(source), revision)
        return _hub_target(hub_file, sha256, size, identity, display)
    filename = _safe_filename(urllib.parse.unquote(PurePosixPath(urllib.parse.urlsplit(source).path).name))
    return _Target(identity, display, filename, source, sha256, size)


def _safe_filename(name: str) -> str:
    """A file name that stays inside its store directory."""
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\0" in name:
        return "model.gguf"
    return name


def _hub_target(
    hub_file: HubFile, sha256: str | None, size: int | None, identity: str, display: str
) -> _Target:
    where = f"{display}@{hub_file.revision}"
    if sha256 and hub_file.sha256 and sha256 != hub_file.sha256:
        raise ModelChecksumMismatch(
            f"{where}: the recipe pins sha256 {sha256} but the hub publishes {hub_file.sha256}",
            hint="the file changed upstream: pin a commit (`invoke models.lock`) or update the recipe",
        )
    if size and hub_file.size and size != hub_file.size:
        raise ModelChecksumMismatch(
            f"{where}: the recipe pins size {size} but the hub reports {hub_file.size}",
            hint="the file changed upstream: pin a commit (`invoke models.lock`) or update the recipe",
        )
    return _Target(
        identity=identity, display=display, filename=_safe_filename(hub_file.source.filename), url=hub_file.url,
        expected_sha256=sha256 or hub_file.sha256, expected_size=size or hub_file.size,
        revision=hub_file.revision, commit=hub_file.commit,
        headers=hub_file.headers, private_headers=hub_file.private_headers,
    )  # fmt: skip


# --- download engine ---------------------------------------------------------------------------------------


def _download_and_publish(
    target: _Target, reporter: Reporter, cancel: CancelToken, retries: int, backoff_s: float
) -> tuple[modelstore.StoredModel, bool]:
    """The published file, and whether the store already had these bytes."""
    key = modelstore.key_for(target.expected_sha256 or target.identity)
    part, sidecar = modelstore.partial_paths(key)
    with modelstore.download_lock(key):
        state = _load_sidecar(sidecar)
        if state.get("url") != modelstore.key_for(target.url):
            part.unlink(missing_ok=True)  # a .part from another URL may hold other bytes: start over
            state = {"url": modelstore.key_for(target.url)}
            _save_sidecar(sidecar, state)
        if target.url.startswith("file://"):
            digest, size = _copy_local(target, part, reporter, cancel)
        else:
            digest, size = _download(target, part, sidecar, state, reporter, cancel, retries, backoff_s)
        if target.expected_size is not None and size != target.expected_size:
            moved = modelstore.quarantine_file(part, target.filename, digest)
            raise ModelChecksumMismatch(
                f"{target.display}: expected {target.expected_size} bytes, got {size}",
                hint=f"the file was moved to {moved}; the cache is untouched",
            )
        if target.expected_sha256 is not None and digest != target.expected_sha256:
            moved = modelstore.quarantine_file(part, target.filename, digest)
            raise ModelChecksumMismatch(
                f"sha256 mismatch for {target.display}: expected {target.expected_sha256}, got {digest}",
                hint=f"the file was moved to {moved}; the cache is untouched. Fetch again to download afresh; "
                "if the new file is trusted, pin its sha256 in the recipe",
            )
        manifest = {
            "source": target.display, "revision": target.revision, "commit": target.commit,
            "fetched_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }  # fmt: skip
        reused = modelstore.lookup(digest) is not None
        stored = modelstore.publish(part, sha256=digest, filename=target.filename, manifest=manifest)
        sidecar.unlink(missing_ok=True)
    reporter(Event("info", f"verified sha256 {digest}: {stored.path}", stage="fetch"))
    return stored, reused


def _load_sidecar(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data


def _save_sidecar(path: Path, state: dict[str, Any]) -> None:
    path.write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")


def _copy_local(target: _Target, part: Path, reporter: Reporter, cancel: CancelToken) -> tuple[str, int]:
    source = Path(urllib.request.url2pathname(urllib.parse.urlsplit(target.url).path))
    if not source.is_file():
        raise FetchError(f"{source} does not exist", hint="fix the file:// path")
    digest = hashlib.sha256()
    total = source.stat().st_size
    done = 0
    with source.open("rb") as reader, part.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            cancel.raise_if_cancelled()
            writer.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            reporter(Event("progress", f"copying {source.name}", stage="fetch", completed=done, total=total))
    return digest.hexdigest(), done


def _hash_prefix(part: Path, reporter: Reporter, cancel: CancelToken) -> tuple[Any, int]:
    digest = hashlib.sha256()
    done = 0
    total = part.stat().st_size
    with part.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            cancel.raise_if_cancelled()
            digest.update(chunk)
            done += len(chunk)
            reporter(
                Event("progress", "hashing the partial download", stage="fetch", completed=done, total=total)
            )
    return digest, done


@dataclass
class _Progress:
    """The bytes in the .part so far and their running sha256 (updated in place, even by a failed attempt)."""

    digest: Any
    done: int

    def restart(self, part: Path) -> None:
        """Forget everything: empty .part, fresh hash."""
        part.write_bytes(b"")
        self.digest, self.done = hashlib.sha256(), 0


def _download(
    target: _Target,
    part: Path,
    sidecar: Path,
    state: dict[str, Any],
    reporter: Reporter,
    cancel: CancelToken,
    retries: int,
    backoff_s: float,
) -> tuple[str, int]:
    progress = _Progress(hashlib.sha256(), 0)
    if part.is_file() and (target.expected_size is None or part.stat().st_size <= target.expected_size):
        progress.digest, progress.done = _hash_prefix(part, reporter, cancel)
        if progress.done:
            reporter(Event("info", f"resuming {target.display} at byte {progress.done}", stage="fetch"))
    else:
        progress.restart(part)
    failures = 0
    opener = _opener()
    while True:
        cancel.raise_if_cancelled()
        before = progress.done
        try:
            _attempt(target, part, sidecar, state, progress, opener, reporter, cancel)
        except _Transient as error:
            # An attempt that brought bytes restarts the count: only stalls exhaust the retries.
            failures = 1 if progress.done > before else failures + 1
            if failures > retries:
                raise FetchError(
                    f"downloading {target.display} failed after {retries} retries: "
                    f"{scrub(str(error), target.secrets)}",
                    hint=f"{progress.done} bytes are kept in {part}; fetch again to resume",
                ) from None
            delay = wait_seconds(failures, backoff_s)
            reporter(
                Event("warning", f"{error}; resuming at byte {progress.done} in {delay:.1f} s", stage="fetch")
            )
            _sleep(delay, cancel)
            continue
        return progress.digest.hexdigest(), progress.done


def _opener() -> urllib.request.OpenerDirector:
    context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or None)
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))


def _attempt(
    target: _Target,
    part: Path,
    sidecar: Path,
    state: dict[str, Any],
    progress: _Progress,
    opener: urllib.request.OpenerDirector,
    reporter: Reporter,
    cancel: CancelToken,
) -> None:
    """One HTTP request appending to ``part``; returns when the file is complete, raises _Transient if not."""
    if target.expected_size is not None and progress.done == target.expected_size:
        return  # a complete .part from an earlier run: only the checks are left
    if not target.url.startswith(("https://", "http://")):
        raise FetchError(f"unsupported URL {target.display}", hint="use hf://, ms://, https:// or file://")
    headers = {**target.headers, "Accept-Encoding": "identity"}
    request = urllib.request.Request(target.url, headers=headers)  # noqa: S310 - http(s) only, checked above
    for name, value in target.private_headers.items():
        request.add_unredirected_header(name, value)  # never forwarded to a redirect target (CDN)
    if progress.done:
        request.add_header("Range", f"bytes={progress.done}-")
        if state.get("etag"):
            request.add_header("If-Range", str(state["etag"]))
    try:
        response = opener.open(request, timeout=60)
    except urllib.error.HTTPError as error:
        error.close()  # an HTTPError holds the open response
        _http_error(target, error, progress, part)
        return
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise _Transient(f"{getattr(error, 'reason', error)}") from None
    with response:
        if progress.done and response.status == 200:
            # The server ignored the range (or the file changed, per If-Range): start over.
            reporter(
                Event("warning", f"{target.display}: the server sent the whole file; restarting", "fetch")
            )
            progress.restart(part)
        elif progress.done and response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range"))
            if start != progress.done:
                raise _Transient(f"asked for byte {progress.done}, got a range from {start}")
        etag = response.headers.get("ETag")
        if etag and not etag.startswith("W/") and etag != state.get("etag"):
            state["etag"] = etag
            _save_sidecar(sidecar, state)
        length = response.headers.get("Content-Length")
        # Where this response says the file ends: http.client does not raise on a short body, we must check.
        announced = progress.done + int(length) if length and length.isdigit() else None
        total = target.expected_size or announced
        try:
            with part.open("ab") as writer:
                while chunk := response.read(_CHUNK):
                    cancel.raise_if_cancelled()
                    writer.write(chunk)
                    progress.digest.update(chunk)
                    progress.done += len(chunk)
                    if target.expected_size is not None and progress.done > target.expected_size:
                        return  # too many bytes: the size check rejects the file
                    reporter(Event("progress", f"downloading {target.filename}", stage="fetch",
                                   completed=progress.done, total=total))  # fmt: skip
        except (OSError, http.client.HTTPException) as error:
            raise _Transient(f"connection lost at byte {progress.done} ({type(error).__name__})") from None
    end = target.expected_size if target.expected_size is not None else announced
    if end is not None and progress.done < end:
        raise _Transient(f"the server closed the transfer at byte {progress.done} of {end}")


def _http_error(target: _Target, error: urllib.error.HTTPError, progress: _Progress, part: Path) -> None:
    if error.code == 416 and progress.done:
        # The range starts at or past the end: complete if the server's length is what we have.
        total = (error.headers.get("Content-Range") or "").rpartition("/")[2]
        if total.isdigit() and int(total) == progress.done:
            return
        progress.restart(part)
        raise _Transient("the server rejected the resume range; starting over")
    if error.code in _RETRYABLE_STATUS:
        raise _Transient(f"HTTP {error.code}")
    hints = {
        401: "the server wants credentials: for Hugging Face set HF_TOKEN, for ModelScope MODELSCOPE_API_TOKEN",
        403: "access denied: a gated or private model needs a token with access (HF_TOKEN / MODELSCOPE_API_TOKEN)",
        404: "not found: check the source URL, repository, file name and revision",
    }
    raise FetchError(f"{target.display}: HTTP {error.code} {error.reason}", hint=hints.get(error.code))


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes "):
        return None
    first = value[6:].partition("-")[0]
    return int(first) if first.isdigit() else None


def wait_seconds(attempt: int, backoff_s: float) -> float:
    """The wait before retry ``attempt`` (1-based): doubling from ``backoff_s``, capped at 30 s."""
    return min(backoff_s * float(1 << min(max(attempt - 1, 0), 16)), _MAX_BACKOFF_S)


def _sleep(seconds: float, cancel: CancelToken) -> None:
    """Sleep, but wake up at once (and raise) when the operation is cancelled."""
    woken = threading.Event()
    remove = cancel.on_cancel(woken.set)
    try:
        woken.wait(seconds)
    finally:
        remove()
    cancel.raise_if_cancelled()
