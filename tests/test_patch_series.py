"""The shipped patch series against the pinned b11312 source, through `invoke patches.check` (as in CI)."""

from __future__ import annotations

import pytest

from helpers import invoke_json
from llamaforge.build.patches import read_series

pytestmark = pytest.mark.llamacpp


def test_shipped_series_applies_cleanly(build_env: dict[str, str]) -> None:
    result = invoke_json("patches.check", env=build_env)
    assert result["ok"] is True
    assert [patch["name"] for patch in result["patches"]] == [ref.name for ref in read_series("llama.cpp")]
    for patch in result["patches"]:
        assert patch["hunks"] >= 1 and patch["files"]


def test_the_windows_only_patch_applies_on_top_of_the_others_and_says_so(build_env: dict[str, str]) -> None:
    platforms = {
        patch["name"]: patch["platforms"] for patch in invoke_json("patches.check", env=build_env)["patches"]
    }
    assert platforms["0002-ggml-cpu-mingw-thread-power-throttling.patch"] == ["windows"]
    assert platforms["0001-qwen3-tensor-name-remap.patch"] == []
