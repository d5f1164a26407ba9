"""An upgrade's verdict and its report: report.json (the result), report.md (for a person) and report.png
(old against new, per model: llama-bench pp and tg, TTFT and ITL)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llamaforge.core.errors import ExitCode, PatchError, UpgradeFailed
from llamaforge.core.paths import write_text_atomic
from llamaforge.upgrade.results import (
    Finding,
    FitRow,
    ModelComparison,
    Rebase,
    StageFailure,
    UpgradeResult,
    Verdict,
)

# The metrics the verdict holds to the tolerance (higher is better), and the latencies it reports.
SPEED_METRICS = ("llama-bench pp", "llama-bench tg")
PLOTTED = (
    ("llama-bench pp", "pp t/s"),
    ("llama-bench tg", "tg t/s"),
    ("c=1 TTFT p50", "TTFT ms"),
    ("c=1 ITL p50", "ITL ms"),
)


def regressions(smokes: Sequence[ModelComparison], tolerance: float) -> list[str]:
    reasons = []
    for smoke in smokes:
        if smoke.old_passed and smoke.new_passed is False:
            reasons.append(
                f"{smoke.model}: the smoke verdict passes on the old build and fails on the new one"
            )
        old = {item["prompt"]: item["passed"] for item in smoke.answers.get("old", [])}
        for item in smoke.answers.get("new", []):
            if old.get(item["prompt"]) and not item["passed"]:
                reasons.append(f"{smoke.model}: the answer to {item['prompt']!r} is no longer right")
        for row in smoke.rows:
            speedup = row.get("speedup")
            if row["metric"].startswith(SPEED_METRICS) and speedup is not None and speedup < 1 - tolerance:
                reasons.append(
                    f"{smoke.model}: {row['metric']} {row['a']:.1f} → {row['b']:.1f} {row['unit']} "
                    f"(x{speedup:.2f}, beyond the {tolerance:.0%} tolerance)"
                )
    return reasons


def decide(
    *,
    dry_run: bool,
    rebase: Rebase,
    findings: Sequence[Finding],
    failure: StageFailure | None,
    smokes: Sequence[ModelComparison],
    fit: Sequence[FitRow],
    tolerance: float,
) -> tuple[Verdict, list[str]]:
    """The verdict and the reasons behind it, worst first."""
    notes = [f"{finding.kind} {finding.name}: {finding.suggestion}" for finding in findings]
    moved = sorted(
        {f"{row.model} {row.category} {row.old_mib} → {row.new_mib} MiB" for row in fit if row.moved}
    )
    notes += [f"llama.cpp now sizes {item}: re-check the fit of your models" for item in moved]
    if not rebase.ok:
        conflicting = [patch.name for patch in rebase.patches if patch.status == "conflicts"]
        return "conflicts", [f"{len(conflicting)} patch(es) conflict: {', '.join(conflicting)}", *notes]
    if failure is not None:
        return "broken", [f"{failure.stage}: {failure.message}", *notes]
    if dry_run:
        return "dry run", notes
    found = regressions(smokes, tolerance)
    if found:
        return "regression", found + notes
    return "upgrade ok", notes


def verdict_exit_code(verdict: Verdict) -> int:
    """The exit code of a verdict: 0 when the upgrade is fine (or was only a dry run), the failure's otherwise."""
    if verdict in ("upgrade ok", "dry run"):
        return ExitCode.OK
    return PatchError.exit_code if verdict == "conflicts" else UpgradeFailed.exit_code


