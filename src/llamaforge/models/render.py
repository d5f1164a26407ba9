"""How the model operations' results look: rich output for the CLI, HTML for notebooks (registered with each
operation in :mod:`llamaforge.models.ops_fetch`, :mod:`llamaforge.models.ops_verify` and
:mod:`llamaforge.models.ops_fit`; the fit plan's chart is :mod:`llamaforge.serve.fit_chart`). Each takes the
operation's typed result, so a renamed field is a type error here, not a view that silently shows less."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from llamaforge.core.views import html
from llamaforge.core.views.console import STATUS
from llamaforge.serve.fit_chart import CATEGORIES, GiB, fit_chart_png

if TYPE_CHECKING:  # showing one operation's result imports no other operation's module
    from llamaforge.models.ops_fetch import ModelFetchResult, ModelLockResult
    from llamaforge.models.ops_fit import ModelFitResult
    from llamaforge.models.ops_verify import ModelInspectResult, ModelVerifyResult


def models_fetch_cli(result: ModelFetchResult, console: Console) -> None:
    """``models.fetch`` for a person."""
    state = "[green]cached[/green]" if result.cached else "[green]fetched[/green]"
    pin = f" @ {result.commit}" if result.commit else ""
    console.print(
        f"{state} {result.source}{pin}\n  {result.path}\n  {result.size} bytes, sha256 {result.sha256}"
    )


def models_lock_cli(result: ModelLockResult, console: Console) -> None:
    """``models.lock`` as a table of inputs."""
    table = Table("input", "status", "pin / reason")
    for item in result.locked:
        pin = item.get("digest") or f"{item.get('revision') or '-'} sha256:{item['sha256'][:16]}…"
        table.add_row(f"{item['kind']} {item['name']}", "[green]locked[/green]", pin)
    for name in result.pinned:
        table.add_row(f"model {name}", "[green]pinned[/green]", "pinned by the recipe or the lock")
    for item in result.skipped:
        table.add_row(f"{item['kind']} {item['name']}", "skipped", item["reason"])
    for item in result.unresolved:
        table.add_row(
            f"{item['kind']} {item['name']}", "[red]unresolved[/red]", f"{item['reason']} ({item['hint']})"
        )
    console.print(table)
    console.print(f"lock file: {result.lock_file}" + ("" if result.written else " (unchanged)"))


def models_verify_cli(result: ModelVerifyResult, console: Console) -> None:
    """``models.verify``: the verdict, the findings, the model."""
    verdict = "[green]ok[/green]" if result.ok else "[red]FAILED[/red]"
    cached = " (cached verdict)" if result.cached else ""
    console.print(f"{verdict} {result.path}{cached}\n  {result.size} bytes, sha256 {result.sha256}")
    console.print(
        "  " + "  ".join(f"{name} {STATUS.get(state, state)}" for name, state in result.checks.items())
    )
    for finding in result.findings:
        if finding.status != "ok":
            console.print(f"  {STATUS[finding.status]} {finding.check}: {finding.message}", highlight=False)
    _model_table(result.path, result.model, console)
    load = result.load_check
    if load:
        buffers = ", ".join(
            f"{kind} {name} {mib:.2f} MiB"
            for kind, per in load["buffers_mib"].items()
            for name, mib in per.items()
        )
        console.print(
            f"  load check (-c {load['context']}): {'loaded' if load['loaded'] else 'failed'}; {buffers}"
        )


def models_inspect_cli(result: ModelInspectResult, console: Console) -> None:
    """``models.inspect`` as a table."""
    remote = (
        f" (header only: {result.bytes_fetched} bytes in {result.requests} range requests)"
        if result.remote
        else ""
    )
    _model_table(f"{result.source}{remote}", result.model, console)


def _model_table(title: str, model: dict[str, Any], console: Console) -> None:
    """What a model's header says (``models.inspect``'s summary), as a table."""
    table = Table(title=title, show_header=False)
    size = f"{model['file_size'] / 2**20:.1f} MiB (header {model['header_bytes']} bytes)"
    for name, value in _model_rows(model):
        table.add_row(name, size if name == "size" else str(value))
    console.print(table)


def _parameters(model: dict[str, Any]) -> str:
    """``1.23 B (4.85 bits/weight)``, or what a file without tensors is."""
    if model.get("vocab_only") or model.get("tensor_count") == 0:
        return "none: vocab-only (no tensors, a vocabulary file that cannot be served)"
    return f"{model.get('parameters_human', '-')} ({model.get('bits_per_weight', '-')} bits/weight)"


def _shown(value: Any) -> str:
    """A header value as shown: ``-`` for one the header does not give (or gives as the wrong type)."""
    return "-" if value is None else str(value)


def _model_rows(model: dict[str, Any]) -> list[tuple[str, Any]]:
    layers = model.get("layers") or {}
    tokenizer = model.get("tokenizer") or {}
    template = model.get("chat_template") or {}
    histogram = model.get("quant_histogram") or {}
    return [
        ("architecture", f"{_shown(model.get('architecture'))} ({model.get('name') or '-'})"),
        ("parameters", _parameters(model)),
        (
            "layers",
            f"{_shown(layers.get('block_count'))}: {_shown(layers.get('attention'))} attention, "
            f"{_shown(layers.get('recurrent'))} recurrent, {_shown(layers.get('mtp'))} MTP",
        ),
        ("context", _shown(model.get("context_length"))),
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
            f"{_shown(tokenizer.get('vocab_size'))} tokens",
        ),
        ("chat template", f"{_shown(template.get('bytes'))} bytes" if template.get("present") else "none"),
    ]


def models_inspect_html(data: ModelInspectResult) -> str:
    """``models.inspect`` in a notebook."""
    remote = " (header only, over HTTP range requests)" if data.remote else ""
    return html.section(f"model {data.source}{remote}", html.kv_table(_model_rows(data.model)))


def models_verify_html(data: ModelVerifyResult) -> str:
    """``models.verify`` in a notebook."""
    rows = [
        ("verdict", html.badge("ok" if data.ok else "fail")),
        ("path", data.path),
        ("size", data.size),
        ("sha256", data.sha256),
        ("cached verdict", data.cached),
        (
            "checks",
            html.Raw(
                " ".join(f"{html.escape(name)} {html.badge(state)}" for name, state in data.checks.items())
            ),
        ),
    ]
    findings = [f for f in data.findings if f.status != "ok"]
    body = html.kv_table(rows)
    if findings:
        body += html.table(
            ["status", "check", "message"], [(html.badge(f.status), f.check, f.message) for f in findings]
        )
    if data.model:
        body += html.kv_table(_model_rows(data.model))
    load = data.load_check
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


def models_fetch_html(data: ModelFetchResult) -> str:
    """``models.fetch`` in a notebook."""
    rows = [
        ("result", "cached" if data.cached else "downloaded"),
        ("source", data.source),
        ("commit", data.commit),
        ("path", data.path),
        ("size", data.size),
        ("sha256", data.sha256),
    ]
    return html.section("model fetch", html.kv_table(rows))


def models_fit_cli(result: ModelFitResult, console: Console) -> None:
    """``models.fit``: its summary lines."""
    for line in result.summary:
        console.print(line, highlight=False)
    if not result.summary:
        console.print_json(result.model_dump_json(by_alias=True))


def models_fit_html(data: ModelFitResult) -> str:
    """``models.fit`` in a notebook: placement, memory table, chart."""
    body = ""
    if data.summary:
        body += "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in data.summary) + "</ul>"
    gpu, host = data.gpu_memory.model_dump(), data.host_memory.model_dump()
    body += html.table(
        ["memory (GiB)", "GPU", "host RAM"],
        [
            (name, f"{gpu[c] / GiB:.3f}", f"{host[c] / GiB:.3f}")
            for c, (name, _colour) in [*CATEGORIES.items(), ("total", ("total", ""))]
        ],
    )
    placement = [
        ("-ngl", f"{data.n_gpu_layers} of {data.max_gpu_layers}"),
        ("--n-cpu-moe", data.n_cpu_moe),
        ("VRAM", f"{data.vram_bytes / GiB:.1f} GiB"),
        ("command", html.Raw(f"<code>{html.escape(data.command)}</code>")),
    ]
    if data.tg_ceiling_tps is not None:
        placement.append(("token generation ceiling", f"~{data.tg_ceiling_tps:.0f} tok/s"))
    body += html.kv_table(placement)
    chart = html.png_file(data.plot, "memory breakdown")
    if not chart:
        chart = html.img_png(fit_chart_png([data.model_dump(mode="json")]), "memory breakdown")
    return html.section("fit plan", body + chart)
