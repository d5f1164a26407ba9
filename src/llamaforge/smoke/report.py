"""Smoke reports: the run directory's report.json, summary.md and PNG plots, and ``smoke.compare`` of two runs.

The comparison reads like llama.cpp's compare-llama-bench: one row per metric present in both runs, the
values side by side and their ratio (B / A), plus a speedup that is > 1 when B is better whichever way the
metric points (tokens/s up, latency down).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llamaforge.core.errors import CacheError, InvalidOption
from llamaforge.core.paths import unwritable_reason, written_as_path

SAME_BAND = 0.03  # |speedup - 1| below this reads as "same" (the noise of a short smoke on a shared machine)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    text = " ".join(str(value).split())  # a reply may hold newlines and tabs: one table row stays one line
    return text.replace("|", "\\|")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return lines


def _pair(dist: Mapping[str, float] | None, digits: int = 1) -> str:
    return f"{dist['p50']:.{digits}f} / {dist['p95']:.{digits}f}" if dist else "-"


def render_summary(report: Mapping[str, Any]) -> str:
    """summary.md of a run."""
    verdict = report.get("verdict") or {}
    build, model = report["build"], report["model"]
    state = "PASS" if verdict.get("passed") else "FAIL"
    patches = ", ".join(build.get("patches") or []) or "none"
    params = f"{model['n_params'] / 1e6:.1f} M params, " if model.get("n_params") else ""
    lines = [f"# Smoke run {report['run_id']}: {state}", ""]
    lines += _table(
        ["", ""],
        [
            [
                "build",
                f"{build['key']} (recipe {build.get('recipe') or '-'}, {build.get('backend') or '?'}, "
                f"patches: {patches})",
            ],
            [
                "model",
                f"{model['label']} ({model.get('type', '?')}, {params}{model['size'] / 2**20:.1f} MiB)",
            ],
            ["host", f"{report['host']['platform']}, {report['host']['cpus']} CPUs"],
            ["wall time", f"{report.get('wall_s', 0):.1f} s"],
        ],
    )
    bench = report.get("bench")
    if bench:
        lines += [
            "",
            f"## llama-bench ({bench['build_commit']}, b{bench['build_number']}, {bench['backends']}, "
            f"{bench['n_threads']} threads)",
            "",
        ]
        lines += _table(
            ["test", "t/s", "stddev", "samples t/s"],
            [
                [t["name"], t["avg_ts"], t["stddev_ts"], ", ".join(f"{v:.1f}" for v in t["samples_ts"])]
                for t in bench["tests"]
            ],
        )
    if report.get("cpu_modules"):
        lines += ["", *cpu_modules_lines(report["cpu_modules"])]
    server = report.get("server")
    if server:
        lines += [
            "",
            f"## llama-server (streaming /v1/chat/completions on 127.0.0.1:{server['port']}, "
            f"ready in {server['startup_s']:.1f} s)",
            "",
        ]
        rows = []
        for level in server["levels"]:
            ratio = level["cross_check"]["client_over_server_decode"]
            rows.append(
                [
                    level["concurrency"],
                    f"{level['requests']} ({len(level['errors'])} failed)",
                    _pair(level["ttft_ms"]),
                    _pair(level["itl_ms"], 2),
                    level["decode_tps"]["p50"] if level["decode_tps"] else None,
                    level["aggregate_tps"],
                    _pair(level["e2e_ms"]),
                    f"{ratio['p50']:.3f}" if ratio else "-",
                ]
            )
        lines += _table(
            [
                "concurrency",
                "requests",
                "TTFT p50 / p95 ms",
                "ITL p50 / p95 ms",
                "decode t/s p50",
                "aggregate t/s",
                "e2e p50 / p95 ms",
                "client/server decode",
            ],
            rows,
        )
        answer = server.get("non_empty_answer")
        if answer:
            reply = answer["reply"].strip().replace("\n", " ")[:120]
            lines += [
                "",
                f"Non-empty-answer reply: {reply!r}" if reply else "Non-empty-answer reply: (empty)",
            ]
    lines += ["", *_roofline_lines(report.get("roofline"))]
    if verdict:
        lines += ["", f"## Verdict: {state}", ""]
        lines += _table(
            ["check", "status", "value", "threshold", "source", "detail"],
            [
                [c["name"], c["status"].upper(), c["value"], c["threshold"], c["source"], c["detail"]]
                for c in verdict["checks"]
            ],
        )
    if report.get("error"):
        lines += ["", "## Error", "", "```", report["error"], "```"]
    files = report.get("files") or {}
    if files:
        lines += ["", "## Files", ""] + [f"- {name}: `{path}`" for name, path in files.items()]
    return "\n".join(lines) + "\n"


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def cpu_modules_lines(sweep: Mapping[str, Any]) -> list[str]:
    """The CPU module sweep in Markdown: a heading, what ran where, one row per module."""
    cpu = sweep.get("cpu") or {}
    lines = ["## CPU modules (llama-bench with each one on its own)", ""]
    if not sweep.get("modules"):
        return [*lines, sweep.get("note") or sweep.get("summary") or "no CPU modules"]
    options = sweep.get("options") or {}
    lines += [
        f"{sweep['summary']}. CPU: {cpu.get('model', '?')}; pp{options.get('pp')} tg{options.get('tg')} "
        f"x{options.get('repetitions')}; logs: `{sweep.get('logs')}`",
        "",
    ]
    rows = []
    for row in sweep["modules"]:
        detail = row["detail"] if row["status"] not in ("ran", "not_for_this_cpu") else ""
        pick = "**default**" if row.get("default") else ""
        rows.append(
            [
                row["module"],
                "yes" if row["status"] != "not_for_this_cpu" else "no",
                pick,
                row["outcome"],
                _tps(row["pp_tps"]),
                _tps(row["tg_tps"]),
                detail,
            ]
        )
    lines += _table(["module", "loads here", "pick", "result", "pp t/s", "tg t/s", "detail"], rows)
    default = sweep.get("default") or {}
    if default.get("signal") or not default.get("module"):
        lines += ["", f"Loader's default pick: {default.get('detail', '-')}"]
    return lines


def _roofline_lines(roof: Mapping[str, Any] | None) -> list[str]:
    if not roof:
        return []
    if roof.get("error"):
        return ["## Roofline", "", f"not computed: {roof['error']}"]
    efficiency = roof["efficiency"]
    lines = [
        "## Roofline (estimated)",
        "",
        f"- measured tg: {roof['measured_tg_tps']:.1f} t/s (llama-bench)",
        f"- memory bandwidth: {roof['bandwidth_gbs']:.1f} GB/s ({roof['bandwidth_source']})",
        f"- bytes read per generated token: {roof['bytes_per_token'] / 2**20:.2f} MiB (estimated from the GGUF header)",
        f"- roof: {roof['roof_tps']:.1f} t/s; efficiency: "
        + (f"{efficiency * 100:.1f} % of the memory roofline" if efficiency is not None else "-"),
    ]
    lines += [f"- note: {note}" for note in roof.get("notes", [])]
    if roof.get("cpu_diagnosis"):
        lines.append(f"- {roof['cpu_diagnosis']}")
    return lines


def _plot_throughput(report: Mapping[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 2])
    tests = (report.get("bench") or {}).get("tests", [])
    levels = (report.get("server") or {}).get("levels") or []
    prompt: list[tuple[str, float, float, str]] = [
        (f"bench {t['name']}", t["avg_ts"], t["stddev_ts"], "tab:blue") for t in tests if t["kind"] == "pp"
    ]
    generate: list[tuple[str, float, float, str]] = [
        (f"bench {t['name']}", t["avg_ts"], t["stddev_ts"], "tab:blue") for t in tests if t["kind"] == "tg"
    ]
    for level in levels:
        server_pp = level["cross_check"].get("server_prompt_tps")
        if server_pp:
            prompt.append(
                (f"server c={level['concurrency']}\n(its timings)", server_pp["p50"], 0.0, "tab:orange")
            )
        if level["decode_tps"]:
            generate.append(
                (
                    f"server c={level['concurrency']}\nper request",
                    level["decode_tps"]["p50"],
                    0.0,
                    "tab:orange",
                )
            )
        if level["aggregate_tps"]:
            generate.append(
                (f"server c={level['concurrency']}\naggregate", level["aggregate_tps"], 0.0, "tab:green")
            )
    for ax, bars, title in ((left, prompt, "prompt processing"), (right, generate, "token generation")):
        if bars:
            ax.bar(
                [b[0] for b in bars],
                [b[1] for b in bars],
                yerr=[b[2] for b in bars],
                color=[b[3] for b in bars],
                capsize=4,
            )
        ax.set_title(title)
        ax.set_ylabel("tokens/s")
    fig.suptitle(f"tokens/s per stage (bench: mean ± stddev; server: p50): {report['run_id']}")
    fig.savefig(path, dpi=100)


def _plot_latency(report: Mapping[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    levels = (report.get("server") or {}).get("levels") or []
    extract: list[tuple[str, Callable[[Mapping[str, Any]], list[float]]]] = [
        ("time to first token (ms)", lambda s: [s["ttft_ms"]] if s["ttft_ms"] is not None else []),
        ("inter-token latency (ms)", lambda s: list(s["itl_ms"])),
        ("end-to-end latency (ms)", lambda s: [s["e2e_ms"]] if s["e2e_ms"] is not None else []),
    ]
    for ax, (title, pick) in zip(axes, extract, strict=True):
        data = [[v for s in level["samples"] if s["error"] is None for v in pick(s)] for level in levels]
        if any(data):
            ax.boxplot(
                [d or [0.0] for d in data], tick_labels=[f"c={level['concurrency']}" for level in levels]
            )
        ax.set_title(title)
    fig.suptitle(f"latency distribution by concurrency: {report['run_id']}")
    fig.savefig(path, dpi=100)


def fresh_directory(root: Path, base: str, what: str) -> Path:
    """A new directory ``root/base`` (``base-2``, ``base-3`` … when taken) for a ``what`` ("smoke run"); CacheError
    naming the blocker when ``root`` cannot hold one (a file where a directory must be)."""
    for n in range(1, 1000):
        path = root / (base if n == 1 else f"{base}-{n}")
        try:
            root.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except FileExistsError as error:
            if root.is_dir():
                continue
            reason = unwritable_reason(path, error)
        except OSError as error:
            reason = unwritable_reason(path, error)
        else:
            return path
        raise CacheError(
            f"cannot create the {what} directory {path}: {reason}",
            hint=f"make {root} a directory you can write (it is under LLAMAFORGE_HOME)",
        )
    raise CacheError(f"cannot create a {what} directory under {root}: {base} and 998 more are taken")


def write_run_files(report: dict[str, Any], run_dir: Path) -> dict[str, str]:
    """Write summary.md, the plots and report.json (last, listing the files) into ``run_dir``."""
    files = {
        name: str(run_dir / name) for name in ("report.json", "summary.md", "throughput.png", "latency.png")
    }
    for name in ("bench.json", "bench.log", "server.log"):
        if (run_dir / name).is_file():
            files[name] = str(run_dir / name)
    if (run_dir / "cpu-modules").is_dir():
        files["cpu-modules"] = str(run_dir / "cpu-modules")
    report["files"] = files
    _plot_throughput(report, run_dir / "throughput.png")
    _plot_latency(report, run_dir / "latency.png")
    (run_dir / "summary.md").write_text(render_summary(report), encoding="utf-8")
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return files


# --- compare -----------------------------------------------------------------------------------------------


# Directories under the smoke root that other operations write, not runs.
_NOT_RUNS = {"compare": "smoke.compare", "cpu-modules": "smoke.cpu_modules"}


def resolve_run(ref: str, root: Path) -> Path:
    """A run directory from a path (the directory or its report.json), a run id, or a unique prefix of a run id
    under ``root``."""
    for candidate in (Path(ref), root / ref):
        if (candidate / "report.json").is_file():
            return candidate
        if candidate.name == "report.json" and candidate.is_file():
            return candidate.parent
    runs = sorted(p for p in root.iterdir() if (p / "report.json").is_file()) if root.is_dir() else []
    known = ", ".join(run.name for run in runs[-5:]) or "none"
    if Path(ref).is_file():
        raise InvalidOption(
            f"{ref} is a file, not a smoke run directory or its report.json",
            hint=f"give the directory `invoke smoke` printed, or a run id; runs: {known}",
        )
    if not Path(ref).exists() and written_as_path(ref):
        # a path, read as a run-id prefix, was "no smoke runs match"
        raise InvalidOption(
            f"{ref}: no such smoke run directory",
            hint=f"give the directory `invoke smoke` printed, or a run id; runs: {known}",
        )
    if Path(ref).is_dir():
        raise InvalidOption(
            f"{ref} is not a smoke run directory (it has no report.json)",
            hint=f"give the directory `invoke smoke` printed, or a run id; runs: {known}",
        )
    if ref in _NOT_RUNS:
        raise InvalidOption(
            f"{ref!r} is where {_NOT_RUNS[ref]} keeps its output, not a smoke run",
            hint=f"give the directory `invoke smoke` printed, or a run id; runs: {known}",
        )
    if ref not in ("", ".", "..") and "/" not in ref and (root / ref).is_dir():
        # The run's directory is there but report.json, written last, is not: the run never finished.
        raise InvalidOption(
            f"smoke run {ref} has no report.json: it did not finish (stopped, crashed, the disk was full) or its "
            "report was removed",
            hint=f"run the smoke again, or compare another run; runs: {known}",
        )
    # A prefix is matched as text, never as a glob: a path or a pattern in it names no run.
    matches = [run for run in runs if run.name.startswith(ref)] if ref and "/" not in ref else []
    if len(matches) == 1:
        return matches[0]
    raise InvalidOption(
        f"{len(matches) or 'no'} smoke runs match {ref!r}",
        hint="give a run directory or more of the run id; runs: " + known,
    )


def _is_number(value: Any) -> bool:
    # a bool is an int to Python, and NaN (json writes it) has no ratio: neither is a measurement
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _metric(label: str, unit: str, higher_is_better: bool, a: Any, b: Any) -> dict[str, Any] | None:
    if not _is_number(a) or not _is_number(b):
        return None
    ratio = b / a if a else None
    speedup = (ratio if higher_is_better else (a / b if b else None)) if ratio is not None else None
    better = (
        "-" if speedup is None else "same" if abs(speedup - 1) < SAME_BAND else "B" if speedup > 1 else "A"
    )
    return {
        "metric": label,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "a": a,
        "b": b,
        "ratio": ratio,
        "speedup": speedup,
        "better": better,
    }


def _p(dist: Mapping[str, float] | None, key: str) -> float | None:
    return dist[key] if dist else None


def comparison_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per metric both runs have: llama-bench tests, server levels, roofline efficiency."""
    rows: list[dict[str, Any] | None] = []
    b_tests = {t["name"]: t for t in (b.get("bench") or {}).get("tests", [])}
    for test in (a.get("bench") or {}).get("tests", []):
        other = b_tests.get(test["name"])
        if other:
            rows.append(_metric(f"llama-bench {test['name']}", "t/s", True, test["avg_ts"], other["avg_ts"]))
    b_levels = {lv["concurrency"]: lv for lv in (b.get("server") or {}).get("levels", [])}
    for level in (a.get("server") or {}).get("levels", []):
        other = b_levels.get(level["concurrency"])
        if not other:
            continue
        c = f"c={level['concurrency']}"
        rows += [
            _metric(f"{c} TTFT p50", "ms", False, _p(level["ttft_ms"], "p50"), _p(other["ttft_ms"], "p50")),
            _metric(f"{c} TTFT p95", "ms", False, _p(level["ttft_ms"], "p95"), _p(other["ttft_ms"], "p95")),
            _metric(f"{c} ITL p50", "ms", False, _p(level["itl_ms"], "p50"), _p(other["itl_ms"], "p50")),
            _metric(f"{c} ITL p95", "ms", False, _p(level["itl_ms"], "p95"), _p(other["itl_ms"], "p95")),
            _metric(
                f"{c} decode p50", "t/s", True, _p(level["decode_tps"], "p50"), _p(other["decode_tps"], "p50")
            ),
            _metric(f"{c} aggregate", "t/s", True, level["aggregate_tps"], other["aggregate_tps"]),
            _metric(f"{c} e2e p50", "ms", False, _p(level["e2e_ms"], "p50"), _p(other["e2e_ms"], "p50")),
        ]
    roof_a, roof_b = a.get("roofline") or {}, b.get("roofline") or {}
    rows.append(
        _metric("roofline efficiency (est.)", "", True, roof_a.get("efficiency"), roof_b.get("efficiency"))
    )
    return [row for row in rows if row is not None]


