"""The build store: ``builds/<key>/`` holds artifacts and ``manifest.json``; entries appear atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.core.errors import CacheError, InvalidOption
from llamaforge.core.paths import cache_lock, home, written_as_path

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
    return cache_lock(home() / "locks" / f"{key}.lock")


def load_manifest(key: str) -> dict[str, Any] | None:
    """The manifest of a published build, or None when there is none (CacheError when it is unreadable)."""
    path = build_dir(key) / MANIFEST
    if not path.is_file():
        return None
    try:
        return _read_manifest(path)
    except ValueError as error:
        raise CacheError(
            f"build {key} is damaged: {error}", hint=f"rebuild it with --force, or remove {path.parent}"
        ) from None


def read_build_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the build directory ``directory``, in the store or copied out of it (CacheError naming the
    directory when it is unreadable, or lists a file the directory lacks)."""
    try:
        return _read_manifest(directory / MANIFEST)
    except ValueError as error:
        raise CacheError(
            f"build directory {directory} is damaged: {error}",
            hint="copy the build again, or rebuild it (`invoke build --force`) and give its key",
        ) from None


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


def record_check(key: str, check: dict[str, Any]) -> None:
    """Append ``check`` to the ``reproducibility`` list of build ``key``'s manifest (a new file renamed over the
    old one, under the build's lock); a build no longer in the store is left alone."""
    path = build_dir(key) / MANIFEST
    with build_lock(key):
        if not path.is_file():
            return
        try:
            manifest = _read_manifest(path)
        except ValueError as error:
            raise CacheError(
                f"build {key} is damaged: {error}", hint=f"rebuild it with --force, or remove {path.parent}"
            ) from None
        manifest["reproducibility"] = [*manifest.get("reproducibility", []), check]
        fresh = path.with_name(f".{MANIFEST}.{os.getpid()}")
        fresh.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        fresh.replace(path)


@dataclass(frozen=True)
class BrokenEntry:
    """A store entry whose manifest cannot be read: its directory and why."""

    path: Path
    error: str


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path``; ValueError naming the problem when it is not a build manifest."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {MANIFEST}: {error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{MANIFEST} is not JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        raise ValueError(f"{MANIFEST} is not a build manifest (no key)")
    for field, kind in _SHAPES.items():  # what the fronts read without asking; a field left out is older
        if field in data and not isinstance(data[field], kind):
            raise ValueError(f"{MANIFEST}: {field!r} is not a {'table' if kind is dict else 'list'}")
    if any(
        not isinstance(patch, dict) or not isinstance(patch.get("name"), str)
        for patch in data.get("patches", [])
    ):
        raise ValueError(f"{MANIFEST}: 'patches' holds an entry with no name")
    _check_artifacts(path.parent, data)
    return data


# The fields of a manifest that hold a table or a list, as the build writes them.
_SHAPES: dict[str, type] = {
    "recipe": dict,
    "options": dict,
    "source": dict,
    "patches": list,
    "targets": list,
    "cuda_architectures": list,
    "cmake_args": list,
}


def _check_artifacts(directory: Path, manifest: dict[str, Any]) -> None:
    """ValueError naming the first file the manifest lists that is missing from ``directory`` or has another
    size, so that a build left half-deleted or truncated (a full disk, a manual edit) is not reused as if whole.
    Sizes only: hashing every artifact on each cache hit would cost more than the hit saves."""
    artifacts = manifest.get("artifacts", {})
    if not isinstance(artifacts, dict):
        raise ValueError(f"{MANIFEST}: 'artifacts' is not a table of files")
    for relative, record in sorted(artifacts.items()):
        size = record.get("size") if isinstance(record, dict) else None
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError(f"{MANIFEST}: artifact {relative} has no size")
        path = directory / relative
        if not path.is_file():
            raise ValueError(f"{relative}, listed in {MANIFEST}, is missing")
        if (actual := path.stat().st_size) != size:
            raise ValueError(f"{relative} has {actual} bytes, {MANIFEST} says {size}")


def scan_builds() -> tuple[list[dict[str, Any]], list[BrokenEntry]]:
    """Manifests of all published builds, newest first, and the entries whose manifest is unreadable (one
    broken entry hides no other build)."""
    root = builds_root()
    for directory in (root.parent, root):
        if (
            directory.exists() and not directory.is_dir()
        ):  # else "no builds yet", and no build could be stored
            raise CacheError(
                f"{directory}, where builds are stored, is not a directory",
                hint="point LLAMAFORGE_HOME at a directory (`invoke doctor` checks it), or move the file away",
            )
    manifests, broken = [], []
    for entry in sorted(root.glob("*/" + MANIFEST)) if root.is_dir() else []:
        if entry.parent.name.startswith("."):  # publish() names its scratch so; a crash may leave one behind
            leftover = (
                "left over from a forced rebuild that was interrupted, no build of the store: remove it"
            )
            broken.append(BrokenEntry(entry.parent, leftover))
            continue
        try:
            manifest = _read_manifest(entry)
        except ValueError as error:
            broken.append(BrokenEntry(entry.parent, str(error)))
            continue
        if manifest["key"] != entry.parent.name:  # a copied or edited manifest: its key names another build
            names = f"{MANIFEST} names build {manifest['key']}, not the directory's {entry.parent.name}"
            broken.append(BrokenEntry(entry.parent, names))
            continue
        manifests.append(manifest)
    manifests.sort(key=lambda item: str(item.get("finished_at", "")), reverse=True)
    return manifests, broken


def list_builds() -> list[dict[str, Any]]:
    """Manifests of all published builds, newest first (entries with an unreadable manifest left out)."""
    return scan_builds()[0]


def build_path(value: str, option: str) -> Path | None:
    """``value`` of a build option (``option``, e.g. ``--build``) as the directory it names, or None for a key
    the store looks up; a value written as a path (a separator, ``.`` or ``~`` first) that names nothing is
    refused as such, not as a key no build has."""
    path = Path(value).expanduser()
    if path.exists():
        return path
    if written_as_path(value):
        raise InvalidOption(
            f"{option} {value}: no such build directory",
            hint="give a build's directory or its key (`invoke builds.list` shows them)",
        )
    return None


def find_build(prefix: str) -> dict[str, Any]:
    """The manifest of the one build whose key starts with ``prefix``."""
    manifests, broken = scan_builds()
    matches = [item for item in manifests if str(item["key"]).startswith(prefix)] if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        damaged = [entry for entry in broken if prefix and entry.path.name.startswith(prefix)]
        if len(damaged) > 1:
            raise CacheError(
                f"{len(damaged)} damaged store entries start with {prefix!r}, and no build",
                hint="give more characters of the key; `invoke builds.list` names the damaged entries",
            )
        if damaged:
            raise CacheError(
                f"build {damaged[0].path.name} is damaged: {damaged[0].error}",
                hint=f"rebuild it (`invoke build --force`), or remove {damaged[0].path}",
            )
        if prefix.strip("0123456789abcdef"):
            # a path, or a recipe name: said as such, not as a key that no build happens to have
            raise CacheError(
                f"{prefix!r} is not a build key: keys are lower-case hex digits",
                hint="`invoke builds.list` shows the builds and their keys",
            )
        raise CacheError(f"no build with key {prefix!r}", hint="`invoke builds.list` shows the builds")
    raise CacheError(f"{len(matches)} builds start with {prefix!r}", hint="give more characters of the key")
