"""Checked answers: does a running llama-server give the answers it must?

* With a real model, a recipe's ``[[answers]]`` (:class:`~llamaforge.models.recipes.AnswerCheck`) are asked as
  greedy chat completions and each reply must match its expectation (:func:`check_answers`).
* With a random-weight tiny model no answer means anything, so the build's arithmetic is checked instead: the
  greedy tokens and top-n logprobs of a raw ``/completion`` (temperature 0, fixed seed) are compared with a
  golden recorded from a reference build (:func:`greedy_completion`, :func:`first_difference`).

Both take a server's base URL (``http://127.0.0.1:PORT``), so deploy's health gate calls them on its own server.
A golden is a JSON file the user keeps (``smoke --record-golden FILE`` on the build they trust, ``--golden FILE``
on the build under test): it belongs to one model file and one reference build, so none is shipped.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.core.errors import InvalidOption, SmokeFailed
from llamaforge.models.recipes import AnswerCheck

GOLDEN_SCHEMA = 1
GOLDEN_PROMPT = "The history of the printing press"
# Logprobs may differ by at most this much (nats) from the golden. On the reference host, other thread counts
# and other patch series give bit-identical logprobs for the tiny model; another CPU's SIMD path reorders F32
# sums, which moves its logits by ~1e-5. The tolerance stays well below the gaps between neighbouring
# candidates of the random-weight model (its distribution is nearly flat at -ln(vocab): gaps of ~1e-2 nats),
# so any miscomputation large enough to reorder candidates is reported, not tolerated.
LOGPROB_TOLERANCE = 1e-3


@dataclass(frozen=True)
class GoldenRequest:
    """The raw completion a golden records: the same request is replayed against the build under test."""

    prompt: str = GOLDEN_PROMPT
    n_predict: int = 16
    n_probs: int = 5
    seed: int = 42

    def body(self) -> dict[str, Any]:
        """The JSON body of llama-server's ``/completion`` (field names as in tools/server at b11312)."""
        return {
            "prompt": self.prompt,
            "n_predict": self.n_predict,
            "n_probs": self.n_probs,
            "temperature": 0.0,  # greedy; the top-n logprobs are taken before sampling
            "seed": self.seed,
            "ignore_eos": True,  # always n_predict tokens, so two builds are compared position by position
            "cache_prompt": False,
        }


def _post(
    base_url: str, path: str, body: Mapping[str, Any], timeout: float, api_key: str | None = None
) -> dict[str, Any]:
    url = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} from {path}: {payload[:300].decode(errors='replace')}")
        data = json.loads(payload)
    finally:
        connection.close()
    if not isinstance(data, dict):
        raise OSError(f"{path} answered {type(data).__name__}, not an object")
    return data


@dataclass(frozen=True)
class AnswerOutcome:
    """One checked answer: the prompt, what was expected, what came back."""

    prompt: str
    expected: str
    reply: str
    passed: bool
    error: str | None = None


def ask(base_url: str, prompt: str, *, max_tokens: int, timeout: float, api_key: str | None = None) -> str:
    """The reply of one greedy, non-streaming chat completion (thinking off, so the reply is the answer);
    ``api_key`` is sent as a bearer token when the server wants one."""
    data = _post(
        base_url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": GoldenRequest.seed,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        timeout,
        api_key,
    )
    message = (data.get("choices") or [{}])[0].get("message") or {}
    return str(message.get("content") or "")


def check_answers(
    base_url: str, checks: Sequence[AnswerCheck], *, timeout: float = 120.0, api_key: str | None = None
) -> list[AnswerOutcome]:
    """Ask every check's prompt on the server at ``base_url``; each outcome says whether its reply matched."""
    outcomes = []
    for check in checks:
        try:
            reply = ask(base_url, check.prompt, max_tokens=check.max_tokens, timeout=timeout, api_key=api_key)
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
            failure = f"{type(error).__name__}: {error}"
            outcomes.append(AnswerOutcome(check.prompt, check.expectation, "", False, failure))
            continue
        outcomes.append(AnswerOutcome(check.prompt, check.expectation, reply, check.matches(reply)))
    return outcomes


