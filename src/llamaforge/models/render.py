"""How the model operations' results look: rich output for the CLI, HTML for notebooks (registered with each
operation in :mod:`llamaforge.models.ops_fetch` and :mod:`llamaforge.models.ops_verify`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from llamaforge.core.views import html
from llamaforge.core.views.console import STATUS


def models_fetch_cli(result: dict[str, Any], console: Console) -> None:
    """``models.fetch`` for a person."""
    state = "[green]cached[/green]" if result["cached"] else "[green]downloaded[/green]"
    pin = f" @ {result['commit']}" if result.get("commit") else ""
    console.print(
        f"{state} {result['source']}{pin}\n  {result['path']}\n  {result['size']} bytes, sha256 {result['sha256']}"
    )


def models_lock_cli(result: dict[str, Any], console: Console) -> None:
    """``models.lock`` as a table of inputs."""
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


def models_verify_cli(result: dict[str, Any], console: Console) -> None:
    """``models.verify``: the verdict, the findings, the model."""
    verdict = "[green]ok[/green]" if result["ok"] else "[red]FAILED[/red]"
    cached = " (cached verdict)" if result["cached"] else ""
    console.print(f"{verdict} {result['path']}{cached}\n  {result['size']} bytes, sha256 {result['sha256']}")
    console.print(
        "  " + "  ".join(f"{name} {STATUS.get(state, state)}" for name, state in result["checks"].items())
    )
    for finding in result["findings"]:
        if finding["status"] != "ok":
            console.print(
                f"  {STATUS[finding['status']]} {finding['check']}: {finding['message']}", highlight=False
            )
    models_inspect_cli({"source": result["path"], "model": result["model"]}, console)
    load = result.get("load_check")
    if load:
        buffers = ", ".join(
            f"{kind} {name} {mib:.2f} MiB"
            for kind, per in load["buffers_mib"].items()
            for name, mib in per.items()
        )
        console.print(
            f"  load check (-c {load['context']}): {'loaded' if load['loaded'] else 'failed'}; {buffers}"
        )


def models_inspect_cli(result: dict[str, Any], console: Console) -> None:
    """``models.inspect`` as a table."""
    model = result["model"]
    layers = model["layers"]
    remote = (
        f" (header only: {result['bytes_fetched']} bytes in {result['requests']} range requests)"
        if result.get("remote")
        else ""
    )
    table = Table(title=f"{result['source']}{remote}", show_header=False)
    table.add_row("architecture", f"{model['architecture']} ({model['name'] or '-'})")
    table.add_row("parameters", _parameters(model))
    table.add_row(
        "layers",
        f"{layers['block_count']}: {layers['attention']} attention, {layers['recurrent']} "
        f"recurrent, {layers['mtp']} MTP",
    )
    table.add_row("context", str(model["context_length"]))
    table.add_row("file type", f"{model['file_type'] or '-'} (most bytes {model['dominant_type'] or '-'})")
    table.add_row(
        "quant mix",
        ", ".join(
            f"{name} {entry['count']}x {entry['bytes'] / 2**20:.1f} MiB"
            for name, entry in model["quant_histogram"].items()
        )
        or "-",
    )
    table.add_row("size", f"{model['file_size'] / 2**20:.1f} MiB (header {model['header_bytes']} bytes)")
    tokenizer = model["tokenizer"]
    table.add_row(
        "tokenizer",
        f"{tokenizer['model'] or '-'} / {tokenizer['pre'] or '-'}, {tokenizer['vocab_size']} tokens",
    )
    template = model["chat_template"]
    table.add_row("chat template", f"{template['bytes']} bytes" if template["present"] else "none")
    console.print(table)


def _parameters(model: dict[str, Any]) -> str:
    """``1.23 B (4.85 bits/weight)``, or what a file without tensors is."""
    if model.get("vocab_only") or model.get("tensor_count") == 0:
        return "none: vocab-only (no tensors, a vocabulary file that cannot be served)"
    return f"{model.get('parameters_human', '-')} ({model.get('bits_per_weight', '-')} bits/weight)"


def _model_rows(model: dict[str, Any]) -> list[tuple[str, Any]]:
    layers = model.get("layers") or {}
    tokenizer = model.get("tokenizer") or {}
    template = model.get("chat_template") or {}
    histogram = model.get("quant_histogram") or {}
    return [
        ("architecture", f"{model.get('architecture')} ({model.get('name') or '-'})"),
        ("parameters", _parameters(model)),
        (
            "layers",
            f"{layers.get('block_count', '-')}: {layers.get('attention', '-')} attention, "
            f"{layers.get('recurrent', '-')} recurrent, {layers.get('mtp', '-')} MTP",
        ),
        ("context", model.get("context_length")),
        ("file type", f"{model.get('file_type') or '-'} (most bytes {model.get('dominant_type') or '-'})"),
        (
            "quant mix",
            ", ".join(
                f"{name} {entry.get('count')}x {html.mib(entry.get('bytes'))}"
                for name, entry in histogram.items()
            )
            or "-",
        ),
        ("size", html.mib(model.get("file_size"))),
        (
            "tokenizer",
            f"{tokenizer.get('model') or '-'} / {tokenizer.get('pre') or '-'}, "
            f"{tokenizer.get('vocab_size', '-')} tokens",
        ),
        ("chat template", f"{template.get('bytes')} bytes" if template.get("present") else "none"),
    ]


def models_inspect_html(data: dict[str, Any]) -> str:
    """``models.inspect`` in a notebook."""
    remote = " (header only, over HTTP range requests)" if data.get("remote") else ""
    return html.section(
        f"model {data.get('source', '')}{remote}", html.kv_table(_model_rows(data.get("model") or {}))
    )


def models_verify_html(data: dict[str, Any]) -> str:
    """``models.verify`` in a notebook."""
    checks = data.get("checks") or {}
    rows = [
        ("verdict", html.badge("ok" if data.get("ok") else "fail")),
        ("path", data.get("path")),
        ("size", data.get("size")),
        ("sha256", data.get("sha256")),
        ("cached verdict", data.get("cached")),
        (
            "checks",
            html.Raw(" ".join(f"{html.escape(name)} {html.badge(state)}" for name, state in checks.items())),
        ),
    ]
    findings = [f for f in data.get("findings") or [] if f.get("status") != "ok"]
    body = html.kv_table(rows)
    if findings:
        body += html.table(
            ["status", "check", "message"],
            [(html.badge(f["status"]), f.get("check"), f.get("message")) for f in findings],
        )
    if data.get("model"):
        body += html.kv_table(_model_rows(data["model"]))
    load = data.get("load_check")
    if load:
        body += html.table(
            ["buffer", "device", "MiB"],
            [
                (kind, name, f"{mib:.2f}")
                for kind, per in (load.get("buffers_mib") or {}).items()
                for name, mib in per.items()
            ],
        )
    return html.section("model verification", body)


def models_fetch_html(data: dict[str, Any]) -> str:
    """``models.fetch`` in a notebook."""
    rows = [
        ("result", "cached" if data.get("cached") else "downloaded"),
        ("source", data.get("source")),
        ("commit", data.get("commit")),
        ("path", data.get("path")),
        ("size", data.get("size")),
        ("sha256", data.get("sha256")),
    ]
    return html.section("model fetch", html.kv_table(rows))
