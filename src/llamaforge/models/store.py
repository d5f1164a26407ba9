"""The model store: verified GGUF files, content-addressed by sha256, published atomically.

Layout under ``home()/models``::

    sha256/<hex>/<filename>      the verified file (read-only)
    sha256/<hex>/manifest.json   where it came from (source, revision, commit; never a token)
    sources/<key>.json           source + revision -> sha256, so offline mode finds unpinned recipes
    partial/<key>.part           bytes still arriving (resumable), with <key>.json beside it
    quarantine/                  files that failed verification, kept for inspection

A download lands in ``partial/`` and reaches ``sha256/`` by one directory rename, only after its sha256 (and
size) verified: a reader never sees a half-written or unverified file under ``sha256/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from llamaforge.core import guard
from llamaforge.core.paths import cache_lock, home, read_json_object

MANIFEST = "manifest.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class StoredModel:
    """One verified file in the store."""

    path: Path
    sha256: str
    size: int
    manifest: dict[str, Any]


def models_root() -> Path:
    """Root of the model store."""
    return home() / "models"


def _dir(name: str) -> Path:
    path = models_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def entry_dir(sha256: str) -> Path:
    """Directory of the store entry for ``sha256`` (may not exist)."""
    return models_root() / "sha256" / sha256


def lookup(sha256: str) -> StoredModel | None:
    """The verified file with this sha256, or None. An entry whose size no longer matches is quarantined."""
    entry = entry_dir(sha256)
    manifest_path = entry / MANIFEST
    if not manifest_path.is_file():
        if entry.is_dir() and not entry.is_symlink():
            # publish() renames an entry in whole, manifest included: this one was made or emptied by hand, and
            # left there it would block publishing these bytes again.
            _set_aside(entry, reason=f"no {MANIFEST}: not an entry the store published")
        return None
    manifest = read_json_object(manifest_path)
    filename, size = (manifest or {}).get("filename"), (manifest or {}).get("size")
    if (
        manifest is None
        or not isinstance(filename, str)
        or Path(filename).name != filename
        or not isinstance(size, int)
        or isinstance(size, bool)
    ):
        # A crash, a full disk or an edit left the entry's manifest unreadable: it no longer vouches for a file.
        _set_aside(entry, reason=f"{MANIFEST} is damaged (not JSON, or no plain filename and size)")
        return None
    path = entry / filename
    if not path.is_file() or path.stat().st_size != size:
        # Someone truncated or replaced the file behind our back: never serve it.
        _set_aside(entry, reason="size changed after publishing")
        return None
    return StoredModel(path=path, sha256=sha256, size=size, manifest=manifest)


def _set_aside(entry: Path, *, reason: str) -> None:
    """Quarantine an entry a lookup cannot serve; a read-only front only passes it by (it promised to write
    nothing, and a later writing run quarantines it)."""
    if not guard.current().read_only:
        quarantine_entry(entry, reason=reason)


def quarantine_entry(entry: Path, *, reason: str) -> Path:
    """Move a whole store entry to quarantine (with a note saying why)."""
    target = _dir("quarantine") / f"{entry.name}.{int(time.time())}.entry"
    entry.rename(target)
    (target / "QUARANTINED").write_text(reason + "\n", encoding="utf-8")
    return target


def quarantine_file(path: Path, filename: str, actual_sha256: str) -> Path:
    """Move a rejected download to quarantine; returns its new path."""
    target = _dir("quarantine") / f"{filename}.sha256-{actual_sha256[:12]}.rejected"
    if target.exists():
        target.unlink()
    path.replace(target)
    sidecar = path.with_suffix(".json")
    sidecar.unlink(missing_ok=True)
    return target


def partial_paths(key: str) -> tuple[Path, Path]:
    """The ``.part`` file and its JSON sidecar for download ``key``."""
    root = _dir("partial")
    return root / f"{key}.part", root / f"{key}.json"


def download_lock(key: str) -> FileLock:
    """Lock held while ``key`` downloads, so two processes never append to one ``.part``."""
    return cache_lock(_dir("partial") / f"{key}.lock")


def key_for(identity: str) -> str:
    """A short, file-name-safe key for a download or source identity."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:40]


def publish(part: Path, *, sha256: str, filename: str, manifest: dict[str, Any]) -> StoredModel:
    """Move a verified ``part`` into the store under ``sha256`` (one rename); reuse an existing entry."""
    existing = lookup(sha256)
    if existing is not None:
        part.unlink(missing_ok=True)
        return existing
    root = _dir("sha256")
    staging = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=root))
    try:
        target_file = staging / filename
        part.replace(target_file)
        target_file.chmod(0o444)  # the store is read-only: edits would silently break the sha256
        size = target_file.stat().st_size
        data = {**manifest, "sha256": sha256, "size": size, "filename": filename}
        (staging / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        staging.chmod(0o755)
        try:
            staging.rename(entry_dir(sha256))
        except OSError:
            # Another process published the same bytes first: theirs is as good as ours.
            if lookup(sha256) is None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    stored = lookup(sha256)
    assert stored is not None
    return stored


def record_source(identity: str, data: dict[str, Any]) -> None:
    """Remember which sha256 a source (+ revision) gave, for offline use. ``data`` must hold no secret."""
    path = _dir("sources") / f"{key_for(identity)}.json"
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    scratch.replace(path)


def find_source(identity: str) -> dict[str, Any] | None:
    """What ``record_source`` stored for ``identity``, or None (also when the record is damaged: it is only an
    index, and the next fetch of the source writes it again)."""
    path = models_root() / "sources" / f"{key_for(identity)}.json"
    if not path.is_file():
        return None
    data = read_json_object(path)
    if data is None or not _HEX64.fullmatch(str(data.get("sha256"))) or type(data.get("size")) is not int:
        return None
    return data
