"""More smoke inputs refused, naming the option, the file or the run: a --build path that is no build directory,
thresholds files and values, and reports smoke.compare cannot compare. Each goes through ``invoke`` where the
user meets it; none runs a smoke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import invoke


def _error(*args: str) -> tuple[int, dict[str, str], str]:
    """Exit code, the JSON error and stderr of ``invoke ARGS --json``."""
    result = invoke(*args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)["error"], result.stderr


@pytest.mark.usefixtures("lf_home")
def test_a_build_path_that_is_no_build_directory_is_named_before_the_model_is_written(
    tmp_path: Path, lf_home: Path
) -> None:
    # All three said "no build with key '…'" (or named no option), after the tiny model had been written and
    # llama.cpp's sources downloaded for its converter.
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hi\n", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    hint = "give a build's directory or its key (`invoke builds.list` shows them)"
    for op in ("smoke", "smoke.cpu-modules"):
        for build, message in (
            (str(tmp_path / "nope"), f"--build {tmp_path / 'nope'}: no such build directory"),
            ("./nope", "--build ./nope: no such build directory"),
            (str(a_file), f"--build {a_file} is a file, not a build directory"),
            (
                str(empty),
                f"--build {empty}: the directory holds neither a llamaforge build (manifest.json) nor llama.cpp "
                "binaries (llama-server, bin/llama-server)",
            ),
        ):
            code, error, _ = _error(op, "--build", build)
            assert code == 2, (op, build, error)
            assert error["message"] == message
            assert error["hint"] == hint
    assert not (lf_home / "models").exists() and not (lf_home / "smoke").exists()
