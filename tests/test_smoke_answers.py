"""Checked answers in smoke: a model recipe's ``[[answers]]`` and the golden of greedy tokens and logprobs.

Unit tests cover the recipe schema (through the one validation formatter), the matching of replies and the
comparison with a golden. The integration tests run the real patched b11312 build's llama-server with the tiny
random-weight qwen3: a recorded golden passes, another seed's model and a tampered golden fail naming the
first differing token, and an answer the model cannot give fails the verdict through the CLI and MCP.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, invoke
from llamaforge.core.errors import InvalidOption, OperationFailed, RecipeError, SmokeFailed
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.models.recipes import AnswerCheck, list_model_recipes, load_model_recipe
from llamaforge.smoke.answers import (
    LOGPROB_TOLERANCE,
    answer_verdict_checks,
    describe_difference,
    first_difference,
    load_golden,
)
from llamaforge.smoke.run import SmokeOptions
from llamaforge.smoke.verdict import evaluate, resolve_thresholds

pytestmark = pytest.mark.quick

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))


# --- the recipe schema -----------------------------------------------------------------------------------


def _recipe(tmp_path: Path, answers: str) -> Path:
    path = tmp_path / "answers.toml"
    path.write_text(f'source = "file:///models/m.gguf"\n{answers}', encoding="utf-8")
    return path


def test_recipe_answers_load(tmp_path: Path) -> None:
    recipe = load_model_recipe(
        str(
            _recipe(
                tmp_path,
                """
[[answers]]
prompt = "What is the capital of France? Answer in one word."
choices = ["Paris"]