def _identity(report: Mapping[str, Any]) -> dict[str, Any]:
    build, model, bench = report["build"], report["model"], report.get("bench") or {}
    return {
        "build": build["key"],
        "recipe": build.get("recipe"),
        "backend": build.get("backend"),
        "cuda_architectures": ",".join(build.get("cuda_architectures") or []) or "-",
        "patches": ",".join(build.get("patches") or []) or "none",
        "commit": bench.get("build_commit"),
        "model": model["label"],
        "model_type": model.get("type"),
        "threads": bench.get("n_threads"),
        "host": report["host"]["platform"],
    }


def render_compare(data: Mapping[str, Any]) -> str:
    """compare.md: what differs between the runs, then the metrics with ratios."""
    lines = [f"# Smoke comparison: A = {data['a']['run_id']}, B = {data['b']['run_id']}", ""]
    lines += _table(
        ["", "A", "B"],
        [[key, data["a"][key], data["b"][key]] for key in data["differs"]]
        or [["(same build, model and host)", "", ""]],
    )
    lines += ["", "speedup > 1: B is better (tokens/s up or latency down); ratio = B / A", ""]
    lines += _table(
        ["metric", "unit", "A", "B", "B / A", "speedup", "better"],
        [
            [
                r["metric"],
                r["unit"],
                r["a"],
                r["b"],
                f"{r['ratio']:.3f}" if r["ratio"] is not None else "-",
                f"{r['speedup']:.3f}" if r["speedup"] is not None else "-",
                r["better"],
            ]
            for r in data["rows"]
        ],
    )
    return "\n".join(lines) + "\n"


