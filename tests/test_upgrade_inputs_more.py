"""More upgrade inputs refused (or taken) when read, naming the option. Each goes through ``invoke`` where the
user meets it; none resolves a release (``--to bogus`` is refused after the options are read)."""

from __future__ import annotations

import json

import pytest

from helpers import invoke

pytestmark = pytest.mark.quick


def _upgrade(*args: str) -> dict[str, str]:
    result = invoke("upgrade", "--dry-run", "--to", "bogus", *args, "--json")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error: dict[str, str] = json.loads(result.stdout)["error"]
    return error


def test_a_build_number_written_as_its_release_tag_is_taken() -> None:
    # The help writes it bNNNN, and `--build-number b1234` was refused as "not a valid integer".
    for value in ("b1234", "1234", "B1234"):
        error = _upgrade("--build-number", value)
        assert error["message"] == "source 'bogus': not a pip pin, a git URL or an existing archive"


def test_a_build_number_that_is_not_one_is_refused_naming_the_option() -> None:
    for value, says in (
        ("bx", "Input should be a valid integer"),
        ("b0", "Input should be greater than or equal to 1"),
        ("99999999999", "Input should be less than or equal to 2147483647"),
    ):
        error = _upgrade("--build-number", value)
        assert error["message"].startswith(f"--build-number: {says}"), error
