"""Fetch a model file into the content-addressed store: hf://, ms://, https:// (resumable), file://.

One pass over the bytes: they are hashed as they arrive (a resumed download first hashes the ``.part`` prefix
it already has, then goes on), written to ``partial/<key>.part`` and published into ``sha256/<hex>/`` by one
rename only once the sha256 and size verify, and a pinned file is hashed once more as it lies on disk before
that rename (the bytes counted on the way are not the file). A mismatch moves the file to quarantine and fails
naming both digests; the store is never touched. Only a GGUF is published: a file whose header does not parse,
or that holds neither tensors nor a vocabulary, is refused naming it (:mod:`llamaforge.models.model_file`).
``offline=True`` serves only what the store already has.

Every URL is checked before it is reached, and again at every redirect (:mod:`llamaforge.models.urls`);
nothing is written while the front is read-only.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from llamaforge.core import guard
from llamaforge.core.errors import FetchError, InvalidOption, ModelChecksumMismatch, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.validation import messages
from llamaforge.models import store as modelstore
from llamaforge.models.download import (
    DownloadTarget,
    copy_local,
    download,
    hash_file,
    load_sidecar,
    local_source,
    save_sidecar,
)
from llamaforge.models.hubs import HubFile, default_revision, is_commit, parse_hub_source, resolve
from llamaforge.models.model_file import check_model_file, local_model_path
from llamaforge.models.recipes import ModelRecipe, load_model_recipe
from llamaforge.models.urls import check_model_url, redact_url

DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 1.0


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
            "path": str(self.path),
            "sha256": self.sha256,
            "size": self.size,
            "cached": self.cached,
            "source": self.source,
            "revision": self.revision,
            "commit": self.commit,
        }


def _as_recipe(recipe_or_url: ModelRecipe | str) -> ModelRecipe:
    if isinstance(recipe_or_url, ModelRecipe):
        return recipe_or_url
    local = local_model_path(recipe_or_url)  # a file is a model, never read as a recipe
    if local is not None and "://" not in recipe_or_url:
        return ModelRecipe(source=local.resolve().as_uri())
    if "://" in recipe_or_url:
        try:
            return ModelRecipe(source=recipe_or_url)
        except ValidationError as error:
            raise InvalidOption(
                f"{recipe_or_url!r} is not a model source: {messages(error)}",
                hint="e.g. hf://unsloth/Qwen3.5-0.8B-GGUF/Qwen3.5-0.8B-Q4_K_M.gguf, https://host/path/model.gguf, "
                "file:///path/model.gguf, or the name of a model recipe in recipes/models/",
            ) from None
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
    cached = _from_cache(sha256, identity if use_index else None, size, reporter)
    if cached is not None:
        reporter(Event("info", f"cached: {cached.path}", stage="fetch"))
        return FetchResult(
            cached.path, cached.sha256, cached.size, True, display, revision, cached.manifest.get("commit")
        )
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
        cached = _from_cache(target.expected_sha256, None, target.expected_size, reporter)
        if cached is not None:
            if not guard.current().read_only:  # indexing the source is a write; the file is there already
                _remember(target, cached)
            reporter(Event("info", f"cached: {cached.path}", stage="fetch"))
            return FetchResult(
                cached.path, cached.sha256, cached.size, True, display, revision, target.commit
            )

    # 3. Download (resuming a .part if one is there), verify, publish.
    stored, reused = _download_and_publish(target, reporter, cancel, retries, backoff_s)
    _remember(target, stored)
    return FetchResult(stored.path, stored.sha256, stored.size, reused, display, revision, target.commit)


def _from_cache(
    sha256: str | None, identity: str | None, size: int | None, reporter: Reporter
) -> modelstore.StoredModel | None:
    stored = None
    if sha256:
        stored = modelstore.lookup(sha256)
    elif identity:
        known = modelstore.find_source(identity)
        if known is not None:
            stored = modelstore.lookup(str(known["sha256"]))
    if stored is not None and size is not None and stored.size != size:
        return None  # the recipe's size pin holds for a file found by its source too: fetched (and refused) again
    return _still_a_model(stored, reporter) if stored is not None else None


def _still_a_model(stored: modelstore.StoredModel, reporter: Reporter) -> modelstore.StoredModel | None:
    """``stored`` when it is a GGUF; an entry that is not (published before fetch checked the format) is moved
    to quarantine and fetched again, or, read-only, refused."""
    try:
        check_model_file(stored.path, reporter=reporter)
    except ModelError as error:
        if guard.current().read_only:
            raise
        moved = modelstore.quarantine_entry(stored.path.parent, reason=error.message)
        reporter(Event("warning", f"{error.message}: store entry moved to {moved}", stage="fetch"))
        return None
    return stored


def _remember(target: DownloadTarget, stored: modelstore.StoredModel) -> None:
    """Index the file under its source + revision (and + commit), for offline runs and for the lock."""
    data = {
        "source": target.display,
        "revision": target.revision,
        "commit": target.commit,
        "sha256": stored.sha256,
        "size": stored.size,
        "path": str(stored.path),
    }
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
) -> DownloadTarget:
    if source.startswith(("hf://", "ms://")):
        reporter(Event("info", f"resolving {source}@{revision}", stage="fetch"))
        hub_file = resolve(parse_hub_source(source), revision, pinned=sha256 is not None)
        return _hub_target(hub_file, sha256, size, identity, display)
    if not source.startswith("file://"):
        check_model_url(source, plain_http_ok=sha256 is not None)
    filename = _safe_filename(urllib.parse.unquote(PurePosixPath(urllib.parse.urlsplit(source).path).name))
    return DownloadTarget(identity, display, filename, source, sha256, size)


def _safe_filename(name: str) -> str:
    """A file name that stays inside its store directory."""
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\0" in name:
        return "model.gguf"
    return name


def _hub_target(
    hub_file: HubFile, sha256: str | None, size: int | None, identity: str, display: str
) -> DownloadTarget:
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
    return DownloadTarget(
        identity=identity,
        display=display,
        filename=_safe_filename(hub_file.source.filename),
        url=hub_file.url,
        expected_sha256=sha256 or hub_file.sha256,
        expected_size=size or hub_file.size,
        revision=hub_file.revision,
        commit=hub_file.commit,
        headers=hub_file.headers,
        private_headers=hub_file.private_headers,
    )


# --- download, check, publish ------------------------------------------------------------------------------


def _download_and_publish(
    target: DownloadTarget, reporter: Reporter, cancel: CancelToken, retries: int, backoff_s: float
) -> tuple[modelstore.StoredModel, bool]:
    """The published file, and whether the store already had these bytes."""
    guard.refuse_if_read_only(f"download {target.display} into the model store")
    if target.url.startswith("file://"):
        check_model_file(local_source(target), name=target.display)  # before a byte is copied
    key = modelstore.key_for(target.expected_sha256 or target.identity)
    part, sidecar = modelstore.partial_paths(key)
    with modelstore.download_lock(key):
        if part.is_symlink() or (part.exists() and not part.is_file()):
            # Not what a download leaves: writing through it would land outside the store, or fail mid-way.
            raise FetchError(
                f"{part} is not a regular file, so {target.display} cannot be downloaded into it",
                hint=f"remove {part} and fetch again",
            )
        state = load_sidecar(sidecar)
        if state.get("url") != modelstore.key_for(target.url):
            part.unlink(missing_ok=True)  # a .part from another URL may hold other bytes: start over
            state = {"url": modelstore.key_for(target.url)}
            save_sidecar(sidecar, state)
        if target.url.startswith("file://"):
            digest, size = copy_local(target, part, reporter, cancel)
        else:
            digest, size = download(target, part, sidecar, state, reporter, cancel, retries, backoff_s)
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
        _check_on_disk(target, part, digest, size, reporter, cancel)
        _check_format(target, part, sidecar, digest, reporter)
        manifest = {
            "source": target.display,
            "revision": target.revision,
            "commit": target.commit,
            "fetched_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        reused = modelstore.lookup(digest) is not None
        stored = modelstore.publish(part, sha256=digest, filename=target.filename, manifest=manifest)
        sidecar.unlink(missing_ok=True)
    reporter(Event("info", f"verified sha256 {digest}: {stored.path}", stage="fetch"))
    return stored, reused


def _check_on_disk(
    target: DownloadTarget, part: Path, digest: str, size: int, reporter: Reporter, cancel: CancelToken
) -> None:
    """Check the ``.part`` as it lies on disk, not the bytes counted on their way there: its size always, its
    sha256 again when a pin is at stake. A file that differs goes to quarantine."""
    on_disk = part.stat().st_size
    if on_disk != size:
        moved = modelstore.quarantine_file(part, target.filename, digest)
        raise ModelChecksumMismatch(
            f"{target.display}: {size} bytes arrived but the file on disk holds {on_disk}",
            hint=f"the disk or another program changed it; the file was moved to {moved}, the cache is "
            "untouched. Fetch again to download afresh",
        )
    if target.expected_sha256 is None:
        return
    reporter(Event("info", f"checking the sha256 of {target.filename} on disk", stage="fetch"))
    rehashed = hash_file(part, f"checking {target.filename} on disk", reporter, cancel)[0].hexdigest()
    if rehashed != digest:
        moved = modelstore.quarantine_file(part, target.filename, rehashed)
        raise ModelChecksumMismatch(
            f"{target.display}: the bytes arrived with sha256 {digest}, but the file on disk has {rehashed}",
            hint=f"the disk or another program changed it; the file was moved to {moved}, the cache is "
            "untouched. Fetch again to download afresh",
        )


def _check_format(target: DownloadTarget, part: Path, sidecar: Path, digest: str, reporter: Reporter) -> None:
    """Publish only a GGUF: a ``.part`` that is not one is removed (a copy of a local file) or moved to
    quarantine (a download), and the error names its source."""
    try:
        check_model_file(part, name=target.display, reporter=reporter)
    except ModelError as error:
        if target.url.startswith("file://"):
            part.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            kept = ""
        else:
            kept = f"; the file was moved to {modelstore.quarantine_file(part, target.filename, digest)}"
        raise ModelError(f"{error.message}; nothing was published{kept}", hint=error.hint) from None
