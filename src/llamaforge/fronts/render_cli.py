"""Human renderings of operation results (tables and syntax-highlighted files); ``--json`` bypasses them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

_STATUS = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]fail[/red]"}


def _build(result: dict[str, Any], console: Console) -> None:
    if result["dry_run"]:
        plan = result["plan"]
        archs = ",".join(plan["cuda_architectures"]) or "-"
        console.print(
            f"[bold]plan[/bold] recipe={plan['recipe']} backend={plan['backend']} archs={archs} "
            f"base={plan['base_image']['tag']}"
        )
        console.print(f"source: {json.dumps(plan['source'])}")
        console.print("patches: " + (", ".join(p["name"] for p in plan["patches"]) or "none"))
        console.print("cmake: " + " ".join(plan["cmake_args"]), highlight=False)
        console.print(f"plan digest: {plan['plan_digest']}")
        console.print(f"cache key: {plan['cache_key'] or '-'} ({plan['cache_key_note']})")
        console.print(Syntax(plan["files"]["Dockerfile"], "docker", line_numbers=False))
        console.print(Syntax(plan["files"]["build.sh"], "bash", line_numbers=False))
        return
    build = result["build"]
    state = "[green]cache hit[/green]" if build["cached"] else "[green]built[/green]"
    console.print(f"{state} {build['key']} in {build['seconds']:.1f} s\n  {build['path']}")
    table = Table("artifact", "size", "sha256")
    for name, info in sorted(build["artifacts"].items()):
        table.add_row(name, f"{info['size'] / 2**20:.1f} MiB", info["sha256"][:16] + "…")
    console.print(table)
    report = result.get("reproducibility")
    if report:
        if report["reproducible"]:
            console.print(f"[green]reproducible[/green]: {len(report['identical'])} artifacts bit-identical")
        else:
            console.print(f"[red]not reproducible[/red]: {len(report['different'])} artifacts differ")
            for diff in report["different"]:
                sections = ", ".join(diff["sections"]) or "?"
                console.print(f"  {diff['path']}: sections {sections} differ: {diff['explanation']}")
                if diff["kept"]:
                    console.print(f"    rebuilt copy kept at {diff['kept']}")


def _builds_list(result: dict[str, Any], console: Console) -> None:
    table = Table("key", "recipe", "backend", "archs", "patches", "executor", "finished")
    for item in result["builds"]:
        table.add_row(item["key"], item["recipe"], item["backend"], ",".join(item["cuda_architectures"]) or "-",
                      ",".join(item["patches"]) or "-", item["executor"], item["finished_at"])  # fmt: skip
    console.print(table if result["builds"] else "no builds yet: `invoke build`")


def _doctor(result: dict[str, Any], console: Console) -> None:
    table = Table("check", "status", "detail", "next step")
    for check in result["checks"]:
        table.add_row(check["name"], _STATUS[check["status"]], check["detail"], check["hint"])
    console.print(table)


def _recipes_list(result: dict[str, Any], console: Console) -> None:
    table = Table("recipe", "backend", "source", "description")
    for item in result["recipes"]:
        table.add_row(item["name"], item["backend"], item["source"], item["description"])
    console.print(table)


def _models_fetch(result: dict[str, Any], console: Console) -> None:
    state = "[green]cached[/green]" if result["cached"] else "[green]downloaded[/green]"
    pin = f" @ {result['commit']}" if result.get("commit") else ""
    console.print(
        f"{state} {result['source']}{pin}\n  {result['path']}\n  {result['size']} bytes, sha256 {result['sha256']}"
    )


def _models_lock(result: dict[str, Any], console: Console) -> None:
    table = Table("input", "status", "pin / reason")
    for item in result["locked"]:
        pin = item.get("digest") or f"{item.get('revision') or '-'} sha256:{item['sha256'][:16]}…"
        table.add_row(f"{item['kind']} {item['name']}", "[green]locked[/green]", pin)
    for name in result["pinned"]:
        table.add_row(f"model {name}", "[green]pinned[/green]", "pinned by the recipe or the lock")
    for item in result["skipped"]:
        table.add_row(f"{item['kind']} {item['name']}", "skipped", item["reason"])
    for item in result["unresolved"]:
        table.add_row(
            f"{item['kind']} {item['name']}", "[red]unresolved[/red]", f"{item['reason']} ({item['hint']})"
        )
    console.print(table)
    console.print(f"lock file: {result['lock_file']}" + ("" if result["written"] else " (unchanged)"))


def _models_verify(result: dict[str, Any], console: Console) -> None:
    verdict = "[green]ok[/green]" if result["ok"] else "[red]FAILED[/red]"
    cached = " (cached verdict)" if result["cached"] else ""
    console.print(f"{verdict} {result['path']}{cached}\n  {result['size']} bytes, sha256 {result['sha256']}")
    console.print(
        "  " + "  ".join(f"{name} {_STATUS.get(state, state)}" for name, state in result["checks"].items())
    )
    for finding in result["findings"]:
        if finding["status"] != "ok":
            console.print(
                f"  {_STATUS[finding['status']]} {finding['check']}: {finding['message']}", highlight=False
            )
    _models_inspect({"source": result["path"], "model": result["model"]}, console)
    load = result.get("load_check")
    if load:
        buffers = ", ".join(f"{kind} {name} {mib:.2f} MiB" for kind, per in load["buffers_mib"].items()
                            for name, mib in per.items())  # fmt: skip
        console.print(
            f"  load check (-c {load['context']}): {'loaded' if load['loaded'] else 'failed'}; {buffers}"
        )


def _models_inspect(result: dict[str, Any], console: Console) -> None:
    model = result["model"]
    layers = model["layers"]
    remote = (f" (header only: {result['bytes_fetched']} bytes in {result['requests']} range requests)"
              if result.get("remote") else "")  # fmt: skip
    table = Table(title=f"{result['source']}{remote}", show_header=False)
    table.add_row("architecture", f"{model['architecture']} ({model['name'] or '-'})")
    table.add_row("parameters", f"{model['parameters_human']} ({model['bits_per_weight']} bits/weight)")
    table.add_row("layers", f"{layers['block_count']}: {layers['attention']} attention, {layers['recurrent']} "
                  f"recurrent, {layers['mtp']} MTP")  # fmt: skip
    table.add_row("context", str(model["context_length"]))
    table.add_row("file type", f"{model['file_type'] or '-'} (most tensors {model['dominant_type'] or '-'})")
    table.add_row("quant mix", ", ".join(f"{name} {entry['count']}x {entry['bytes'] / 2**20:.1f} MiB"
                                         for name, entry in model["quant_histogram"].items()))  # fmt: skip
    table.add_row("size", f"{model['file_size'] / 2**20:.1f} MiB (header {model['header_bytes']} bytes)")
    tokenizer = model["tokenizer"]
    table.add_row("tokenizer", f"{tokenizer['model'] or '-'} / {tokenizer['pre'] or '-'}, "
                  f"{tokenizer['vocab_size']} tokens")  # fmt: skip
    template = model["chat_template"]
    table.add_row("chat template", f"{template['bytes']} bytes" if template["present"] else "none")
    console.print(table)


def _p50_p95(dist: dict[str, float] | None, digits: int = 1) -> str:
    return f"{dist['p50']:.{digits}f} / {dist['p95']:.{digits}f}" if dist else "-"


def _smoke(result: dict[str, Any], console: Console) -> None:
    verdict = result["verdict"]
    state = "[green]PASS[/green]" if verdict["passed"] else "[red]FAIL[/red]"
    console.print(f"{state} smoke run {result['run_id']} ({result['wall_s']:.1f} s): build {result['build']['key']}, "
                  f"model {result['model']['label']}")  # fmt: skip
    if result.get("bench"):
        table = Table("llama-bench", "t/s", "stddev", title=f"build {result['bench']['build_commit']}")
        for test in result["bench"]["tests"]:
            table.add_row(test["name"], f"{test['avg_ts']:.1f}", f"{test['stddev_ts']:.1f}")
        console.print(table)
    if result.get("server"):
        table = Table("c", "requests", "TTFT p50/p95 ms", "ITL p50/p95 ms", "decode t/s", "aggregate t/s",
                      "e2e p50 ms", "client/server", title="llama-server streaming")  # fmt: skip
        for level in result["server"]["levels"]:
            ratio = level["cross_check"]["client_over_server_decode"]
            table.add_row(str(level["concurrency"]), f"{level['requests']} ({len(level['errors'])} failed)",
                          _p50_p95(level["ttft_ms"]), _p50_p95(level["itl_ms"], 2),
                          f"{level['decode_tps']['p50']:.1f}" if level["decode_tps"] else "-",
                          f"{level['aggregate_tps']:.1f}" if level["aggregate_tps"] else "-",
                          f"{level['e2e_ms']['p50']:.0f}" if level["e2e_ms"] else "-",
                          f"{ratio['p50']:.3f}" if ratio else "-")  # fmt: skip
        console.print(table)
    roof = result.get("roofline") or {}
    if roof.get("efficiency") is not None:
        console.print(f"roofline (estimated): {roof['efficiency'] * 100:.1f} % of {roof['roof_tps']:.0f} t/s "
                      f"({roof['bandwidth_gbs']:.1f} GB/s {roof['bandwidth_source']}; "
                      f"{roof['bytes_per_token'] / 2**20:.1f} MiB/token)", highlight=False)  # fmt: skip
    elif roof.get("error"):
        console.print(f"roofline: not computed ({roof['error']})", highlight=False)
    table = Table("check", "status", "value", "threshold", "source")
    for check in verdict["checks"]:
        status = {"pass": "ok", "fail": "fail", "skipped": "warn"}[check["status"]]
        raw = check["value"]
        value = f"{raw:.1f}" if isinstance(raw, float) else " ".join(str(raw).split())
        table.add_row(check["name"], _STATUS[status].replace(status, check["status"]), value[:40],
                      str(check["threshold"])[:40], check["source"])  # fmt: skip
    console.print(table)
    console.print(f"summary: {result['files']['summary.md']}", highlight=False)


def _smoke_compare(result: dict[str, Any], console: Console) -> None:
    console.print(f"A = {result['a']['run_id']}\nB = {result['b']['run_id']}", highlight=False)
    for key in result["differs"]:
        console.print(f"  {key}: {result['a'][key]} -> {result['b'][key]}", highlight=False)
    table = Table("metric", "A", "B", "B/A", "speedup", "better")
    for row in result["rows"]:
        color = {"B": "green", "A": "red"}.get(row["better"], "white")
        table.add_row(f"{row['metric']} ({row['unit']})" if row["unit"] else row["metric"], f"{row['a']:.4g}",
                      f"{row['b']:.4g}", f"{row['ratio']:.3f}" if row["ratio"] is not None else "-",
                      f"[{color}]{row['speedup']:.3f}[/{color}]" if row["speedup"] is not None else "-",
                      row["better"])  # fmt: skip
    console.print(table)
    console.print(f"files: {result['files']['compare.md']}", highlight=False)


def _fit(result: dict[str, Any], console: Console) -> None:
    summary = result.get("summary")
    lines = summary if isinstance(summary, list) else [str(summary)] if summary else []
    for line in lines:
        console.print(line, highlight=False)
    if not lines:
        console.print_json(json.dumps(result, default=str))


_RENDERERS: dict[str, Callable[[dict[str, Any], Console], None]] = {
    "models.fit": _fit,
    "build": _build,
    "builds.list": _builds_list,
    "doctor": _doctor,
    "models.fetch": _models_fetch,
    "models.inspect": _models_inspect,
    "models.lock": _models_lock,
    "models.verify": _models_verify,
    "recipes.list": _recipes_list,
    "smoke": _smoke,
    "smoke.compare": _smoke_compare,
}


def render_human(name: str, result: dict[str, Any], console: Console) -> None:
    """Print ``result`` of operation ``name`` for a person (pretty JSON when there is no table for it)."""
    renderer = _RENDERERS.get(name)
    if renderer:
        renderer(result, console)
    else:
        console.print_json(json.dumps(result, default=str))
