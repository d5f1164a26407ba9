"""The tiny models' names (``tiny``, ``tiny-q4_k_m``) are a ``--model`` like any other: smoke and deploy took them
before, and models.fit, models.verify and models.inspect take them too, writing the file on first use from the
pinned llama.cpp source (the sdist as mirror; nothing is downloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamaforge.models.tiny import TINY_SMOKE_MODELS, tiny_smoke_label

REPO = Path(__file__).resolve().parents[1]


def invoke(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def env(sdist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("tiny-home")
    return {**os.environ, "LLAMAFORGE_HOME": str(home), "LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)}


@pytest.mark.parametrize("name", sorted(TINY_SMOKE_MODELS))
def test_the_model_commands_take_a_tiny_models_name(name: str, env: dict[str, str]) -> None:
    written = Path(env["LLAMAFORGE_HOME"]) / "models" / "tiny"
    label = tiny_smoke_label(TINY_SMOKE_MODELS[name])

    fit = invoke(["models.fit", name, "--vram", "8GiB", "--ctx", "512", "--json"], env)
    assert fit.returncode == 0, fit.stderr
    plan = json.loads(fit.stdout)
    (path,) = written.glob(f"{label}-*.gguf")  # written once, under the name the smoke gives it
    assert plan["model"] == str(path) and plan["flags"][:2] == ["-m", str(path)]

    verify = invoke(["models.verify", name, "--json"], env)
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["ok"] is True

    inspect = invoke(["models.inspect", name, "--json"], env)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["model"]["architecture"] == "qwen3"
    assert list(written.glob(f"{label}-*.gguf")) == [path]  # read again, not written again


def test_a_bare_number_of_bytes_is_no_gpu(env: dict[str, str]) -> None:
    """``--vram 24576`` (nvidia-smi's MiB) was read as 24576 bytes, and blamed --margin."""
    done = invoke(["models.fit", "tiny", "--vram", "24576", "--ctx", "512"], env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: --vram '24576' is 24576 bytes: less memory than any GPU has",
        "  hint: write the unit, e.g. 24576MiB or 24GiB (a bare number below 4096 is GiB, from 4096 on bytes)",
    ]
