"""Stock vs patched llama.cpp b11312 on tiny qwen3 / qwen3moe models whose tensors carry canonical, HF or Meta names.

The three files of an arch hold identical weights (tinymodels draws them from the canonical name). Stock
llama-server loads only the canonical one; the patched build (the default series, with
0001-qwen3-tensor-name-remap.patch) loads all three, says how many tensors it renamed, and produces the same
greedy tokens and top-5 probabilities as stock does on the canonical file. A name the table does not know
still fails with llama.cpp's own error.

One llama-server per model and build (13 starts of a tiny model, about a second each), run once per module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from llamaforge.gguf.tiny import TinyModelSpec, tensor_plan, write_tiny_model
from llamaforge.models.remap_table import alias_style, remap_name

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]

ARCHS = ("qwen3", "qwen3moe")
STYLES = ("canonical", "hf", "meta")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
REQUEST = {
    "prompt": PROMPT,
    "n_predict": 8,
    "temperature": 0,
    "n_probs": 5,
    "seed": 0,
    "return_tokens": True,
    "cache_prompt": False,
}
# llama.cpp's tensor overrides go by tensor name: a canonical pattern must still match in a renamed file.
OVERRIDE = r"blk\.1\.ffn_.*=CPU"
OVERRIDE_USED = "tensor overrides to CPU are used"
# a tensor of the hf file renamed (same length, so the file stays valid) to a name no table knows
UNKNOWN_FROM = b"model.layers.1.self_attn.q_proj.weight"
UNKNOWN_TO = b"model.layers.1.self_attn.q_xxxx.weight"
START_TIMEOUT = 120.0
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
REMAPPED = re.compile(
    r"remapped (\d+) tensors to llama\.cpp names \((\d+) Hugging Face-style, (\d+) Meta-style\)"
)


@dataclass(frozen=True)
class ServerRun:
    """One llama-server start: whether the model loaded, its log, and the /completion answer."""

    loaded: bool
    log: str
    completion: dict[str, Any] | None


def run_server(binary: Path, model: Path, log_path: Path) -> ServerRun:
    """Start llama-server on 127.0.0.1 (the OS picks a free port), ask for one completion, always stop it."""
    command = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "-t",
        "1",
        "-c",
        "512",
        "-np",
        "1",
        "-lv",
        "4",
        "--override-tensor",
        OVERRIDE,
    ]
    completion: dict[str, Any] | None = None
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            port = None
            deadline = time.monotonic() + START_TIMEOUT
            while port is None and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                found = LISTENING.search(log_path.read_text(encoding="utf-8", errors="replace"))
                port = int(found.group(1)) if found else None
            if port is not None:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/completion",
                    data=json.dumps(REQUEST).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=120) as response:
                    completion = json.loads(response.read())
            elif process.poll() is None:
                pytest.fail(f"llama-server did not start in {START_TIMEOUT:.0f}s; log: {log_path}")
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return ServerRun(
        loaded=completion is not None,
        log=log_path.read_text(encoding="utf-8", errors="replace"),
        completion=completion,
    )


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> dict[str, Path]:
    """``{arch}-{style}`` → tiny model file, plus ``qwen3-unknown``: the hf file with one unmappable name."""
    directory = tmp_path_factory.mktemp("remap-models")
    vocab = source_tree / "models" / "ggml-vocab-qwen2.gguf"
    models: dict[str, Path] = {}
    for arch in ARCHS:
        for style in STYLES:
            spec = TinyModelSpec(arch=arch, name_style=style)  # type: ignore[arg-type]
            models[f"{arch}-{style}"] = write_tiny_model(directory / f"{arch}-{style}.gguf", spec, vocab).path
    data = models["qwen3-hf"].read_bytes()
    assert data.count(UNKNOWN_FROM) == 1
    models["qwen3-unknown"] = directory / "qwen3-unknown.gguf"
    models["qwen3-unknown"].write_bytes(data.replace(UNKNOWN_FROM, UNKNOWN_TO))
    return models


@pytest.fixture(scope="module")
def runs(
    stock_build: Path,
    patched_build: Path,
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], ServerRun]:
    """(build, model) → run, for build in stock/patched: every model on both builds except the unknown-name one,
    which only the patched build needs."""
    logs = tmp_path_factory.mktemp("remap-logs")
    result: dict[tuple[str, str], ServerRun] = {}
    for build_name, build in (("stock", stock_build), ("patched", patched_build)):
        for model_name, model in tiny_models.items():
            if build_name == "stock" and model_name == "qwen3-unknown":
                continue
            result[build_name, model_name] = run_server(
                build / "bin" / "llama-server", model, logs / f"{build_name}-{model_name}.log"
            )
    return result


def _expected_counts(arch: str, style: str) -> tuple[int, int, int]:
    """(renamed, hf, meta) as the patch should report them, from the generated table and the file's names."""
    spec = TinyModelSpec(arch=arch, name_style=style)  # type: ignore[arg-type]
    names = [entry.name for entry in tensor_plan(spec, n_vocab=151936)]
    renamed = [n for n in names if remap_name(n, arch) not in (None, n)]
    return (
        len(renamed),
        sum(alias_style(n) == "hf" for n in renamed),
        sum(alias_style(n) == "meta" for n in renamed),
    )