def next_step(result: UpgradeResult, *, applied: bool) -> str:
    """What the person does next, for this verdict."""
    if result.verdict == "conflicts":
        return (
            f"resolve the conflicts in {result.rebase.workspace} (git status shows them), then "
            f"`invoke upgrade --resume {result.dir}`"
        )
    if result.verdict == "broken":
        return "the current pin is untouched; the report has the failed stage and its output"
    if result.verdict == "regression":
        return "the current pin is untouched; compare the runs (report.md) before you decide"
    if result.verdict == "dry run":
        return f"run it without --dry-run to build and smoke the candidate (`invoke upgrade --resume {result.dir}`)"
    if applied:
        return f"the recipe now pins {result.new.label}; the old build stays in the store to go back to"
    return f"adopt it with `invoke upgrade --resume {result.dir} --apply`"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def render_markdown(result: UpgradeResult) -> str:
    """report.md: the verdict first, then each stage."""
    lines = [
        f"# Upgrade of recipe {result.recipe}: {result.old.label} → {result.new.label}",
        "",
        f"**Verdict: {result.verdict}**" + (" (applied)" if result.applied else ""),
        "",
        *[f"- {reason}" for reason in result.reasons],
        "",
        f"Next: {result.next_step}",
        "",
        "## Sources",
        "",
        *_table(
            ["", "origin", "commit", "build", "sha256"],
            [
                [name, view.origin, view.commit[:12], view.label, view.source.get("sha256", "-")]
                for name, view in (("old", result.old), ("new", result.new))
            ],
        ),
        "## Patch series",
        "",
        *_table(
            ["patch", "status", "platforms", "conflicting hunks"],
            [
                [
                    patch.name,
                    patch.status,
                    ", ".join(patch.platforms) or "all",
                    "; ".join(f"{file}: {', '.join(hunks)}" for file, hunks in patch.files.items()),
                ]
                for patch in result.rebase.patches
            ],
        ),
        "## What moved under the recipe",
        "",
    ]
    if result.findings:
        lines += _table(
            ["kind", "name", "old", "new", "suggestion"],
            [[f.kind, f.name, f.old, f.new, f.suggestion] for f in result.findings],
        )
    else:
        lines += ["Nothing: every option the build sets and every target it builds is still there.", ""]
    if result.failure:
        lines += ["## Failure", "", f"Stage **{result.failure.stage}**: {result.failure.message}", ""]
        if result.failure.hint:
            lines += [result.failure.hint, ""]
        if result.failure.log_tail:
            lines += ["```", *result.failure.log_tail, "```", ""]
        if result.failure.log:
            lines += [f"Whole log: {result.failure.log}", ""]
    if result.builds:
        lines += [
            "## Builds",
            "",
            *_table(
                ["", "key", "cached", "seconds"],
                [[name, b.key, b.cached, b.seconds] for name, b in result.builds.items()],
            ),
        ]
    for smoke in result.smokes:
        lines += [
            f"## Smoke: {smoke.model}",
            "",
            f"Runs: old {smoke.old_run} ({_passed(smoke.old_passed)}), new {smoke.new_run} "
            f"({_passed(smoke.new_passed)})."
            + (
                " The first pair showed a regression: these are the second pair's runs."
                if smoke.repeated
                else ""
            ),
            "",
        ]
        if smoke.rows:
            lines += _table(
                ["metric", "unit", "old", "new", "new/old", "better"],
                [
                    [r["metric"], r["unit"], _num(r["a"]), _num(r["b"]), _num(r["ratio"]), r["better"]]
                    for r in smoke.rows
                ],
            )
    if result.fit:
        lines += [
            "## Fit, measured on each build (MiB, all on the CPU)",
            "",
            *_table(
                ["model", "category", "plan", "old build", "new build", "moved"],
                [[r.model, r.category, r.planned_mib, r.old_mib, r.new_mib, r.moved] for r in result.fit],
            ),
        ]
    lines += [
        "## Stages",
        "",
        *_table(["stage", "seconds"], [[k, v] for k, v in result.stage_seconds.items()]),
    ]
    return "\n".join(lines)


def _passed(value: bool | None) -> str:
    return "not run" if value is None else "passed" if value else "FAILED"


def _num(value: Any) -> Any:
    return f"{value:.3g}" if isinstance(value, float) else value


def plot(result: UpgradeResult, path: Path) -> None:
    """report.png: per model, old against new for pp, tg, TTFT and ITL (one panel each)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2), layout="constrained")
    axes = fig.subplots(1, len(PLOTTED))
    models = [smoke for smoke in result.smokes if smoke.rows]
    for ax, (prefix, title) in zip(axes, PLOTTED, strict=True):
        olds, news = [], []
        for smoke in models:
            row = next((r for r in smoke.rows if r["metric"].startswith(prefix)), None)
            olds.append(row["a"] if row else 0.0)
            news.append(row["b"] if row else 0.0)
        positions = range(len(models))
        ax.bar([p - 0.2 for p in positions], olds, width=0.4, label=result.old.label, color="tab:gray")
        ax.bar([p + 0.2 for p in positions], news, width=0.4, label=result.new.label, color="tab:blue")
        ax.set_xticks(list(positions), [smoke.model for smoke in models], rotation=20, fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{result.recipe}: {result.old.label} → {result.new.label} ({result.verdict})", fontsize=10)
    fig.savefig(path, dpi=100)


def write_report(result: UpgradeResult, directory: Path) -> dict[str, str]:
    """Write report.json, report.md and (when anything was smoked) report.png; name -> path."""
    files = {"report.json": str(directory / "report.json"), "report.md": str(directory / "report.md")}
    if any(smoke.rows for smoke in result.smokes):
        files["report.png"] = str(directory / "report.png")
    result.files = files
    if "report.png" in files:
        plot(result, Path(files["report.png"]))
    write_text_atomic(directory / "report.md", render_markdown(result) + "\n")
    data = result.model_dump(mode="json", exclude_none=True)
    write_text_atomic(directory / "report.json", json.dumps(data, indent=2) + "\n")
    return files
