"""Where the test suite's time goes: each tier's and each test file's wall time, and what dominates.

Reads what `pytest --suite-times FILE` wrote (tests/suite_times.py: every test's setup / call / teardown and every
fixture's own setup time) or a JUnit XML file (`pytest --junitxml`: a test's total only), one file per run, and
prints the runs side by side: cold then warm, before then after. `nox -s suite_profile` runs the suite and
calls this.

Usage: python benchmarks/suite_time.py RUN.json [RUN2.json ...] [--files 25] [--top 12] [--labels cold,warm]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One suite run: per-test seconds (setup + call + teardown), tiers, fixture setups."""

    label: str
    tests: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    tiers: dict[str, str] = field(default_factory=dict)
    workers: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    fixtures: list[dict[str, Any]] = field(default_factory=list)
    phases: list[tuple[float, str, str]] = field(default_factory=list)
    wall_s: float | None = None
    cpu: str = ""

    def by(self, key: dict[str, str]) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for test, seconds in self.tests.items():
            totals[key.get(test, "?")] += seconds
        return dict(totals)

    @property
    def total(self) -> float:
        return sum(self.tests.values())


def read_times(path: Path, label: str) -> Run:
    """A run from tests/suite_times.py's JSON."""
    data = json.loads(path.read_text(encoding="utf-8"))
    run = Run(label, fixtures=data.get("fixtures", []), wall_s=data.get("wall_s"), cpu=data.get("cpu", ""))
    for test, entry in data["tests"].items():
        phases = {when: float(entry.get(when, 0.0)) for when in ("setup", "call", "teardown")}
        run.tests[test] = sum(phases.values())
        run.files[test] = entry["file"]
        run.tiers[test] = entry.get("tier") or "?"
        run.outcomes[test] = entry.get("outcome", "?")
        run.workers[test] = entry.get("worker") or "(one process)"
        run.phases += [(seconds, when, test) for when, seconds in phases.items()]
    return run


def junit_file(classname: str) -> str:
    """tests.test_smoke.TestX -> tests/test_smoke.py (the module is the last part that names a test file)."""
    parts = classname.split(".")
    for index in range(len(parts) - 1, -1, -1):
        if parts[index].startswith("test_") or parts[index] == "conftest":
            return "/".join(parts[: index + 1]) + ".py"
    return "/".join(parts) + ".py"


def read_junit(path: Path, label: str) -> Run:
    """A run from a JUnit XML file: totals per test, no phases, fixtures or tiers."""
    run = Run(label)
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        for case in suite.iter("testcase"):
            name = f"{junit_file(case.get('classname', ''))}::{case.get('name', '')}"
            run.tests[name] = float(case.get("time", 0.0))
            run.files[name] = name.split("::", 1)[0]
            failed = case.find("failure") is not None or case.find("error") is not None
            run.outcomes[name] = (
                "failed" if failed else ("skipped" if case.find("skipped") is not None else "passed")
            )
        if suite.get("time"):
            run.wall_s = float(suite.get("time", 0.0))
    return run


def read_run(path: Path, label: str) -> Run:
    """A run from either format, told apart by the first byte."""
    text = path.read_text(encoding="utf-8")
    return read_junit(path, label) if text.lstrip().startswith("<") else read_times(path, label)


def _columns(runs: list[Run], values: list[dict[str, float]], keys: list[str], width: int) -> list[str]:
    head = f"{'':<{width}}" + "".join(f"{run.label:>12}" for run in runs)
    lines = [head]
    for key in keys:
        cells = "".join(
            f"{value.get(key, 0.0):>11.1f}s" if key in value else f"{'-':>12}" for value in values
        )
        lines.append(f"{key[:width]:<{width}}{cells}")
    return lines


def report(runs: list[Run], files: int = 25, top: int = 12) -> str:
    """The side-by-side tables, as text."""
    out: list[str] = []
    for run in runs:
        wall = f"{run.wall_s:.0f} s wall, " if run.wall_s is not None else ""
        count = len(run.tests)
        outcomes = defaultdict(int)
        for outcome in run.outcomes.values():
            outcomes[outcome] += 1
        summary = ", ".join(f"{n} {name}" for name, n in sorted(outcomes.items()))
        out.append(f"{run.label}: {wall}{run.total:.0f} s in tests, {count} tests ({summary}); {run.cpu}")
    out.append("")
    out.append("by tier")
    tiers = [run.by(run.tiers) for run in runs]
    keys = sorted({key for value in tiers for key in value}, key=lambda k: -max(v.get(k, 0.0) for v in tiers))
    out += _columns(runs, tiers, keys, 24)
    if any(run.workers for run in runs):
        out.append("")
        out.append("by xdist worker (each worker's lanes and quick tests, in series)")
        workers = [run.by(run.workers) for run in runs]
        out += _columns(runs, workers, sorted({key for value in workers for key in value}), 24)
    out.append("")
    out.append(f"by file (the {files} longest in the first run)")
    per_file = [run.by(run.files) for run in runs]
    keys = sorted(per_file[0], key=lambda k: -per_file[0][k])[:files]
    out += _columns(runs, per_file, keys, 44)
    rest = [sum(v for k, v in value.items() if k not in keys) for value in per_file]
    out.append(f"{'(the other files)':<44}" + "".join(f"{r:>11.1f}s" for r in rest))
    for run in runs:
        if run.fixtures:
            out.append("")
            out.append(f"{run.label}: the {top} longest fixture setups (own time; a build or a host boot)")
            for entry in sorted(run.fixtures, key=lambda e: -e["seconds"])[:top]:
                out.append(
                    f"  {entry['seconds']:>8.1f}s  {entry['name']} ({entry['scope']}), for {entry['test']}"
                )
        if run.phases:
            out.append(f"{run.label}: the {top} longest test calls")
            calls = sorted((p for p in run.phases if p[1] == "call"), reverse=True)[:top]
            out += [f"  {seconds:>8.1f}s  {test}" for seconds, _, test in calls]
        else:
            out.append("")
            out.append(f"{run.label}: the {top} longest tests (setup + call + teardown)")
            ranked = sorted(run.tests.items(), key=lambda kv: -kv[1])[:top]
            out += [f"  {seconds:>8.1f}s  {test}" for test, seconds in ranked]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="--suite-times JSON or JUnit XML files, one per run"
    )
    parser.add_argument("--labels", help="comma-separated names for the runs (default: the file names)")
    parser.add_argument("--files", type=int, default=25, help="how many files to list (default 25)")
    parser.add_argument(
        "--top", type=int, default=12, help="how many fixtures and tests to list (default 12)"
    )
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [path.stem for path in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels names {len(labels)} runs, {len(args.runs)} files given")
    missing = [str(path) for path in args.runs if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(
        report(
            [read_run(path, label) for path, label in zip(args.runs, labels, strict=True)],
            args.files,
            args.top,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
