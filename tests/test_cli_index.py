"""The command line's operation index: made from the registry, cached, remade when the package changes or the
cache is damaged, and the namespace built from it is the one the registry describes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llamaforge.core.registry import operations
from llamaforge.fronts import cli_index
from llamaforge.fronts.cli import namespace
from llamaforge.fronts.cli_index import operation_index, spec_of

pytestmark = pytest.mark.quick


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMAFORGE_HOME", str(tmp_path))
    return tmp_path


def test_the_cached_index_is_the_registrys(home: Path) -> None:
    made = operation_index()
    cached = cli_index.index_path()
    assert cached.parent == home / "cache" and cached.is_file()
    assert operation_index() == made == {name: spec_of(op) for name, op in sorted(operations().items())}
    build = made["build"]
    assert build.module == "llamaforge.build.ops"
    flags = {flag.name: flag for flag in build.flags}
    assert flags["backend"].default is None and flags["cmake"].iterable
    assert build.load() is operations()["build"]


def test_a_changed_package_or_a_damaged_cache_makes_a_new_index(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operation_index()
    old = cli_index.index_path()
    old.write_text('{"build": {"name": "build"}}', encoding="utf-8")  # damaged: fields missing
    assert operation_index()["build"] == spec_of(operations()["build"])
    assert json.loads(old.read_text(encoding="utf-8"))["build"]["module"] == "llamaforge.build.ops"

    monkeypatch.setattr(cli_index, "fingerprint", lambda: "an-edited-package")
    operation_index()
    assert sorted(path.name for path in (home / "cache").iterdir()) == sorted(
        ["cli-index-an-edited-package.json", old.name]
    )


@pytest.mark.parametrize("text", ["[1]", "{}", "null"])
def test_a_cached_index_of_another_shape_is_made_again(home: Path, text: str) -> None:
    """An index that was JSON but no object of entries (a list) raised AttributeError on every command; an empty
    one made every command unknown."""
    operation_index()
    cli_index.index_path().write_text(text, encoding="utf-8")
    assert set(operation_index()) == set(operations())
    assert set(json.loads(cli_index.index_path().read_text(encoding="utf-8"))) == set(operations())


def test_an_index_entry_naming_a_module_that_is_gone_still_loads_its_operation(home: Path) -> None:
    made = operation_index()["builds.list"]
    stale = cli_index.OperationSpec(made.name, "llamaforge.no_such_module", made.summary, (), made.flags)
    assert stale.load() is operations()["builds.list"]


def test_installations_sharing_a_home_keep_their_indexes(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two checkouts run in turn on one home each read their own index (none deletes the other's); past
    ``_KEEP`` indexes the oldest go, never the one just written."""
    made: list[Path] = []
    for number in range(cli_index._KEEP + 3):
        monkeypatch.setattr(cli_index, "fingerprint", lambda number=number: f"installation-{number}")
        operation_index()
        made.append(cli_index.index_path())
        os.utime(made[-1], ns=(number * 10**9, number * 10**9))  # written in this order
    kept = sorted((home / "cache").glob("cli-index-*.json"))
    assert kept == sorted(made[-cli_index._KEEP :])

    first, second = made[-2], made[-1]
    writes: list[Path] = []
    monkeypatch.setattr(cli_index, "_write", lambda path, text: writes.append(path))
    for path in (first, second, first, second):
        monkeypatch.setattr(cli_index, "index_path", lambda path=path: path)
        assert operation_index()["build"] == spec_of(operations()["build"])
    assert writes == []  # every run read its own index


def test_a_read_only_home_still_gives_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    monkeypatch.setenv("LLAMAFORGE_HOME", str(blocked / "home"))  # under a file: nothing can be written
    assert set(operation_index()) == set(operations())


def test_the_namespace_has_every_operations_flags(home: Path) -> None:
    root = namespace()
    for name, op in operations().items():
        task = root[name]
        arguments = {argument.name for argument in task.get_arguments()}
        assert set(op.params.model_fields) | {"json", "verbose"} == arguments, name
        assert task.__doc__ == op.summary
