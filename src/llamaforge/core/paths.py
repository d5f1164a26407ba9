"""Where llamaforge finds its shipped data (recipes, templates, patches) and keeps its cache."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from filelock import FileLock

DataKind = Literal["recipes", "templates", "patches"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


class PathTooLong(ValueError):
    """A path the file system cannot hold: a name over NAME_MAX, or the whole over PATH_MAX."""


def lexists(path: str | Path) -> bool:
    """Whether ``path`` exists (a dangling link counts); :class:`PathTooLong` when the file system cannot hold
    such a path (the file system answers, not a constant), where every reader would stop on an OSError."""
    try:
        os.lstat(path)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise PathTooLong(
                f"at {len(str(path))} characters this path is longer than the file system allows for a path or "
                "for one name in it: give the path of an existing file, or a shipped name"
            ) from None
        return False
    except ValueError:  # a NUL byte: no file has that name
        return False
    return True


def written_as_path(value: str) -> bool:
    """Whether a name-or-path argument is written as a path (a separator in it, or ``.`` or ``~`` first): when it
    names nothing, that is a missing file or directory to report, not an unknown name or key."""
    return "/" in value or os.sep in value or value.startswith((".", "~"))


def data_dir(kind: DataKind) -> Path:
    """Directory of shipped ``kind`` data: inside the wheel, or the source checkout's top-level folder."""
    override = os.environ.get(f"LLAMAFORGE_{kind.upper()}_DIR")
    if override:
        return Path(override)
    packaged = _PACKAGE_DIR / "data" / kind
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parents[1] / kind


def home() -> Path:
    """Root of llamaforge's caches and build store (``LLAMAFORGE_HOME``, else the XDG cache dir)."""
    explicit = os.environ.get("LLAMAFORGE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamaforge"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: readers see the old file or the new one, never a part
    (a temporary file beside it, renamed over it). A ``path`` that is there and is no regular file (a device,
    a directory, a pipe) is left alone: FileExistsError."""
    if path.exists() and not path.is_file():
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file is missing, unreadable, not JSON or not an object: what
    llamaforge keeps in its cache may have been cut, emptied or edited since it was written."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def cache_lock(path: Path) -> FileLock:
    """The inter-process lock file ``path`` of a cache (a build, a download, a source), its folder made; a
    ``path`` that is there and is no regular file (a directory left by hand) is a CacheError naming it, not an
    IsADirectoryError when the lock is taken."""
    from filelock import FileLock  # only work that takes a lock imports it: a cache hit does not

    from llamaforge.core.errors import CacheError

    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise CacheError(
            f"lock file {path} is not a regular file",
            hint="remove it (no llamaforge process holds it: a lock file is a plain file), then run again",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


def unwritable_reason(path: Path, error: OSError) -> str:
    """Why ``path`` could not be made, from ``error``: "X is not a directory" when a file stands where a folder
    above ``path`` must be (the OS says "File exists" or "Not a directory"), else the OS's words."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        # from the root down: the directories above the file could be searched, the OS went through them
        blocker = next(
            (parent for parent in reversed(path.parents) if parent.exists() and not parent.is_dir()), None
        )
        if blocker is not None:
            return f"{blocker} is not a directory"
    return error.strerror or str(error)
