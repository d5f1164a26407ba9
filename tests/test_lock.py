"""models.lock against a fake Hugging Face / ModelScope hub on loopback (through the real clients), --frozen
refusal, clean failure when nothing is reachable, and fetch using what the lock pinned."""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakehub import COMMIT, FakeHub, random_gguf, serve
from helpers import invoke
from llamaforge.core.errors import InvalidOption, LockError, RecipeError
from llamaforge.models.fetch import fetch_model
from llamaforge.models.lock import (
    LockFile,
    ModelLock,
    apply_lock,
    lock_models,
    lock_path,
    locked_image_digest,
    read_lock,
    write_lock,
)
from llamaforge.models.recipes import load_model_recipe

pytestmark = pytest.mark.quick

CONTENT = random_gguf(10 << 10, seed=3)
DIGEST = hashlib.sha256(CONTENT).hexdigest()
TOKEN = "hf_SECRETlocktoken0123456789SECRET"


def write_recipes(root: Path, models: dict[str, str], builds: dict[str, str] | None = None) -> None:
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "builds").mkdir(parents=True, exist_ok=True)
    for name, text in models.items():
        (root / "models" / f"{name}.toml").write_text(text, encoding="utf-8")
    for name, text in (builds or {}).items():
        (root / "builds" / f"{name}.toml").write_text(text, encoding="utf-8")


BUILD = """
description = "images only matter here"
[source]
kind = "archive"
url = "/nonexistent.tar.gz"
sha256 = "{sha}"
commit = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
build_number = 11312
date = 2026-10-01
[images.cpu]
tag = "llamaforge/debian:bookworm"
[images.cuda]
tag = "nvidia/cuda:12.8.1-devel-ubuntu24.04"
""".format(sha="a" * 64)


