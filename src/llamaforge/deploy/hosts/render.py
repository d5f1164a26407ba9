"""The deploy results for a person: one table row per host (``--json`` keeps the whole result). Each renderer
takes the operation's typed result, so a renamed field is a type error here, not a view that silently shows
less."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # showing one operation's result imports no other operation's module
    from rich.console import Console
    from rich.table import Table

    from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult, SwarmReport

_COLOURS = {
    "updated": "green",
    "unchanged": "green",
    "rolled back": "yellow",
    "interrupted": "yellow",
    "untouched": "dim",
    "failed": "red",
    "unreachable": "red",
}


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", highlight=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f}"


def _swarm(swarm: SwarmReport, console: Console) -> None:
    """A Swarm service: Swarm's update verdict and one row per replica slot."""
    rows = [
        [
            str(task.slot),
            task.task,
            task.node,
            task.state,
            task.release or "-",
            "-" if task.healthy is None else "yes" if task.healthy else "[red]no[/]",
            task.last_failure,
        ]
        for task in swarm.tasks
    ]
    if swarm.probes:
        probes = [
            [probe.node, "ran" if probe.passed else "[red]refused[/]", probe.detail.splitlines()[0]]
            for probe in swarm.probes
        ]
        seconds = f" ({swarm.probe_s:.1f} s)" if swarm.probe_s is not None else ""
        console.print(
            _table(f"probe of release {swarm.requested}{seconds}", ["node", "probe", "detail"], probes)
        )
    update = swarm.update_state or "never updated"
    title = f"swarm service {swarm.service}: release {swarm.release or '-'}, update {update}"
    console.print(
        _table(title, ["slot", "task", "node", "state", "release", "healthy", "last failure"], rows)
    )
    if swarm.update_message:
        console.print(f"Swarm: {swarm.update_message}", highlight=False)


def rollout_cli(result: DeployResult, console: Console) -> None:
    """``deploy`` and ``deploy.rollback``: each host's outcome, the release it is on and why."""
    if result.swarm is not None:
        _swarm(result.swarm, console)
        console.print("passed" if result.passed else "FAILED", highlight=False)
        return
    rows = []
    for host in result.hosts:
        coloured = f"[{_COLOURS.get(host.status, 'white')}]{host.status}[/]"
        rows.append([host.host, coloured, host.release or "-", _mib(host.sent_bytes), host.detail])
    title = f"{result.name} ({result.target}): release {result.release or 'per host'}"
    console.print(_table(title, ["host", "status", "release", "sent MiB", "detail"], rows))
    for host in result.hosts:
        if host.probe and host.status == "updated":
            console.print(f"{host.host}: probed before the switch: {host.probe}", highlight=False)
        if host.api_key_file:
            console.print(f"{host.host}: API key in {host.api_key_file} (readable by root)", highlight=False)
        if host.logs and host.status != "updated":
            console.print(f"{host.host}: its last log lines:", highlight=False)
            for line in host.logs:
                console.print(f"  {line}", highlight=False, markup=False)
    verdict = "interrupted" if result.interrupted else "passed" if result.passed else "FAILED"
    console.print(f"{verdict} in {result.wall_s:.1f} s", highlight=False)


def plan_cli(result: DeployPlanResult, console: Console) -> None:
    """``deploy.plan``: what would change on each host, with the flags the fit plan chose."""
    rows = []
    for host in result.hosts:
        model = f"send {_mib(host.model_bytes)} MiB" if host.model_upload else "on the host"
        action = host.action if host.reachable else f"[red]unreachable[/] {host.detail}"
        flags = " ".join(host.flags_after) or "(defaults)"
        rows.append([host.host, host.current or "-", host.release, action, model, flags, host.listen])
    title = f"{result.name} ({result.target}): plan"
    console.print(_table(title, ["host", "current", "release", "action", "model", "flags", "listen"], rows))
    for host in result.hosts:
        if host.delivery:
            console.print(f"{host.host}: would send {host.delivery}", highlight=False)
        for line in host.fit:
            console.print(f"{host.host}: {line}", highlight=False)
        if host.probe:
            console.print(f"{host.host}: probed (the release is there): {host.probe}", highlight=False)


def status_cli(result: DeployStatusResult, console: Console) -> None:
    """``deploy.status``: per host its release, service state, health, build, model and flags."""
    if result.swarm is not None:
        _swarm(result.swarm, console)
        return
    rows = []
    for host in result.hosts:
        if not host.reachable:
            rows.append([host.host, "[red]unreachable[/]", "", "", "", "", host.detail])
            continue
        healthy = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[host.healthy]
        rows.append(
            [
                host.host,
                host.current or "-",
                f"{host.active}, {host.crash}" if host.crash else str(host.active),
                healthy,
                (host.build_key or "-")[:12],
                (host.model_sha256 or "-")[:12],
                " ".join(host.flags or []),
            ]
        )
    title = f"{result.name} ({result.target}): status"
    console.print(_table(title, ["host", "current", "service", "healthy", "build", "model", "flags"], rows))
