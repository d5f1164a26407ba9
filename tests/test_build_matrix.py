"""Build matrices: the file is checked like a recipe, every build runs even after one failed, and a real matrix of
three builds (two of the suite's CPU builds and one impossible one) gives one table and keeps the good builds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke
from llamaforge.build.matrix import (
    Matrix,
    MatrixEntry,
    MatrixStopped,
    entry_arguments,
    load_matrix,
    run_matrix,
)
from llamaforge.core.errors import Cancelled, InvalidOption, RecipeError

pytestmark = pytest.mark.quick

THREE = """
description = "two CPU builds and one that cannot be built in Docker"

[[builds]]
name = "cpu"
backend = "cpu"

[[builds]]
name = "windows-in-docker"
platform = "windows"
arch = 86

[[builds]]
name = "cpu-stock"
no_patches = true
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "three.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_matrix_loads() -> None:
    matrix = load_matrix("rtx")
    assert [entry.name for entry in matrix.builds] == ["cpu", "rtx30", "rtx40"]
    assert entry_arguments(matrix, matrix.builds[2])["arch"] == "89"


def test_unknown_keys_name_the_file_and_the_key_meant(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[builds]]\nname = "a"\nbackned = "cpu"\n')
    with pytest.raises(RecipeError) as info:
        load_matrix(str(path))
    assert str(path) in info.value.message and "builds.0.backned: unknown key" in info.value.message
    assert "did you mean 'backend'" in (info.value.hint or "")


def test_names_must_be_unique_and_a_matrix_needs_builds(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="build names given twice: a"):
        load_matrix(str(_write(tmp_path, '[[builds]]\nname = "a"\n[[builds]]\nname = "a"\n')))
    for name in ("", "../../x", "a b"):
        with pytest.raises(RecipeError, match=r"builds\.0\.name"):
            load_matrix(str(_write(tmp_path, f'[[builds]]\nname = "{name}"\n')))
    with pytest.raises(RecipeError) as jobs:
        load_matrix(str(_write(tmp_path, '[[builds]]\nname = "a"\njobs = 2\n')))
    assert "--jobs, --force and --dry-run apply to the whole matrix" in (jobs.value.hint or "")
    native = load_matrix(str(_write(tmp_path, '[[builds]]\nname = "a"\ncpu = "native"\n')))
    assert entry_arguments(native, native.builds[0])["cpu"] == "native"  # a CPU level per build
    with pytest.raises(RecipeError, match="builds"):
        load_matrix(str(_write(tmp_path, 'description = "empty"\n')))


def test_entries_become_build_options() -> None:
    matrix = Matrix(
        name="m",
        recipe="github",
        builds=[
            MatrixEntry(
                name="w",
                platform="windows",
                arch=["86", "89"],
                cmake={"GGML_RPC": True, "LLAMA_X": 3},
                executor="ssh",
                build_host="b@h:22",
            ),
        ],
    )
    arguments = entry_arguments(matrix, matrix.builds[0])
    assert arguments["recipe"] == "github" and arguments["arch"] == "86,89"
    assert arguments["cmake"] == ["GGML_RPC=ON", "LLAMA_X=3"]
    assert arguments["executor"] == "ssh" and arguments["build_host"] == "b@h:22"


def test_a_failed_build_is_a_row_and_the_next_still_runs() -> None:
    matrix = Matrix(name="m", builds=[MatrixEntry(name=n) for n in ("a", "b", "c")])
    ran: list[str] = []

    def build_one(entry: MatrixEntry) -> dict[str, Any]:
        ran.append(entry.name)
        if entry.name == "b":
            raise InvalidOption("b cannot be built", hint="fix b")
        return {"result": "built", "key": entry.name * 4}

    rows = run_matrix(matrix, build_one, progress=lambda message: None)
    assert ran == ["a", "b", "c"]
    assert [(row.name, row.result) for row in rows] == [("a", "built"), ("b", "failed"), ("c", "built")]
    assert rows[1].error == "b cannot be built" and rows[1].hint == "fix b" and rows[1].exit_code == 2


def test_cancelling_stops_the_matrix_and_says_what_did_not_run() -> None:
    matrix = Matrix(name="m", builds=[MatrixEntry(name=n) for n in ("a", "b", "c")])

    def build_one(entry: MatrixEntry) -> dict[str, Any]:
        if entry.name == "b":
            raise Cancelled("interrupted")
        return {"result": "built"}

    with pytest.raises(MatrixStopped) as info:
        run_matrix(matrix, build_one, progress=lambda message: None)
    assert [(row.name, row.result) for row in info.value.rows] == [
        ("a", "built"),
        ("b", "not run"),
        ("c", "not run"),
    ]


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_matrix_of_three_builds_runs_and_one_failure_loses_none(
    patched_build: Path, stock_build: Path, build_env: dict[str, str], tmp_path: Path
) -> None:
    result = invoke("build", "--matrix", str(_write(tmp_path, THREE)), "--json", env=build_env)
    assert result.returncode == 2, result.stderr  # the failed row's exit code (InvalidOption)
    assert "1 of 3 builds of matrix three failed: windows-in-docker" in result.stderr
    assert "Traceback" not in result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["matrix"]}
    assert rows["cpu"]["result"] == "cache hit" and rows["cpu"]["key"] == patched_build.name
    assert rows["cpu-stock"]["result"] == "cache hit" and rows["cpu-stock"]["key"] == stock_build.name
    failed = rows["windows-in-docker"]
    assert failed["result"] == "failed" and "CUDA builds for Windows need MSVC" in failed["error"]
    assert "--executor ssh --build-host" in failed["hint"]
    for row in (rows["cpu"], rows["cpu-stock"]):
        assert (Path(build_env["LLAMAFORGE_HOME"]) / "builds" / row["key"] / "manifest.json").is_file()
    table = invoke("build", "--matrix", str(_write(tmp_path, THREE)), env=build_env)
    assert "windows-in-docker" in table.stdout and "cache hit" in table.stdout and "failed" in table.stdout
