"""The command line's index of operations: what Invoke needs to parse a command line (names, summaries, flags,
defaults, help), so that a run imports only the operation it runs instead of all of them.

The index is made from the registry (which imports every operation module) and kept as a small JSON file under
``home()/cache/``, named by a fingerprint of llamaforge's version and the path, size and mtime of every module in
the package: editing or upgrading any module makes a new index, and the indexes of other installations that share
the home stay. A missing, unreadable or unwritable cache only costs the full import.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llamaforge.core.paths import home, write_text_atomic
from llamaforge.core.registry import REGISTRY, Operation, operations
from llamaforge.core.version import __version__

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
Default = None | bool | int | float | str
_KEEP = 8  # indexes kept in one home: the installations that share it, and a few edits of one of them


@dataclass(frozen=True)
class FlagSpec:
    """One parameter as a command-line flag: its default (None for required and list parameters)."""

    name: str
    default: Default
    help: str
    iterable: bool = False  # a list parameter: the flag may be given several times


@dataclass(frozen=True)
class OperationSpec:
    """What the command line knows of an operation before importing it."""

    name: str
    module: str
    summary: str
    positional: tuple[str, ...]
    flags: tuple[FlagSpec, ...]

    def load(self) -> Operation:
        """The operation itself: imports its module only (all of them if the index is stale)."""
        # An index edited by hand may name no module: then the registry below imports every one.
        with contextlib.suppress(ImportError):
            importlib.import_module(self.module)
        return REGISTRY.get(self.name) or operations()[self.name]


def spec_of(op: Operation) -> OperationSpec:
    """The index entry of ``op``, read from its parameter model."""
    flags = []
    for name, field in op.params.model_fields.items():
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        iterable = isinstance(default, list)
        if iterable:
            default = None
        if not isinstance(default, Default):
            raise TypeError(
                f"operation {op.name}: parameter {name} has a default the CLI cannot hold: {default!r}"
            )
        flags.append(FlagSpec(name, default, field.description or "", iterable))
    return OperationSpec(op.name, op.run.__module__, op.summary, op.positional, tuple(flags))


def fingerprint() -> str:
    """Names the index of this installation: llamaforge's version and every module file's path, size and
    mtime."""
    digest = hashlib.sha256(__version__.encode())
    for module in sorted(_PACKAGE_DIR.rglob("*.py")):
        stat = module.stat()
        digest.update(f"{module}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def index_path() -> Path:
    """Where this installation's index is cached."""
    return home() / "cache" / f"cli-index-{fingerprint()}.json"


def operation_index() -> dict[str, OperationSpec]:
    """Every operation's index entry by name: from the cache when it is current, else from the registry (and
    then cached)."""
    path = index_path()
    try:
        if cached := _decode(json.loads(path.read_text(encoding="utf-8"))):
            return cached
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # not cached yet, or unreadable (not an object of entries, an empty one): made again below
    index = {name: spec_of(op) for name, op in sorted(operations().items())}
    _write(path, json.dumps({name: asdict(spec) for name, spec in index.items()}, sort_keys=True))
    return index


def _decode(data: dict[str, Any]) -> dict[str, OperationSpec]:
    return {
        name: OperationSpec(
            entry["name"],
            entry["module"],
            entry["summary"],
            tuple(entry["positional"]),
            tuple(FlagSpec(**flag) for flag in entry["flags"]),
        )
        for name, entry in data.items()
    }


def _write(path: Path, text: str) -> None:
    """Write the index whole and keep only the ``_KEEP`` newest indexes; a read-only home is no error. Several
    installations (checkouts, virtual environments) may share one home: each keeps its own index, so running
    them in turn does not make every run import every operation again."""
    try:
        write_text_atomic(path, text)
        indexes = sorted(
            path.parent.glob("cli-index-*.json"), key=lambda index: index.stat().st_mtime_ns, reverse=True
        )
        for stale in indexes[_KEEP:]:
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError:
        return