[[answers]]
prompt = "What is 2 + 3? Answer with a number."
regex = "\\\\b5\\\\b"
max_tokens = 8
""",
            )
        )
    )
    first, second = recipe.answers
    assert first == AnswerCheck(
        prompt="What is the capital of France? Answer in one word.", choices=["Paris"]
    )
    assert first.max_tokens == 32 and first.expectation == "one of 'Paris'"
    assert second.regex == r"\b5\b" and second.max_tokens == 8 and second.expectation == r"regex /\b5\b/"
    assert all(not load_model_recipe(name).answers for name in list_model_recipes())  # none declared yet


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ('prompt = "Q"', r"answers\.0.*give exactly one of regex or choices"),
        ('prompt = "Q"\nregex = "a"\nchoices = ["a"]', r"answers\.0.*give exactly one of regex or choices"),
        ('prompt = "Q"\nregex = "(unclosed"', r"answers\.0\.regex.*does not compile"),
        ('prompt = "Q"\nchoices = []', r"answers\.0\.choices"),
        ('prompt = "Q"\nchoices = [" "]', r"answers\.0\.choices.*must not be blank"),
        ('prompt = ""\nregex = "a"', r"answers\.0\.prompt"),
        (
            'prompt = "Q"\nchoice = ["a"]',
            r"answers\.0\.choice: unknown key.*\n.*did you mean 'choices' instead of 'choice'",
        ),
    ],
)
def test_recipe_answers_are_validated(tmp_path: Path, answers: str, message: str) -> None:
    with pytest.raises(RecipeError) as error:
        load_model_recipe(str(_recipe(tmp_path, f"[[answers]]\n{answers}\n")))
    assert re.search(message, f"{error.value.message}\n{error.value.hint}")
    assert "answers.toml" in error.value.message  # the file is named


def test_answer_matching() -> None:
    paris = AnswerCheck(prompt="Q", choices=["Paris", "Île-de-France"])
    assert paris.matches("paris.") and paris.matches("It is PARIS!") and paris.matches("île-de-france")
    assert not paris.matches("Parisian food") and not paris.matches("Lyon")
    five = AnswerCheck(prompt="Q", regex=r"(?i)^\s*five\b|\b5\b")
    assert five.matches(" Five") and five.matches("2 + 3 = 5") and not five.matches("55")


# --- the comparison with a golden ------------------------------------------------------------------------


def _tok(token_id: int, logprob: float, top: list[tuple[int, float]] | None = None) -> dict[str, Any]:
    top = top if top is not None else [(token_id, logprob), (token_id + 1, logprob - 0.01)]
    return {
        "id": token_id,
        "token": f"t{token_id}",
        "logprob": logprob,
        "top": [{"id": i, "token": f"t{i}", "logprob": lp} for i, lp in top],
    }


GOLDEN = [_tok(10, -11.2), _tok(20, -11.3), _tok(30, -11.1)]


def test_identical_and_within_tolerance_pass() -> None:
    assert first_difference(GOLDEN, copy.deepcopy(GOLDEN)) is None
    drift = LOGPROB_TOLERANCE / 2
    nudged = [
        _tok(t["id"], t["logprob"] + drift, [(i["id"], i["logprob"] + drift) for i in t["top"]])
        for t in GOLDEN
    ]
    assert first_difference(GOLDEN, nudged) is None


def test_a_different_greedy_token_is_the_first_difference() -> None:
    got = [GOLDEN[0], _tok(21, -11.25), _tok(31, -11.0)]
    difference = first_difference(GOLDEN, got)
    assert difference is not None
    assert difference["position"] == 1 and difference["reason"] == "a different greedy token"
    assert difference["expected"] == {"id": 20, "token": "t20", "logprob": -11.3}
    assert difference["got"] == {"id": 21, "token": "t21", "logprob": -11.25}
    assert difference["logprob_delta"] == pytest.approx(0.05)
    assert describe_difference(difference) == (
        "token 1: expected 't20' (id 20, logprob -11.3000), got 't21' (id 21, logprob -11.2500), "
        "logprob delta +0.05 (a different greedy token)"
    )


def test_logprob_drift_beyond_tolerance_fails() -> None:
    off = 2 * LOGPROB_TOLERANCE
    got = [GOLDEN[0], GOLDEN[1], _tok(30, -11.1 + off, [(30, -11.1 + off), (31, -11.11 + off)])]
    difference = first_difference(GOLDEN, got)
    assert difference is not None and difference["position"] == 2
    assert difference["logprob_delta"] == pytest.approx(off) and "logprob is off" in difference["reason"]


def test_top_candidates_are_compared() -> None:
    # Same greedy token and logprob, but the runner-up moved or left the top-n list.
    moved = [_tok(10, -11.2, [(10, -11.2), (11, -11.3)]), *GOLDEN[1:]]
    difference = first_difference(GOLDEN, moved)
    assert difference is not None and difference["position"] == 0 and "'t11'" in difference["reason"]
    replaced = [_tok(10, -11.2, [(10, -11.2), (99, -11.205)]), *GOLDEN[1:]]
    difference = first_difference(GOLDEN, replaced)
    assert (
        difference is not None
        and difference["reason"] == "top candidate 't99' (id 99) is missing from the top 2 of the golden"
    )
    lost = [_tok(10, -11.2, [(10, -11.2), (99, -11.3)]), *GOLDEN[1:]]
    difference = first_difference(GOLDEN, lost)
    assert (
        difference is not None
        and difference["reason"] == "top candidate 't11' (id 11) is missing from the top 2 of got"
    )
    pushed_out = [
        _tok(10, -11.2, [(10, -11.2), (99, -11.2095)]),
        *GOLDEN[1:],
    ]  # within tolerance of each other
    assert first_difference(GOLDEN, pushed_out) is None


def test_different_lengths_fail_at_the_first_missing_token() -> None:
    difference = first_difference(GOLDEN, GOLDEN[:2])
    assert difference is not None and difference["position"] == 2 and difference["got"] is None
    assert "token 2: expected 't30'" in describe_difference(
        difference
    ) and "got (none)" in describe_difference(difference)


def test_verdict_names_a_wrong_answer_and_the_golden_difference() -> None:
    thresholds, sources = resolve_thresholds(
        [("cli", {"non_empty_answer": None, "min_tg_tps": None, "max_ttft_ms": None})]
    )
    difference = first_difference(GOLDEN, [GOLDEN[0], _tok(21, -11.25)])
    server = {
        "levels": [],
        "answers": [
            {
                "prompt": "Capital of France?",
                "expected": "one of 'Paris'",
                "reply": "Lyon",
                "passed": False,
                "error": None,
            },
            {"prompt": "2 + 3?", "expected": "regex /5/", "reply": "5", "passed": True, "error": None},
        ],
        "golden": {
            "mode": "compare",
            "path": "g.json",
            "n_tokens": 2,
            "request": {"n_probs": 2},
            "tolerance": LOGPROB_TOLERANCE,
            "first_difference": difference,
        },
    }
    verdict = evaluate({"bench": None, "server": server}, thresholds, sources)
    assert not verdict["passed"]
    checks = [(c["name"], c["status"]) for c in verdict["checks"]]
    assert checks == [
        ("no_failed_requests", "pass"),
        ("answer", "fail"),
        ("answer", "pass"),
        ("golden_tokens", "fail"),
    ]
    wrong = verdict["checks"][1]
    assert wrong["detail"] == "prompt 'Capital of France?': expected one of 'Paris', got 'Lyon'"
    assert wrong["source"] == "model recipe" and wrong["threshold"] == "one of 'Paris'"
    assert verdict["checks"][3]["value"] == 1 and verdict["checks"][3]["detail"].startswith(
        "token 1: expected"
    )
    assert answer_verdict_checks({}) == []


def test_golden_options_and_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="exclude each other"):
        SmokeOptions(golden=tmp_path / "a.json", record_golden=tmp_path / "b.json")
    with pytest.raises(InvalidOption, match="need the server stage"):
        SmokeOptions(golden=tmp_path / "a.json", skip_server=True)
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 99}', encoding="utf-8")
    with pytest.raises(InvalidOption, match="cannot be read: schema 99"):
        load_golden(bad)
    with pytest.raises(InvalidOption, match="cannot be read"):
        load_golden(tmp_path / "missing.json")


# --- a real llama-server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> dict[str, Path]:
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    root = tmp_path_factory.mktemp("answer-models")
    vocab = source_tree / "models" / "ggml-vocab-qwen2.gguf"
    return {
        "reference": write_tiny_model(root / "tiny-qwen3.gguf", TinyModelSpec(arch="qwen3"), vocab).path,
        "other_seed": write_tiny_model(
            root / "tiny-qwen3-seed1.gguf", TinyModelSpec(arch="qwen3", seed=1), vocab
        ).path,
    }


def _smoke(build: Path, model: Path, **params: Any) -> dict[str, Any]:
    op = operations()["smoke"]
    quick = {
        "build": str(build),
        "model": str(model),
        "skip_bench": True,
        "threads": 1,
        "requests": 1,
        "max_tokens": 4,
        "concurrency": [1],
        **params,
    }
    return result_json(op.run(op.params.model_validate(quick), OperationContext()))


@pytest.mark.docker
@pytest.mark.llamacpp
def test_golden_recorded_then_matched_then_differing(
    patched_build: Path, tiny_models: dict[str, Path], lf_home: Path, tmp_path: Path
) -> None:
    golden = tmp_path / "golden.json"
    recorded = _smoke(patched_build, tiny_models["reference"], record_golden=str(golden))
    assert recorded["server"]["golden"]["mode"] == "record"
    document = json.loads(golden.read_text(encoding="utf-8"))
    assert document["request"] == {
        "prompt": "The history of the printing press",
        "n_predict": 16,
        "n_probs": 5,
        "seed": 42,
    }
    assert len(document["tokens"]) == 16 and all(len(token["top"]) == 5 for token in document["tokens"])
    assert all(token["top"][0]["id"] == token["id"] for token in document["tokens"])  # greedy: the top token
    assert document["source"]["build"] == recorded["build"]["key"]

    matched = _smoke(patched_build, tiny_models["reference"], golden=str(golden), threads=2)
    [check] = [c for c in matched["verdict"]["checks"] if c["name"] == "golden_tokens"]
    assert check["status"] == "pass" and "16 greedy tokens and their top-5 logprobs match" in check["detail"]

    # Same shape, another seed: it computes something else from the first token on.
    with pytest.raises(OperationFailed, match=r"golden_tokens 0 .*token 0: expected '.+' \(id \d+") as failed:
        _smoke(patched_build, tiny_models["other_seed"], golden=str(golden))
    [check] = [
        c for c in failed.value.result.model_dump()["verdict"]["checks"] if c["name"] == "golden_tokens"
    ]
    assert check["status"] == "fail" and check["value"] == 0 and "logprob delta" in check["detail"]
    assert failed.value.exit_code == SmokeFailed.exit_code

    # A golden tampered at token 3: the build now "computes differently" there, by 0.01 nats.
    tampered = tmp_path / "tampered.json"
    document["tokens"][3]["logprob"] -= 0.01
    document["tokens"][3]["top"][0]["logprob"] -= 0.01
    tampered.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(OperationFailed) as failed:
        _smoke(patched_build, tiny_models["reference"], golden=str(tampered))
    [check] = [
        c for c in failed.value.result.model_dump()["verdict"]["checks"] if c["name"] == "golden_tokens"
    ]
    token = document["tokens"][3]
    assert check["value"] == 3
    assert check["detail"].startswith(f"token 3: expected {token['token']!r} (id {token['id']}")
    assert "logprob delta +0.01 (the token's logprob is off by more than 0.001)" in check["detail"]


@pytest.fixture
def unanswerable_recipe(tiny_models: dict[str, Path], tmp_path: Path) -> Path:
    """A recipe for the tiny model with one answer anything gives and one it cannot give."""
    recipe = tmp_path / "tiny-answers.toml"
    recipe.write_text(
        f'''source = "{tiny_models["reference"].as_uri()}"
[[answers]]
prompt = "Say anything."
regex = "(?s)."
max_tokens = 8

[[answers]]
prompt = "What is the capital of France? Answer in one word."
regex = "^Paris$"
max_tokens = 8
''',
        encoding="utf-8",
    )
    return recipe


@pytest.mark.docker
@pytest.mark.llamacpp
def test_wrong_answer_fails_through_the_cli(
    patched_build: Path, unanswerable_recipe: Path, lf_home: Path
) -> None:
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    result = invoke(
        "smoke",
        "--build",
        str(patched_build),
        "--model",
        str(unanswerable_recipe),
        "--skip-bench",
        "--threads",
        "1",
        "--requests",
        "1",
        "--max-tokens",
        "4",
        "--concurrency",
        "1",
        "--json",
        env=env,
        timeout=600,
    )
    assert result.returncode == SmokeFailed.exit_code, result.stderr[-3000:]
    assert "FAILED its verdict" in result.stderr
    assert "prompt 'What is the capital of France? Answer in one word.': expected regex /^Paris$/, got" in (
        result.stderr
    )
    report = json.loads(result.stdout)
    answers = [c for c in report["verdict"]["checks"] if c["name"] == "answer"]
    assert [c["status"] for c in answers] == ["pass", "fail"] and report["exit_code"] == SmokeFailed.exit_code
    assert answers[1]["value"] == report["server"]["answers"][1]["reply"].strip()[:200]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.anyio
async def test_wrong_answer_over_mcp_is_an_error_carrying_its_verdict(
    patched_build: Path, unanswerable_recipe: Path, tiny_models: dict[str, Path], lf_home: Path
) -> None:
    import mcp_types
    from mcp import Client
    from mcp_server import ServerOptions, build_server

    roots = (patched_build, unanswerable_recipe.parent, tiny_models["reference"].parent)
    arguments = {
        "build": str(patched_build),
        "model": str(unanswerable_recipe),
        "skip_bench": True,
        "threads": 1,
        "requests": 1,
        "max_tokens": 4,
        "concurrency": [1],
    }
    async with Client(build_server(ServerOptions(allow_roots=roots)), read_timeout_seconds=600) as client:
        result = await client.call_tool("smoke", arguments)
    assert result.is_error and result.structured_content is not None
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    assert "FAILED its verdict" in block.text and "expected regex /^Paris$/" in block.text
    report = result.structured_content
    assert report["exit_code"] == SmokeFailed.exit_code and report["verdict"]["passed"] is False
    assert [c["status"] for c in report["verdict"]["checks"] if c["name"] == "answer"] == ["pass", "fail"]
