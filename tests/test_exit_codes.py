"""Exit codes scripts can trust: one code per failure class, each in the README's table under its class names.

A failure class is a subclass of LlamaforgeError with its own ``exit_code``; its subclasses are the same failure
told more precisely and keep that code. Unrelated classes share a code only as a family named in ``SHARED``.
Every module of llamaforge and of the MCP server is imported, so a class defined anywhere is seen.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import llamaforge
from llamaforge.core.errors import Cancelled, LlamaforgeError, OperationFailed, Terminated
from llamaforge.core.registry import operations
from llamaforge.fronts.cli_invoke import OUTPUT_CLOSED
from llamaforge.fronts.jupyter import NotebookError

REPO = Path(__file__).resolve().parents[1]

# Unrelated classes allowed to share a code, and why a script need not tell them apart.
SHARED = {2: ({"InvalidOption", "RecipeError"}, "bad input: what was given must change before a retry")}
# Classes whose instances carry the code of the failure they report (a failing verdict, a notebook's error).
CARRIERS = {OperationFailed, NotebookError}
# Codes no class raises: success, and the quiet end when stdout's reader went away.
NOT_FROM_A_CLASS = {0, OUTPUT_CLOSED}


def _import_all(package: ModuleType) -> None:
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)


def _error_classes() -> list[type[LlamaforgeError]]:
    operations()
    _import_all(llamaforge)
    if importlib.util.find_spec("mcp_server") is not None:
        _import_all(importlib.import_module("mcp_server"))
    found: list[type[LlamaforgeError]] = []
    pending = [LlamaforgeError]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: (cls.exit_code, cls.__name__))


CLASSES = [cls for cls in _error_classes() if cls not in CARRIERS]


def _family(cls: type[LlamaforgeError]) -> type[LlamaforgeError]:
    """The topmost ancestor whose code ``cls`` keeps: the failure class it belongs to."""
    while cls is not LlamaforgeError:
        parent = next(base for base in cls.__bases__ if issubclass(base, LlamaforgeError))
        if parent.exit_code != cls.exit_code:
            break
        cls = parent
    return cls


def _readme_rows() -> list[tuple[set[int], set[str]]]:
    """The README's exit-code table: each row's codes ("130 / 143") and the class names (in backticks) it gives."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("| code | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        code_cell, meaning = line.strip("|").split("|", 1)
        codes = {int(part) for part in code_cell.split("/")}
        rows.append((codes, set(re.findall(r"`([A-Z][A-Za-z0-9]*)`", meaning))))
    return rows


def _readme_table() -> dict[int, set[str]]:
    """Each code of the README's table and the class names of its row."""
    table: dict[int, set[str]] = {}
    for codes, names in _readme_rows():
        for code in codes:
            assert code not in table, f"exit code {code} has two rows in the README"
            table[code] = names
    return table


def test_the_walk_sees_errors_from_every_layer() -> None:
    modules = {cls.__module__.split(".")[1] for cls in CLASSES if cls.__module__.startswith("llamaforge.")}
    assert {"core", "build", "deploy", "runners", "gguf"} <= modules, modules


@pytest.mark.parametrize("code", sorted({cls.exit_code for cls in CLASSES}))
def test_each_code_belongs_to_one_failure_class(code: int) -> None:
    families = {_family(cls) for cls in CLASSES if cls.exit_code == code}
    names = {family.__name__ for family in families}
    if code in SHARED:
        assert names == SHARED[code][0], f"exit code {code} is the family {SHARED[code][0]}, not {names}"
    else:
        assert len(families) == 1, f"exit code {code} is shared by unrelated classes: {sorted(names)}"


def test_every_failure_class_sets_its_own_code() -> None:
    generic = [
        cls.__name__ for cls in CLASSES if cls is not LlamaforgeError and _family(cls) is LlamaforgeError
    ]
    assert generic == [], f"these inherit the generic code 1; give each a code of its own: {generic}"


def test_carriers_take_the_code_of_what_they_report() -> None:
    for carrier in CARRIERS:
        assert "exit_code" in inspect.signature(carrier).parameters, carrier


def test_codes_stay_clear_of_the_shells_own() -> None:
    """126 and 127 mean "cannot run" and "not found" to a shell, 128 + N "killed by signal N"; only a
    cancellation (SIGINT, SIGTERM) ends like the signal it was."""
    for cls in CLASSES:
        assert 1 <= cls.exit_code < 126 or cls in (Cancelled, Terminated), (cls, cls.exit_code)
    assert (Cancelled.exit_code, Terminated.exit_code, OUTPUT_CLOSED) == (130, 143, 141)


def test_class_names_are_unique() -> None:
    names = [cls.__name__ for cls in CLASSES]
    assert sorted(names) == sorted(set(names)), "the README names classes: two may not share a name"


def test_the_readme_lists_every_class_under_its_code() -> None:
    table = _readme_table()
    missing = [
        f"{cls.__name__} ({cls.exit_code})"
        for cls in CLASSES
        if cls.__name__ not in table.get(cls.exit_code, set())
    ]
    assert missing == [], f"not in the README's exit-code row of their code: {missing}"


def test_the_readme_table_has_no_stale_rows_or_names() -> None:
    by_name = {cls.__name__: cls for cls in CLASSES}
    codes = {cls.exit_code for cls in CLASSES}
    rows = set(_readme_table())
    assert rows == codes | NOT_FROM_A_CLASS, f"rows without a class: {rows - codes - NOT_FROM_A_CLASS}"
    for row_codes, names in _readme_rows():
        for name in names:
            assert name in by_name, f"the README's row {row_codes} names {name}, which is no error class"
            assert by_name[name].exit_code in row_codes, (
                f"{name} exits {by_name[name].exit_code}, not {row_codes}"
            )


def test_literal_codes_in_the_source_are_in_the_table() -> None:
    """A code written as a number (``OperationFailed(..., exit_code=13)``) is one the README explains."""
    table = _readme_table()
    literal = re.compile(r"\bexit_code\s*(?::\s*int\s*)?=\s*(\d+)\b")
    unknown = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for root in ("src", "mcp_server")
        for path in sorted((REPO / root).rglob("*.py"))
        for match in literal.finditer(path.read_text(encoding="utf-8"))
        if int(match.group(1)) not in table
    ]
    assert unknown == [], unknown
