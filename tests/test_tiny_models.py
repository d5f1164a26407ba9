"""The tiny models' names (``tiny``, ``tiny-q4_k_m``) are a ``--model`` like any other: smoke and deploy took them
before, and models.fit, models.verify and models.inspect take them too, writing the file on first use from the
pinned llama.cpp source (the sdist as mirror; nothing is downloaded)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from helpers import invoke, invoke_json
from llamaforge.models.tiny import TINY_SMOKE_MODELS, tiny_smoke_label

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def env(sdist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("tiny-home")
    return {**os.environ, "LLAMAFORGE_HOME": str(home), "LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)}


@pytest.mark.parametrize("name", sorted(TINY_SMOKE_MODELS))
def test_the_model_commands_take_a_tiny_models_name(name: str, env: dict[str, str]) -> None:
    written = Path(env["LLAMAFORGE_HOME"]) / "models" / "tiny"
    label = tiny_smoke_label(TINY_SMOKE_MODELS[name])

    plan = invoke_json("models.fit", name, "--vram", "8GiB", "--ctx", "512", env=env)
    (path,) = written.glob(f"{label}-*.gguf")  # written once, under the name the smoke gives it
    assert plan["model"] == str(path) and plan["flags"][:2] == ["-m", str(path)]
    assert invoke_json("models.verify", name, env=env)["ok"] is True
    assert invoke_json("models.inspect", name, env=env)["model"]["architecture"] == "qwen3"
    assert list(written.glob(f"{label}-*.gguf")) == [path]  # read again, not written again


def test_a_bare_number_of_bytes_is_no_gpu(env: dict[str, str]) -> None:
    """``--vram 24576`` (nvidia-smi's MiB) was read as 24576 bytes, and blamed --margin."""
    done = invoke("models.fit", "tiny", "--vram", "24576", "--ctx", "512", env=env, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: --vram '24576' is 24576 bytes: less memory than any GPU has",
        "  hint: write the unit, e.g. 24576MiB or 24GiB (a bare number below 4096 is GiB, from 4096 on bytes)",
    ]


def test_models_fetch_writes_a_tiny_model_and_refuses_what_needs_a_hub(
    sdist_dir: Path, tmp_path: Path
) -> None:
    """``models.fetch tiny`` said "unknown model recipe 'tiny'": it now gives the file, written here once."""
    env = {**os.environ, "LLAMAFORGE_HOME": str(tmp_path), "LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)}
    offline = invoke("models.fetch", "tiny", "--offline", env=env)
    assert offline.returncode == 11, offline.stderr  # nothing written yet, and writing needs the source
    assert "--offline: the tiny model 'tiny' is not written yet" in offline.stderr
    assert not (tmp_path / "models" / "tiny").exists()
    revision = invoke("models.fetch", "tiny", "--revision", "main", env=env)
    assert revision.returncode == 2 and "--revision applies to hub sources" in revision.stderr

    first = invoke_json("models.fetch", "tiny", env=env)
    path = Path(first["path"])
    assert path.parent == tmp_path / "models" / "tiny" and first["cached"] is False
    assert first["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert first["size"] == path.stat().st_size
    again = invoke_json("models.fetch", "tiny", "--offline", env=env)
    assert again == {**first, "cached": True}


def test_a_read_only_front_is_refused_the_first_write_of_a_tiny_model(lf_home: Path) -> None:
    """A read-only MCP server answered 'this call would run python' for `tiny`, after making downloads/ and a
    source lock: it now says what it would write, and writes nothing."""
    from llamaforge.core import guard
    from llamaforge.models.tiny import tiny_smoke_model

    before = guard.current()
    guard.install(guard.HostGuard(read_only=True))
    try:
        with pytest.raises(
            guard.PolicyRefused, match=r"would write the tiny model tiny-qwen3-q4_0-\w+\.gguf"
        ):
            tiny_smoke_model()
    finally:
        guard.install(before)
    assert not lf_home.exists() or list(lf_home.iterdir()) == []
