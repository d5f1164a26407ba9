"""Exit codes scripts can trust: one code per failure class, each a name of ``core.errors.ExitCode`` and a row of
docs/exit-codes.md that lists exactly the classes of that code.

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
from llamaforge.core.errors import Cancelled, ExitCode, LlamaforgeError, OperationFailed, Terminated
from llamaforge.core.registry import operations
from llamaforge.fronts.cli_invoke import OUTPUT_CLOSED
from llamaforge.fronts.jupyter import NotebookError

pytestmark = pytest.mark.quick

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


def _table_rows() -> list[tuple[int, str, set[str]]]:
    """docs/exit-codes.md's table: each row's code, its ``ExitCode`` name and the class names of its classes cell."""
    text = (REPO / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    start = text.index("| code | `ExitCode` | error classes | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        code, name, classes, _meaning = (cell.strip() for cell in line.strip("|").split("|", 3))
        rows.append((int(code), name.strip("`"), set(re.findall(r"`([A-Z][A-Za-z0-9]*)`", classes))))
    return rows


def _exit_codes() -> dict[str, int]:
    """The names and numbers of ``ExitCode``."""
    return {
        name: value for name, value in vars(ExitCode).items() if name.isupper() and isinstance(value, int)
    }


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
    assert sorted(names) == sorted(set(names)), "docs/exit-codes.md names classes: two may not share a name"


def test_exit_code_names_are_distinct_numbers() -> None:
    codes = _exit_codes()
    assert len(set(codes.values())) == len(codes), codes


def test_every_class_code_is_an_exit_code_name() -> None:
    named = set(_exit_codes().values())
    unnamed = [f"{cls.__name__} ({cls.exit_code})" for cls in CLASSES if cls.exit_code not in named]
    assert unnamed == [], f"codes not in core.errors.ExitCode: {unnamed}"
    assert set(named) == {cls.exit_code for cls in CLASSES} | NOT_FROM_A_CLASS, (
        "an ExitCode name no class uses"
    )


def test_the_table_has_one_row_per_exit_code_name() -> None:
    rows = [(code, name) for code, name, _classes in _table_rows()]
    assert rows == sorted(((code, name) for name, code in _exit_codes().items()), key=lambda row: row[0])


def test_each_row_lists_exactly_the_classes_of_its_code() -> None:
    for code, _name, names in _table_rows():
        expected = {cls.__name__ for cls in CLASSES if cls.exit_code == code}
        assert names == expected, (
            f"docs/exit-codes.md row {code}: {sorted(names)}, the code: {sorted(expected)}"
        )


def test_codes_are_written_only_in_errors_py() -> None:
    """Elsewhere a code is a name (``exit_code=ExitCode.DEPLOY``, ``SmokeFailed.exit_code``), never a number."""
    literal = re.compile(r"\bexit_code\s*(?::\s*int\s*)?=\s*(\d+)\b|\bOUTPUT_CLOSED\s*=\s*\d")
    errors_py = REPO / "src" / "llamaforge" / "core" / "errors.py"
    written = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for root in ("src", "mcp_server")
        for path in sorted((REPO / root).rglob("*.py"))
        if path != errors_py
        for match in literal.finditer(path.read_text(encoding="utf-8"))
    ]
    assert written == [], written
