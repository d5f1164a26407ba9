"""A smoke run's numbers and verdict: the thresholds (build recipe, model recipe, CLI; later wins, each
remembered with where it came from), the latency and throughput figures of each concurrency level, and the
pass/fail checks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.validation import describe_errors, read_toml, suggest
from llamaforge.smoke.answers import answer_verdict_checks
from llamaforge.smoke.server import LevelRun

NON_EMPTY_PROMPT = "What is the capital of France? Answer in one word."


class SmokeThresholds(BaseModel):
    """What a run must show to pass; each may come from the build recipe, the model recipe or the CLI."""

    # inf passed every check it bounds (max_ttft_ms = inf) or failed every run (min_tg_tps = inf)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_tg_tps: float | None = Field(
        1.0, ge=0, description="Minimum llama-bench tg tokens/s (none: no check)"
    )
    max_ttft_ms: float | None = Field(
        10_000.0, gt=0, description="Maximum p95 time to first token at the lowest concurrency, ms"
    )
    non_empty_answer: str | None = Field(
        NON_EMPTY_PROMPT,
        description="A prompt the server must answer with a non-empty reply, whatever it says (none: skip); "
        "a model recipe's [[answers]] check what the reply says",
    )

    @field_validator("min_tg_tps", "max_ttft_ms", mode="before")
    @classmethod
    def _a_number_not_a_bool(cls, value: Any) -> Any:
        # pydantic reads true as 1.0: `min_tg_tps = true` in a TOML file was a threshold of 1 token/s
        if isinstance(value, bool):
            raise ValueError("Input should be a number, not true or false")
        return value


def parse_threshold_items(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items and/or paths of TOML files with those keys; ``none`` clears a threshold. Each item is
    checked on its own, so that a bad key or value is refused naming the option or the file it came from."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if sep:
            key, raw = key.strip(), raw.strip()
            layer: dict[str, Any] = {key: None if raw.lower() in ("none", "off", "") else raw}
            origin = f"--thresholds {item}"
        else:
            path = Path(item).expanduser()
            layer, origin = _read_thresholds_file(item, path), f"thresholds file {path}"
        resolve_thresholds([(origin, layer)])
        values.update(layer)
    return values


def _read_thresholds_file(item: str, path: Path) -> dict[str, Any]:
    example = "e.g. --thresholds min_tg_tps=20 --thresholds max_ttft_ms=500"
    if path.is_dir():
        raise InvalidOption(
            f"--thresholds {item!r} is neither KEY=VALUE nor a TOML file: it is a directory", hint=example
        )
    if not path.is_file():
        reason = "no such file" if path.suffix or "/" in item else "no such file, and no '=' in it"
        raise InvalidOption(
            f"--thresholds {item!r} is neither KEY=VALUE nor a TOML file ({reason})", hint=example
        )
    if path.suffix.lower() == ".json":
        raise InvalidOption(
            f"thresholds file {path} is JSON: thresholds files are TOML",
            hint="write KEY = VALUE lines (min_tg_tps = 20) in a .toml file, or "
            + example.removeprefix("e.g. "),
        )
    try:
        return read_toml(path, "thresholds file")
    except RecipeError as error:
        raise InvalidOption(str(error), hint=error.hint) from None


def resolve_thresholds(
    layers: Sequence[tuple[str, Mapping[str, Any] | None]],
) -> tuple[SmokeThresholds, dict[str, str]]:
    """Merge threshold layers in order (later wins): the thresholds and, per key, the layer that set it."""
    merged: dict[str, Any] = {}
    sources = dict.fromkeys(SmokeThresholds.model_fields, "default")
    for origin, layer in layers:
        for key, value in (layer or {}).items():
            if key not in SmokeThresholds.model_fields:
                raise InvalidOption(
                    f"unknown threshold {key!r} (from {origin})",
                    hint=suggest(key, SmokeThresholds.model_fields, end=" ")
                    + "known: "
                    + ", ".join(SmokeThresholds.model_fields),
                )
            merged[key] = value
            sources[key] = origin
    try:
        return SmokeThresholds.model_validate(merged), sources
    except ValidationError as error:
        origins = dict.fromkeys(sources[str(item["loc"][0])] for item in error.errors() if item["loc"])
        raise InvalidOption(
            f"invalid thresholds: {describe_errors(error)} (from {', '.join(origins)})",
            hint="known: min_tg_tps (tokens/s, >= 0), max_ttft_ms (ms, > 0), non_empty_answer (a prompt); "
            "none clears one",
        ) from None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float] | None:
    """n, min, p50, p95, max and mean of ``values`` (None when there are none)."""
    if not values:
        return None
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def summarize_level(level: LevelRun) -> dict[str, Any]:
    """Latency and throughput figures of one concurrency level, cross-checked with the server's timings."""
    ok = [s for s in level.samples if s.error is None and s.chunks]
    tokens = sum(s.completion_tokens for s in ok)
    server_tps = [
        s.server_timings["predicted_per_second"] for s in ok if "predicted_per_second" in s.server_timings
    ]
    client_tps = [s.decode_tps for s in ok if s.decode_tps]
    ratios = [
        s.decode_tps / s.server_timings["predicted_per_second"]
        for s in ok
        if s.decode_tps and s.server_timings.get("predicted_per_second")
    ]
    server_pp = [s.server_timings["prompt_per_second"] for s in ok if "prompt_per_second" in s.server_timings]
    ttft_gap = [
        s.ttft_ms - s.server_timings["prompt_ms"] for s in ok if s.ttft_ms and "prompt_ms" in s.server_timings
    ]
    return {
        "concurrency": level.concurrency,
        "requests": len(level.samples),
        "errors": [s.error for s in level.samples if s.error is not None],
        "wall_s": level.wall_s,
        "completion_tokens": tokens,
        "aggregate_tps": tokens / level.wall_s if level.wall_s > 0 else None,
        "ttft_ms": distribution([s.ttft_ms for s in ok if s.ttft_ms is not None]),
        "itl_ms": distribution([v for s in ok for v in s.itl_ms]),
        "e2e_ms": distribution([s.e2e_ms for s in ok if s.e2e_ms is not None]),
        "decode_tps": distribution(client_tps),
        "cross_check": {
            "server_decode_tps": distribution(server_tps),
            "server_prompt_tps": distribution(server_pp),
            "client_over_server_decode": distribution(ratios),
            "ttft_minus_server_prompt_ms": distribution(ttft_gap),
            "note": "client decode tok/s over the server's timings.predicted_per_second (1.0 = they agree); "
            "TTFT minus the server's prompt_ms is HTTP, queueing and first-token time",
        },
    }