def greedy_completion(
    base_url: str, request: GoldenRequest, *, timeout: float = 120.0, api_key: str | None = None
) -> list[dict[str, Any]]:
    """Per generated token: ``id``, ``token``, ``logprob`` and ``top`` (the top-n ``id``/``token``/``logprob``)."""
    data = _post(base_url, "/completion", request.body(), timeout, api_key)
    return [
        {
            "id": entry["id"],
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top": [
                {"id": top["id"], "token": top["token"], "logprob": top["logprob"]}
                for top in entry.get("top_logprobs") or []
            ],
        }
        for entry in data.get("completion_probabilities") or []
    ]


def first_difference(
    expected: Sequence[Mapping[str, Any]],
    got: Sequence[Mapping[str, Any]],
    tolerance: float = LOGPROB_TOLERANCE,
) -> dict[str, Any] | None:
    """The first position where ``got`` computes differently from the golden ``expected`` (None: none does).

    A position differs when its greedy token differs, when the chosen token's logprob is off by more than
    ``tolerance``, or when the top-n candidates disagree by more than that (:func:`_top_difference`)."""
    for position in range(max(len(expected), len(got))):
        if position >= len(got) or position >= len(expected):
            return {
                "position": position,
                "expected": _token(expected, position),
                "got": _token(got, position),
                "logprob_delta": None,
                "reason": "the completions have different lengths",
            }
        want, have = expected[position], got[position]
        delta = have["logprob"] - want["logprob"]
        reason: str | None
        if want["id"] != have["id"]:
            reason = "a different greedy token"
        elif abs(delta) > tolerance:
            reason = f"the token's logprob is off by more than {tolerance}"
        else:
            reason = _top_difference(want["top"], have["top"], tolerance)
            if reason is None:
                continue
        return {
            "position": position,
            "expected": _token(expected, position),
            "got": _token(got, position),
            "logprob_delta": delta,
            "reason": reason,
        }
    return None


def _token(tokens: Sequence[Mapping[str, Any]], position: int) -> dict[str, Any] | None:
    if position >= len(tokens):
        return None
    return {key: tokens[position][key] for key in ("id", "token", "logprob")}


def _top_difference(
    want: Sequence[Mapping[str, Any]], have: Sequence[Mapping[str, Any]], tolerance: float
) -> str | None:
    """How the two top-n lists disagree, if they do: a shared candidate's logprob is off, or a candidate of one
    list is missing from the other although it sits above that list's last entry by more than ``tolerance``."""
    want_by_id = {top["id"]: top["logprob"] for top in want}
    have_by_id = {top["id"]: top["logprob"] for top in have}
    for top in want:
        if top["id"] in have_by_id and abs(have_by_id[top["id"]] - top["logprob"]) > tolerance:
            return f"top candidate {top['token']!r} (id {top['id']}): logprob off by more than {tolerance}"
    for ours, theirs, where in ((want, have_by_id, "got"), (have, want_by_id, "the golden")):
        floor = min(theirs.values(), default=float("-inf"))
        for top in ours:
            if top["id"] not in theirs and top["logprob"] > floor + tolerance:
                candidate = f"top candidate {top['token']!r} (id {top['id']})"
                return f"{candidate} is missing from the top {len(theirs)} of {where}"
    return None


def describe_difference(difference: Mapping[str, Any]) -> str:
    """One line naming the first differing token: position, expected vs got, logprob delta, why."""

    def shown(token: Mapping[str, Any] | None) -> str:
        return (
            "(none)"
            if token is None
            else f"{token['token']!r} (id {token['id']}, logprob {token['logprob']:.4f})"
        )

    delta = difference["logprob_delta"]
    return (
        f"token {difference['position']}: expected {shown(difference['expected'])}, got "
        f"{shown(difference['got'])}"
        + ("" if delta is None else f", logprob delta {delta:+.4g}")
        + f" ({difference['reason']})"
    )


