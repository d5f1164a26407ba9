"""What a call may run on this host and which hosts a destructive call may reach.

A build runs on this host when its executor is not Docker (``local``, ``ssh`` to a build host the caller names),
and what a build runs is chosen by its recipe, its patch series and a manifest it repeats. Over MCP the caller may
be steered by text it read, so those parameters are refused unless the person who started the server allowed host
builds (``--allow-host-builds``); with that flag the call is destructive (a person confirms it). The parameters
are declared once, in :data:`HOST_RUN`, by operation and field: ``test_mcp_security`` fails when an operation
gains an ``executor``, ``build_host`` or ``from_manifest`` field this table does not name.

Destructive calls that reach hosts (deploy, rollback, topology) may be limited to the hosts and inventories named
on the server's command line (``--allow-deploy-host``, ``--allow-inventory``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import PolicyRefused
from llamaforge.core.paths import data_dir
from llamaforge.core.registry import Operation
from llamaforge.runners.ssh.hosts import canonical_host, parse_host

# A rule says why a value makes the call run something on this host, or None when it does not.
Rule = Callable[[Any, "Places"], str | None]


@dataclass(frozen=True)
class Places:
    """Where recipes, series and matrices a build may use without --allow-host-builds live."""

    project_dir: Path

    def trusted(self) -> tuple[Path, ...]:
        """The project directory and the shipped recipes and patches, resolved."""
        return tuple(path.resolve() for path in (self.project_dir, data_dir("recipes"), data_dir("patches")))


def _executor(value: Any, places: Places) -> str | None:
    if value in (None, "", "docker"):
        return None
    return f"executor={value!r} builds outside Docker (on this host or a build host)"


def _given(what: str) -> Rule:
    def rule(value: Any, places: Places) -> str | None:
        return f"{what}" if value not in (None, "", False) else None

    return rule


def _shipped_or_project(kind: str) -> Rule:
    """A name (looked up among the shipped files) or a path inside the project or the shipped directories."""

    def rule(value: Any, places: Places) -> str | None:
        if not isinstance(value, str) or not value:
            return None
        if "/" not in value and "\\" not in value and not value.endswith(".toml") and value not in (".", "~"):
            return None  # a shipped name
        path = Path(value).expanduser().resolve()
        if any(path == root or path.is_relative_to(root) for root in places.trusted()):
            return None
        return f"{kind} {value!r} is neither shipped nor inside the project directory ({places.project_dir})"

    return rule


HOST_RUN: Mapping[str, Mapping[str, Rule]] = {
    "build": {
        "executor": _executor,
        "build_host": _given("build_host names a machine to build on"),
        "accept_new_host_keys": _given("accept_new_host_keys records a build host's key"),
        "from_manifest": _given("from_manifest repeats whatever build a manifest file describes"),
        # The builder then joins the host network, takes compiled objects from that server and publishes the
        # build under its usual key, and a file is sent there as the cache's password.
        "ccache_remote": _given("ccache_remote makes the build take compiled objects from a cache server"),
        "ccache_password_file": _given("ccache_password_file sends a file to a cache server as its password"),
        "recipe": _shipped_or_project("recipe"),
        "patches": _shipped_or_project("patch series"),
        "matrix": _shipped_or_project("matrix"),
    },
    "smoke": {"executor": _executor},
    "smoke.cpu_modules": {"executor": _executor},
    "upgrade": {"executor": _executor, "recipe": _shipped_or_project("recipe")},
}
"""Operation -> field -> rule. A field in this table that a call sets so that its rule answers makes the call a
host build."""

# Fields that always lead to a host build; an operation with one must be in HOST_RUN.
HOST_RUN_FIELDS = frozenset({"executor", "build_host", "from_manifest"})


def host_runs(op: Operation, arguments: Mapping[str, Any], places: Places) -> list[str]:
    """Why this call would run something on this host (empty: it would not). A dry run only plans."""
    if arguments.get("dry_run") is True:
        return []
    rules = HOST_RUN.get(op.name, {})
    return [reason for name, rule in rules.items() if (reason := rule(arguments.get(name), places))]


def refuse_host_runs(tool: str, reasons: list[str]) -> None:
    """Raise naming every reason and the flag that allows host builds."""
    raise PolicyRefused(
        f"{tool} is refused: " + "; ".join(reasons),
        hint="builds over MCP run in Docker from the shipped or the project's recipes and patch series; the "
        "person who starts the server allows more with --allow-host-builds (each such call is then confirmed)",
    )


# --- deploy targets --------------------------------------------------------------------------------------------

# Fields that name hosts directly (user@host:port, comma-separated), and fields naming a file of hosts.
_HOST_FIELDS = ("hosts", "head", "rpc_workers", "single_host")
_HOST_FILE_FIELDS = ("inventory", "topology")


def _host_names(text: str) -> list[str]:
    """The hosts ``text`` names, parsed as the deploy parses them (``user@[v6]:port`` too), in one spelling; a
    part the deploy would refuse stays as written, which no allowed name matches."""
    names = []
    for part in filter(None, (item.strip() for item in text.split(","))):
        try:
            names.append(canonical_host(parse_host(part).host))
        except InvalidOption:
            names.append(part)
    return names


@dataclass(frozen=True)
class DeployTargets:
    """The hosts and inventory files destructive calls may name; both empty: any."""

    hosts: frozenset[str] = frozenset()
    inventories: tuple[Path, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str], inventories: Iterable[Path]) -> DeployTargets:
        """From the command line's values (inventories resolved now, against the server's directory)."""
        return cls(
            frozenset(canonical_host(host.strip("[]")) for host in hosts),
            tuple(Path(path).expanduser().resolve() for path in inventories),
        )

    @property
    def limited(self) -> bool:
        """Whether the server was started with a list."""
        return bool(self.hosts or self.inventories)

    def check(self, tool: str, op: Operation, arguments: Mapping[str, Any]) -> None:
        """Refuse a destructive call that names a host or an inventory not on the lists."""
        if not (self.limited and op.destructive):
            return
        hint = (
            "the server was started with --allow-deploy-host / --allow-inventory; destructive calls may only "
            "target those (the person who starts the server adds more)"
        )
        inventory_given = any(arguments.get(name) for name in _HOST_FILE_FIELDS)
        for name in _HOST_FILE_FIELDS:
            value = arguments.get(name)
            if value and Path(value).expanduser().resolve() not in self.inventories:
                allowed = ", ".join(str(path) for path in self.inventories) or "none"
                raise PolicyRefused(
                    f"{tool} is refused: {name} {value!r} is not an inventory this server allows ({allowed})",
                    hint=hint,
                )
        for name in _HOST_FIELDS:
            value = arguments.get(name)
            if not isinstance(value, str) or not value or (name == "hosts" and inventory_given):
                continue  # with an inventory, --hosts picks among its hosts by name
            refused = [host for host in _host_names(value) if host not in self.hosts]
            if refused:
                allowed = ", ".join(sorted(self.hosts)) or "none"
                raise PolicyRefused(
                    f"{tool} is refused: {name} names {', '.join(refused)}, not a host this server allows "
                    f"({allowed})",
                    hint=hint,
                )