def _check(name: str, status: str, value: Any, threshold: Any, source: str, detail: str) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "value": value,
        "threshold": threshold,
        "source": source,
        "detail": detail,
    }


def evaluate(
    report: Mapping[str, Any], thresholds: SmokeThresholds, sources: Mapping[str, str]
) -> dict[str, Any]:
    """The verdict: each check passes, fails or is skipped (its stage did not run); any failure fails the run."""
    checks = []
    bench, server = report.get("bench"), report.get("server")
    tg = next((t for t in bench["tests"] if t["kind"] == "tg"), None) if bench else None
    if thresholds.min_tg_tps is not None:
        if tg is None:
            checks.append(
                _check(
                    "min_tg_tps",
                    "skipped",
                    None,
                    thresholds.min_tg_tps,
                    sources["min_tg_tps"],
                    "llama-bench stage did not run",
                )
            )
        else:
            passed = tg["avg_ts"] >= thresholds.min_tg_tps
            checks.append(
                _check(
                    "min_tg_tps",
                    "pass" if passed else "fail",
                    tg["avg_ts"],
                    thresholds.min_tg_tps,
                    sources["min_tg_tps"],
                    f"llama-bench {tg['name']} average tokens/s",
                )
            )
    levels = server["levels"] if server else []
    if thresholds.max_ttft_ms is not None:
        lowest = min(levels, key=lambda level: level["concurrency"]) if levels else {}
        ttft = lowest.get("ttft_ms")
        if ttft is None:
            checks.append(
                _check(
                    "max_ttft_ms",
                    "skipped" if not server else "fail",
                    None,
                    thresholds.max_ttft_ms,
                    sources["max_ttft_ms"],
                    "no time to first token was measured",
                )
            )
        else:
            passed = ttft["p95"] <= thresholds.max_ttft_ms
            detail = f"p95 TTFT at concurrency {lowest['concurrency']}"
            checks.append(
                _check(
                    "max_ttft_ms",
                    "pass" if passed else "fail",
                    ttft["p95"],
                    thresholds.max_ttft_ms,
                    sources["max_ttft_ms"],
                    detail,
                )
            )
    if server:
        errors = [error for level in levels for error in level["errors"]]
        checks.append(
            _check(
                "no_failed_requests",
                "fail" if errors else "pass",
                len(errors),
                0,
                "built-in",
                "; ".join(errors[:3]) or "every request streamed tokens",
            )
        )
    if thresholds.non_empty_answer is not None:
        answer = server.get("non_empty_answer") if server else None
        source = sources["non_empty_answer"]
        if answer is None:
            checks.append(
                _check(
                    "non_empty_answer",
                    "skipped",
                    None,
                    thresholds.non_empty_answer,
                    source,
                    "server stage did not run",
                )
            )
        else:
            reply = answer["reply"].strip()
            detail = answer.get("error") or "a non-empty reply"
            checks.append(
                _check(
                    "non_empty_answer",
                    "pass" if reply else "fail",
                    reply[:200],
                    thresholds.non_empty_answer,
                    source,
                    detail,
                )
            )
    sweep = report.get("cpu_modules")
    if sweep and sweep.get("modules"):
        problems = sweep.get("problems") or []
        checks.append(
            _check(
                "cpu_modules",
                "fail" if problems else "pass",
                len(problems),
                0,
                "built-in",
                "; ".join(problems[:3]) or sweep.get("summary") or "",
            )
        )
    checks += answer_verdict_checks(server or {})
    return {"passed": not any(check["status"] == "fail" for check in checks), "checks": checks}
