"""The build store: ``builds/<key>/`` holds artifacts and ``manifest.json``; entries appear atomically."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.core.errors import CacheError
from llamaforge.core.paths import home

if TYPE_CHECKING:
    from filelock import FileLock

MANIFEST = "manifest.json"


def builds_root() -> Path:
    """Directory of published builds."""
    return home() / "builds"


def build_dir(key: str) -> Path:
    """Directory of the build ``key`` (may not exist)."""
    return builds_root() / key


def build_lock(key: str) -> FileLock:
    """Lock held while ``key`` is being built, so concurrent builds of one key build once."""
    locks = home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # only a build takes the lock: a cache hit does not import it

    return FileLock(str(locks / f"{key}.lock"))


def load_manifest(key: str) -> dict[str, Any] | None:
    """The manifest of a published build, or None when there is none."""
    path = build_dir(key) / MANIFEST
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def staging_dir(key: str) -> Path:
    """A fresh private directory on the store's file system, for a build to fill before publishing."""
    root = home() / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"build-{key[:12]}-", dir=root))


def publish(staging: Path, key: str, manifest: dict[str, Any]) -> Path:
    """Write the manifest last, then move ``staging`` into place with one rename."""
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    staging.chmod(0o755)  # mkdtemp makes it private; published builds are readable like any install
    target = build_dir(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        # A forced rebuild replaces the entry: move the old one aside first so the swap is never partial.
        retired = target.with_name(f".retired-{key}-{staging.name}")
        target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(target)
    return target


def list_builds() -> list[dict[str, Any]]:
    """Manifests of all published builds, newest first."""
    root = builds_root()
    manifests = []
    for entry in root.glob("*/" + MANIFEST) if root.is_dir() else []:
        manifests.append(json.loads(entry.read_text(encoding="utf-8")))
    return sorted(manifests, key=lambda item: str(item.get("finished_at", "")), reverse=True)


def find_build(prefix: str) -> dict[str, Any]:
    """The manifest of the one build whose key starts with ``prefix``."""
    matches = [item for item in list_builds() if str(item["key"]).startswith(prefix)] if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CacheError(f"no build with key {prefix!r}", hint="`invoke builds.list` shows the builds")
    raise CacheError(f"{len(matches)} builds start with {prefix!r}", hint="give more characters of the key")