def load_golden(path: Path) -> tuple[GoldenRequest, list[dict[str, Any]]]:
    """The request and the reference tokens of a golden file written by ``smoke --record-golden``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("it holds no JSON object")
        if data.get("schema") != GOLDEN_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {GOLDEN_SCHEMA}")
        request = data["request"]
        known = {field.name for field in dataclasses.fields(GoldenRequest)}
        if not isinstance(request, dict) or not set(request) <= known:
            raise ValueError(f"its request is not an object of {', '.join(sorted(known))}")
        return GoldenRequest(**request), list(data["tokens"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        problem = (
            f"it has no {error} field"
            if isinstance(error, KeyError)
            else error.strerror or str(error)
            if isinstance(error, OSError)
            else str(error)
        )
        raise InvalidOption(
            f"--golden {path} cannot be read: {problem}",
            hint="give a golden that smoke --record-golden PATH wrote (record one on a reference build)",
        ) from None


def golden_stage(
    base_url: str,
    *,
    golden: Path | None,
    record_golden: Path | None,
    timeout: float,
    source: Mapping[str, Any],
) -> dict[str, Any]:
    """Record the server's greedy tokens to ``record_golden`` (``source`` says what computed them), or compare
    them with ``golden``; the smoke report's ``server.golden``."""
    path = record_golden or golden
    if path is None:
        raise InvalidOption("the golden stage needs a golden to compare with or a file to record to")
    request, expected = load_golden(golden) if golden else (GoldenRequest(), [])
    try:
        tokens = greedy_completion(base_url, request, timeout=timeout)
    except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
        raise SmokeFailed(f"the greedy completion for the golden {path} failed: {error}") from None
    result: dict[str, Any] = {
        "path": str(path),
        "request": dataclasses.asdict(request),
        "n_tokens": len(tokens),
        "tolerance": LOGPROB_TOLERANCE,
    }
    if record_golden:
        document = {
            "schema": GOLDEN_SCHEMA,
            "request": dataclasses.asdict(request),
            "tokens": tokens,
            "source": dict(source),
        }
        record_golden.parent.mkdir(parents=True, exist_ok=True)
        record_golden.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return {**result, "mode": "record", "first_difference": None}
    return {**result, "mode": "compare", "first_difference": first_difference(expected, tokens)}


def answer_verdict_checks(server: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdict's checks for a smoke report's ``server`` section: one ``answer`` per checked answer, and
    ``golden_tokens`` when a golden was compared."""
    checks = []
    for outcome in server.get("answers") or []:
        reply = outcome["reply"].strip()[:200]
        detail = f"prompt {outcome['prompt']!r}: expected {outcome['expected']}, got {reply!r}"
        checks.append(
            {
                "name": "answer",
                "status": "pass" if outcome["passed"] else "fail",
                "value": reply,
                "threshold": outcome["expected"],
                "source": "model recipe",
                "detail": detail + (f" ({outcome['error']})" if outcome["error"] else ""),
            }
        )
    golden = server.get("golden")
    if golden and golden["mode"] == "compare":
        difference = golden["first_difference"]
        matched = (
            f"{golden['n_tokens']} greedy tokens and their top-{golden['request']['n_probs']} logprobs "
            f"match the golden (tolerance {golden['tolerance']})"
        )
        detail = describe_difference(difference) if difference else matched
        checks.append(
            {
                "name": "golden_tokens",
                "status": "fail" if difference else "pass",
                "value": None if difference is None else difference["position"],
                "threshold": golden["path"],
                "source": "cli",
                "detail": detail,
            }
        )
    return checks