def _plot_compare(data: Mapping[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    rows = [r for r in data["rows"] if r["speedup"] is not None]
    fig = Figure(figsize=(9, 0.35 * len(rows) + 1.5), layout="constrained")
    ax = fig.subplots()
    colors = [
        "tab:green" if r["better"] == "B" else "tab:red" if r["better"] == "A" else "tab:gray" for r in rows
    ]
    ax.barh([r["metric"] for r in rows], [r["speedup"] for r in rows], color=colors)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("speedup of B over A (> 1: B better)")
    ax.set_title(f"A = {data['a']['run_id']}\nB = {data['b']['run_id']}", fontsize=9)
    fig.savefig(path, dpi=100)


def _read_report(run_dir: Path) -> dict[str, Any]:
    """``run_dir``'s report.json, checked to have what a comparison reads."""
    path = run_dir / "report.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8-sig"))  # -sig: saved again by a Windows editor
        if not isinstance(report, dict):
            raise TypeError("it holds no JSON object")
        _identity(report)
        comparison_rows(report, report)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        problem = f"{type(error).__name__}: {error}" if isinstance(error, KeyError) else str(error)
        raise InvalidOption(
            f"{path} is not a smoke report ({problem})",
            hint="compare runs `invoke smoke` wrote; run the smoke again if its report was damaged",
        ) from None
    return report