@pytest.fixture
def recipes(tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "recipes"
    write_recipes(
        root,
        {
            "tiny-hf": 'source = "hf://org/Tiny-GGUF/tiny-Q4_K_M.gguf"\n',
            "tiny-ms": 'source = "ms://org/Tiny-GGUF/tiny-Q4_K_M.gguf"\n',
        },
    )
    monkeypatch.setenv("LLAMAFORGE_RECIPES_DIR", str(root))
    monkeypatch.delenv("LLAMAFORGE_LOCK_FILE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    return root


@pytest.fixture
def hub(recipes: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(FakeHub()) as fake:
        fake.add("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", CONTENT)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", fake.url)
        yield fake
    from huggingface_hub import close_session

    close_session()


def test_lock_resolves_commit_sha256_and_size_and_fetch_uses_them(
    hub: FakeHub, recipes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    report = lock_models(["tiny-hf", "tiny-ms"])
    assert report.unresolved == [] and {item["name"] for item in report.locked} == {"tiny-hf", "tiny-ms"}
    assert report.path == recipes / "lock.toml"
    text = report.path.read_text(encoding="utf-8")
    assert TOKEN not in text
    data = tomllib.loads(text)
    assert data["models"]["tiny-hf"] == {
        "source": "hf://org/Tiny-GGUF/tiny-Q4_K_M.gguf",
        "requested_revision": "main",
        "revision": COMMIT,
        "sha256": DIGEST,
        "size": len(CONTENT),
        "resolved_at": data["models"]["tiny-hf"]["resolved_at"],
    }
    assert data["models"]["tiny-ms"]["revision"] == "master" and data["models"]["tiny-ms"]["sha256"] == DIGEST
    assert not hub.requests(method="GET") or all("FilePath" not in r.path for r in hub.requests(method="GET"))

    locked = apply_lock(load_model_recipe("tiny-hf"))
    assert (locked.revision, locked.sha256, locked.size, locked.pinned) == (
        COMMIT,
        DIGEST,
        len(CONTENT),
        True,
    )
    result = fetch_model("tiny-hf", backoff_s=0)
    assert (result.sha256, result.commit) == (DIGEST, COMMIT)
    heads = [r.path for r in hub.requests(server="hub", method="HEAD")]
    assert (
        heads[-1] == f"/org/Tiny-GGUF/resolve/{COMMIT}/tiny-Q4_K_M.gguf"
    )  # fetch asked for the locked commit
    lock_models(frozen=True, images=False)  # everything pinned now: no error, no network


def test_frozen_refuses_unpinned_inputs_naming_them(recipes: Path) -> None:
    write_recipes(recipes, {}, {"cuda": BUILD})
    with pytest.raises(LockError) as caught:
        lock_models(frozen=True)
    message = caught.value.message
    assert "model tiny-hf (hf://org/Tiny-GGUF/tiny-Q4_K_M.gguf)" in message and "model tiny-ms" in message
    assert "image nvidia/cuda:12.8.1-devel-ubuntu24.04" in message
    assert "llamaforge/debian" not in message  # a locally bootstrapped image has no registry digest
    assert not lock_path().exists()


def test_frozen_accepts_a_recipe_pinned_by_itself(recipes: Path) -> None:
    write_recipes(
        recipes, {"pinned": f'source = "hf://a/b/c.gguf"\nrevision = "{COMMIT}"\nsha256 = "{DIGEST}"\n'}
    )
    assert lock_models(["pinned"], frozen=True).pinned == ["pinned"]
    write_recipes(
        recipes, {"branch": f'source = "hf://a/b/c.gguf"\nrevision = "main"\nsha256 = "{DIGEST}"\n'}
    )
    with pytest.raises(LockError, match="model branch"):
        lock_models(["branch"], frozen=True)  # a branch is no pin on Hugging Face


def test_offline_lock_fails_cleanly_naming_what_it_could_not_resolve(recipes: Path) -> None:
    # Through the CLI, in its own process: a failed Docker connection must not leak into this one.
    write_recipes(recipes, {"web": 'source = "https://example.invalid/m.gguf"\n'}, {"cuda": BUILD})
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "MODELSCOPE_ENDPOINT": "http://127.0.0.1:9"}
    done = invoke("models.lock", "--json", env=env, timeout=300)
    assert done.returncode == LockError.exit_code, done.stderr
    data = json.loads(done.stdout)
    assert data["exit_code"] == LockError.exit_code and data["locked"] == []
    unresolved = {item["name"]: item for item in data["unresolved"]}
    assert set(unresolved) == {"tiny-hf", "tiny-ms", "web", "nvidia/cuda:12.8.1-devel-ubuntu24.04"}
    assert "did not answer" in unresolved["tiny-hf"]["reason"]
    assert "did not answer" in unresolved["tiny-ms"]["reason"]
    assert "publishes no sha256" in unresolved["web"]["reason"]
    assert "Docker engine not reachable" in unresolved["nvidia/cuda:12.8.1-devel-ubuntu24.04"]["reason"]
    assert data["skipped"][0]["name"] == "llamaforge/debian:bookworm"
    assert "could not lock model tiny-hf" in done.stderr
    assert not lock_path().exists()  # nothing resolved, nothing written


def test_url_recipe_locks_from_a_verified_fetch(recipes: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(CONTENT)
    write_recipes(recipes, {"local": f'source = "{model.as_uri()}"\n'})
    assert lock_models(["local"]).unresolved
    fetch_model("local")
    report = lock_models(["local"])
    assert report.locked[0]["sha256"] == DIGEST and report.unresolved == []
    assert apply_lock(load_model_recipe("local")).sha256 == DIGEST


def test_lock_entry_stops_applying_when_the_recipe_moves(recipes: Path) -> None:
    lock = LockFile(
        models={
            "tiny-hf": ModelLock(
                source="hf://org/Tiny-GGUF/tiny-Q4_K_M.gguf",
                requested_revision="main",
                revision=COMMIT,
                sha256=DIGEST,
                size=10,
            )
        }
    )
    write_lock(lock)
    assert read_lock() == lock
    assert apply_lock(load_model_recipe("tiny-hf")).sha256 == DIGEST
    write_recipes(recipes, {"tiny-hf": 'source = "hf://org/Tiny-GGUF/tiny-Q8_0.gguf"\n'})
    assert apply_lock(load_model_recipe("tiny-hf")).sha256 is None
    write_recipes(recipes, {"tiny-hf": 'source = "hf://org/Tiny-GGUF/tiny-Q4_K_M.gguf"\nrevision = "v2"\n'})
    assert apply_lock(load_model_recipe("tiny-hf")).sha256 is None


def test_image_digests_roundtrip(recipes: Path) -> None:
    digest = "sha256:" + "b" * 64
    write_lock(
        LockFile.model_validate({"images": {"nvidia/cuda:12.8.1-devel-ubuntu24.04": {"digest": digest}}})
    )
    assert locked_image_digest("nvidia/cuda:12.8.1-devel-ubuntu24.04") == digest
    assert locked_image_digest("other:tag") is None


def test_a_lock_path_that_is_no_regular_file_is_left_alone(tmp_path: Path) -> None:
    """Renamed over, a device (LLAMAFORGE_LOCK_FILE=/dev/null, as root) became a file; a directory ended in a
    traceback with the scratch file left beside it."""
    lock = LockFile.model_validate({"images": {"x:1": {"digest": "sha256:" + "b" * 64}}})
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "dir.toml").mkdir()
    for path in (fifo, tmp_path / "dir.toml"):
        with pytest.raises(
            InvalidOption, match=r"cannot write the lock file .*: exists and is not a regular file"
        ):
            write_lock(lock, path)
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["dir.toml", "fifo.toml"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("version = 1\n[models\n", "Expected ']'"),
        ('version = "one"\nmodels = 3\n', "version: Input should be a valid integer"),
        (
            '[models.m]\nsource = "https://x.invalid/m.gguf"\nsha256 = "abc"\nsize = 5\n',
            "models.m.sha256: String",
        ),
    ],
)
def test_a_damaged_lock_file_names_the_field_and_a_way_out(tmp_path: Path, text: str, problem: str) -> None:
    """The hint sent the user to `models.lock`, which reads the same file first and fails the same way; a wrong
    field came as pydantic's raw text with its documentation links."""
    path = tmp_path / "lock.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError, match=f"lock file {path} is invalid: {problem}") as refused:
        read_lock(path)
    assert "errors.pydantic.dev" not in refused.value.message
    assert f"fix {path}, or restore or remove it" in (refused.value.hint or "")


def test_shipped_model_recipes_are_valid_and_unpinned() -> None:
    from llamaforge.models.recipes import list_model_recipes

    names = list_model_recipes()
    assert {
        "qwen3.5-9b-q4_k_m",
        "qwen3.6-27b-q4_k_m",
        "qwen3.6-35b-a3b-ud-q4_k_m",
        "qwen3.5-0.8b-q4_k_m",
    } <= set(names)
    for name in names:
        recipe = load_model_recipe(name)
        assert recipe.sha256 is None and recipe.revision is None  # never invented: `models.lock` fills them
        assert recipe.source.startswith(("hf://", "ms://"))


def test_cli_lock_frozen_exit_code(recipes: Path) -> None:
    env = {**os.environ}
    done = invoke("models.lock", "--frozen", "--json", env=env, timeout=120)
    assert done.returncode == LockError.exit_code, done.stderr
    assert "tiny-hf" in done.stderr
    offline = invoke(
        "models.lock", "--recipe", "tiny-hf", "--json", env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert offline.returncode == LockError.exit_code
    assert json.loads(offline.stdout)["unresolved"][0]["name"] == "tiny-hf"
