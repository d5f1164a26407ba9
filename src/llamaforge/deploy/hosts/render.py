"""The deploy results for a person: one table row per host (``--json`` keeps the whole result)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_COLOURS = {
    "updated": "green",
    "unchanged": "green",
    "rolled back": "yellow",
    "interrupted": "yellow",
    "untouched": "dim",
    "failed": "red",
    "unreachable": "red",
}


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", highlight=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _mib(value: Any) -> str:
    return f"{int(value or 0) / 2**20:.1f}"


def _swarm(swarm: dict[str, Any], console: Console) -> None:
    """A Swarm service: Swarm's update verdict and one row per replica slot."""
    rows = [
        [
            str(task.get("slot")),
            str(task.get("task")),
            str(task.get("node")),
            str(task.get("state")),
            str(task.get("release") or "-"),
            {True: "yes", False: "[red]no[/]"}.get(task.get("healthy"), "-"),
            str(task.get("last_failure") or ""),
        ]
        for task in swarm.get("tasks") or []
    ]
    update = swarm.get("update_state") or "never updated"
    title = f"swarm service {swarm.get('service')}: release {swarm.get('release') or '-'}, update {update}"
    console.print(
        _table(title, ["slot", "task", "node", "state", "release", "healthy", "last failure"], rows)
    )
    if swarm.get("update_message"):
        console.print(f"Swarm: {swarm['update_message']}", highlight=False)


def rollout_cli(result: dict[str, Any], console: Console) -> None:
    """``deploy`` and ``deploy.rollback``: each host's outcome, the release it is on and why."""
    if result.get("swarm"):
        _swarm(result["swarm"], console)
        console.print("passed" if result.get("passed") else "FAILED", highlight=False)
        return
    rows = []
    for host in result.get("hosts", []):
        status = str(host.get("status"))
        coloured = f"[{_COLOURS.get(status, 'white')}]{status}[/]"
        rows.append(
            [
                str(host.get("host")),
                coloured,
                str(host.get("release") or "-"),
                _mib(host.get("sent_bytes")),
                str(host.get("detail") or ""),
            ]
        )
    title = f"{result.get('name')} ({result.get('target')}): release {result.get('release') or 'per host'}"
    console.print(_table(title, ["host", "status", "release", "sent MiB", "detail"], rows))
    for host in result.get("hosts", []):
        if host.get("probe") and host.get("status") == "updated":
            console.print(f"{host['host']}: probed before the switch: {host['probe']}", highlight=False)
        if host.get("api_key_file"):
            console.print(
                f"{host['host']}: API key in {host['api_key_file']} (readable by root)", highlight=False
            )
    verdict = "interrupted" if result.get("interrupted") else "passed" if result.get("passed") else "FAILED"
    console.print(f"{verdict} in {float(result.get('wall_s') or 0):.1f} s", highlight=False)


def plan_cli(result: dict[str, Any], console: Console) -> None:
    """``deploy.plan``: what would change on each host, with the flags the fit plan chose."""
    rows = []
    for host in result.get("hosts", []):
        model = f"send {_mib(host.get('model_bytes'))} MiB" if host.get("model_upload") else "on the host"
        action = (
            str(host.get("action")) if host.get("reachable") else f"[red]unreachable[/] {host.get('detail')}"
        )
        flags = " ".join(host.get("flags_after") or []) or "(defaults)"
        rows.append(
            [
                str(host.get("host")),
                str(host.get("current") or "-"),
                str(host.get("release")),
                action,
                model,
                flags,
                str(host.get("listen")),
            ]
        )
    title = f"{result.get('name')} ({result.get('target')}): plan"
    console.print(_table(title, ["host", "current", "release", "action", "model", "flags", "listen"], rows))
    for host in result.get("hosts", []):
        if host.get("delivery"):
            console.print(f"{host['host']}: would send {host['delivery']}", highlight=False)
        for line in host.get("fit") or []:
            console.print(f"{host['host']}: {line}", highlight=False)
        if host.get("probe"):
            console.print(f"{host['host']}: probed (the release is there): {host['probe']}", highlight=False)


def status_cli(result: dict[str, Any], console: Console) -> None:
    """``deploy.status``: per host its release, service state, health, build, model and flags."""
    if result.get("swarm"):
        _swarm(result["swarm"], console)
        return
    rows = []
    for host in result.get("hosts", []):
        if not host.get("reachable"):
            rows.append(
                [str(host.get("host")), "[red]unreachable[/]", "", "", "", "", str(host.get("detail"))]
            )
            continue
        healthy = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[host.get("healthy")]
        rows.append(
            [
                str(host.get("host")),
                str(host.get("current") or "-"),
                str(host.get("active")),
                healthy,
                str(host.get("build_key") or "-")[:12],
                str(host.get("model_sha256") or "-")[:12],
                " ".join(host.get("flags") or []),
            ]
        )
    title = f"{result.get('name')} ({result.get('target')}): status"
    console.print(_table(title, ["host", "current", "service", "healthy", "build", "model", "flags"], rows))