def _stages(report: Mapping[str, Any]) -> str:
    stages = [name for name, key in (("llama-bench", "bench"), ("llama-server", "server")) if report.get(key)]
    return " and ".join(stages) or "nothing"


def compare_runs(ref_a: str, ref_b: str, root: Path) -> dict[str, Any]:
    """Compare two runs; writes compare.json, compare.md and compare.png to ``root/compare/A--vs--B/``."""
    dir_a, dir_b = resolve_run(ref_a, root), resolve_run(ref_b, root)
    if dir_a.resolve() == dir_b.resolve():
        # a table of ratios 1.00 read as "no change" when one run was named twice
        raise InvalidOption(
            f"{ref_a!r} and {ref_b!r} are the same smoke run ({dir_a.name}): nothing to compare",
            hint="give two runs, e.g. the run id before a rebuild and the one after",
        )
    report_a, report_b = _read_report(dir_a), _read_report(dir_b)
    ident_a, ident_b = _identity(report_a), _identity(report_b)
    data: dict[str, Any] = {
        "a": {"run_id": dir_a.name, "run_dir": str(dir_a), **ident_a},
        "b": {"run_id": dir_b.name, "run_dir": str(dir_b), **ident_b},
        "differs": [key for key in ident_a if ident_a[key] != ident_b[key]],
        "rows": comparison_rows(report_a, report_b),
    }
    if not data["rows"]:
        # an empty table was a comparison that passed: e.g. A ran with --skip-server and B with --skip-bench
        raise InvalidOption(
            f"smoke runs {dir_a.name} and {dir_b.name} have no metric in common: "
            f"A measured {_stages(report_a)}, B {_stages(report_b)}",
            hint="compare runs of the same stages (smoke without --skip-bench / --skip-server measures both)",
        )
    # Named by the run directories (one path component each), never by text inside a report.
    out = root / "compare" / f"{dir_a.name}--vs--{dir_b.name}"
    data["files"] = {name: str(out / name) for name in ("compare.json", "compare.md", "compare.png")}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(render_compare(data), encoding="utf-8")
        _plot_compare(data, out / "compare.png")
        (out / "compare.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        for path in map(Path, data["files"].values()):  # no half-written comparison
            if path.is_file():
                path.unlink()
        raise CacheError(
            f"cannot write the comparison to {out}: {unwritable_reason(out, error)}",
            hint=f"make {root / 'compare'} a directory you can write (it is under LLAMAFORGE_HOME)",
        ) from None
    return data