def _tokens_and_probs(completion: dict[str, Any] | None) -> tuple[list[int], list[Any]]:
    assert completion is not None
    probs = completion["completion_probabilities"]
    assert len(probs) == REQUEST["n_predict"] and all(
        len(p["top_logprobs"]) == REQUEST["n_probs"] for p in probs
    )
    return completion["tokens"], probs


@pytest.mark.parametrize("arch", ARCHS)
def test_stock_loads_only_canonical_names(runs: dict[tuple[str, str], ServerRun], arch: str) -> None:
    assert runs["stock", f"{arch}-canonical"].loaded, runs["stock", f"{arch}-canonical"].log[-3000:]
    for style in ("hf", "meta"):
        run = runs["stock", f"{arch}-{style}"]
        assert not run.loaded
        assert "check_tensor_dims: tensor 'token_embd.weight' not found" in run.log, run.log[-3000:]
        assert "remapped" not in run.log


@pytest.mark.parametrize("arch", ARCHS)
def test_patched_loads_all_styles_with_identical_output(
    runs: dict[tuple[str, str], ServerRun], arch: str
) -> None:
    reference = _tokens_and_probs(runs["stock", f"{arch}-canonical"].completion)
    assert len(reference[0]) == REQUEST["n_predict"]
    for style in STYLES:
        run = runs["patched", f"{arch}-{style}"]
        assert run.loaded, run.log[-3000:]
        assert _tokens_and_probs(run.completion) == reference, f"{arch}-{style} differs from stock canonical"
        assert OVERRIDE_USED in run.log, f"--override-tensor {OVERRIDE} matched nothing in {arch}-{style}"


@pytest.mark.parametrize("arch", ARCHS)
def test_patched_log_counts_remapped_tensors(runs: dict[tuple[str, str], ServerRun], arch: str) -> None:
    assert not REMAPPED.search(runs["patched", f"{arch}-canonical"].log)  # canonical files are left alone
    for style in ("hf", "meta"):
        found = {
            tuple(int(g) for g in m.groups())
            for m in REMAPPED.finditer(runs["patched", f"{arch}-{style}"].log)
        }
        assert found == {_expected_counts(arch, style)}, (arch, style, found)


def test_expected_counts_are_the_whole_file() -> None:
    """Every tensor of a tiny hf file is renamed; in a meta file all but ``output`` (Meta's name is llama.cpp's)."""
    assert _expected_counts("qwen3", "hf") == (25, 25, 0)
    assert _expected_counts("qwen3", "meta") == (24, 0, 24)
    assert _expected_counts("qwen3moe", "hf") == (27, 27, 0)
    assert _expected_counts("qwen3moe", "meta") == (26, 0, 26)


def test_patched_unknown_name_fails_with_llama_cpp_error(runs: dict[tuple[str, str], ServerRun]) -> None:
    run = runs["patched", "qwen3-unknown"]
    assert not run.loaded
    assert "check_tensor_dims: tensor 'blk.1.attn_q.weight' not found" in run.log, run.log[-3000:]
    assert {tuple(int(g) for g in m.groups()) for m in REMAPPED.finditer(run.log)} == {(24, 24, 0)}


def test_patch_applies_to_pinned_source(source_tree: Path) -> None:
    """`git apply --check` of the series on the read-only source tree (checks only, writes nothing)."""
    require(  # with prebuilt builds the tree may be only the vocabularies the other tests read
        (source_tree / "src" / "llama-model-loader.cpp").is_file(),
        f"{source_tree} is not a whole llama.cpp tree (LLAMAFORGE_TEST_SOURCE)",
    )
    patch = (
        Path(__file__).resolve().parents[1] / "patches" / "llama.cpp" / "0001-qwen3-tensor-name-remap.patch"
    )
    result = subprocess.run(
        ["git", "apply", "--check", "-p1", str(patch)],
        cwd=source_tree,
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(source_tree.parent)},
    )
    assert result.returncode == 0, result.stderr
