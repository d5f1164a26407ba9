"""Host inventories: ``recipes/hosts/NAME.toml`` (or any path) lists a fleet's hosts in rollout order.

An inventory is a typed, frozen model like the other recipes (unknown keys are refused naming the file and the
field, with "did you mean …?"; the JSON schema is checked in as ``recipes/schema/host-inventory.schema.json``).
Top-level ``user``, ``port`` and ``key_file`` are defaults every ``[[hosts]]`` entry may override; the
inventory's own ``known_hosts`` file (relative paths are relative to the inventory) is read beside the user's
``~/.ssh/known_hosts`` and receives the keys ``--accept-new-host-keys`` records. Each host may name its GPU
(a key of ``recipes/gpus.toml``), which the deploy's fit plan sizes llama-server's flags for, and free-form
``labels``. More per-host fields (an ``rpc_address``) or a ``[topology]`` table are one field each here.

The ``key_file`` and ``known_hosts`` paths an inventory names pass the running front's path policy (like paths
given as arguments) before any host is dialled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import read_toml, recipe_error, suggest
from llamaforge.deploy.hosts.access import DeployHost, key_file_problem
from llamaforge.runners.ssh.connection import SshHost
from llamaforge.runners.ssh.hosts import address_problem, host_identity, user_problem

_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _check_user(value: str | None) -> str | None:
    # What SSH is given: a login name that cannot read as an option ('-…')
    if value is not None and (problem := user_problem(value)):
        raise ValueError(problem)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InventoryHost(_Strict):
    """One host of an inventory."""

    name: str = Field(description="The host's name in --hosts selections and in reports")
    address: str = Field(description="DNS name or IP address sshd listens on")
    user: str | None = Field(None, description="SSH user (default: the inventory's user)")
    # strict: TOML's `true` would otherwise read as port 1
    port: int | None = Field(
        None, ge=1, le=65535, strict=True, description="SSH port (default: the inventory's port)"
    )
    key_file: str | None = Field(
        None, description="Private key file (default: the inventory's, else the agent)"
    )
    gpu: str | None = Field(
        None, description="The host's GPU, a name from recipes/gpus.toml; the fit plan sizes flags for it"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form labels (rack, zone, …)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _HOST_NAME.fullmatch(value):
            raise ValueError("use letters, digits, '.', '_' and '-' (at most 63)")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        # a DNS name or an IP address (an IPv6 one with or without brackets); the port is the port key's
        inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
        head, sep, tail = value.rpartition("]:")
        if (
            head.startswith("[")
            and sep
            and tail.isascii()
            and tail.isdigit()
            and not address_problem(head[1:])
        ):
            raise ValueError(f"{value!r} holds a port: give the address alone and the port as port = N")
        if problem := address_problem(inner):
            raise ValueError(problem.replace("the port apart", "the port as port = N"))
        return inner

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _check_user(value)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str | None) -> str | None:
        if value is not None:
            from llamaforge.serve.gpus import find_gpu

            try:
                find_gpu(value)
            except InvalidOption as error:
                raise ValueError(f"{error.message}; {error.hint}") from None
        return value


class Inventory(_Strict):
    """A fleet: defaults, the inventory's known_hosts file, and its hosts in rollout order."""

    name: str = Field(description="The inventory's name (the file's stem)")
    user: str | None = Field(None, description="SSH user of every host that names none")
    port: int = Field(22, ge=1, le=65535, strict=True, description="SSH port of every host that names none")
    key_file: str | None = Field(None, description="Private key file of every host that names none")
    known_hosts: str | None = Field(
        None,
        description="The fleet's known_hosts file (relative to the inventory); new keys are recorded here",
    )
    hosts: list[InventoryHost] = Field(min_length=1, description="The hosts, in rollout order")

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _check_user(value)

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        names = [host.name for host in self.hosts]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"host names given twice: {', '.join(twice)}")
        first: dict[tuple[str, int], str] = {}
        for host in self.hosts:
            place = host_identity(SshHost(host.address, host.port or self.port))
            if (seen := first.setdefault(place, host.name)) != host.name:
                raise ValueError(
                    f"hosts {seen} and {host.name} are one host ({host.address}, port {place[1]})"
                )
        return self


def inventory_dir() -> Path:
    """Where named inventories live: ``recipes/hosts/``."""
    return data_dir("recipes") / "hosts"


def _resolve(name_or_path: str) -> Path:
    from llamaforge.build.recipes import resolve_named_file

    return resolve_named_file(name_or_path, inventory_dir(), "host inventory")


def load_inventory(name_or_path: str) -> tuple[Inventory, Path]:
    """The inventory ``recipes/hosts/NAME.toml`` or at a path, and the file it came from."""
    path = _resolve(name_or_path)
    data = read_toml(path, "host inventory")
    try:
        return Inventory.model_validate({**data, "name": path.stem}), path
    except ValidationError as error:
        raise recipe_error(
            error,
            what=f"host inventory {path}",
            root=Inventory,
            hint="see recipes/schema/host-inventory.schema.json for the fields",
        ) from None


def _path(text: str | None, base: Path, what: str) -> Path | None:
    """The inventory's path ``text`` (relative to the inventory's directory), checked by the path policy."""
    if text is None:
        return None
    path = Path(text).expanduser()
    path = path if path.is_absolute() else base / path
    check_file_path(what, path.absolute())
    return path


def inventory_hosts(
    name_or_path: str,
    select: str | Sequence[str] | None = None,
    *,
    key_file: Path | None = None,
    known_hosts: Path | None = None,
    check_files: bool = False,
) -> list[DeployHost]:
    """The inventory's hosts in its order (only those named in ``select``, comma-separated, when given); an
    unknown name gets "did you mean"; ``key_file`` / ``known_hosts`` replace the inventory's when given. With
    ``check_files`` (before hosts are dialled) the inventory's key files must be readable files and its
    known_hosts no directory, as ``--ssh-key`` and ``--known-hosts`` must."""
    inventory, path = load_inventory(name_or_path)
    chosen = inventory.hosts
    if select:
        wanted = [
            part.strip()
            for item in ([select] if isinstance(select, str) else select)
            for part in item.split(",")
            if part.strip()
        ]
        names = [host.name for host in inventory.hosts]
        if not wanted:
            # ' , ' selected none of them, and the deploy went on with no host at all
            given = select if isinstance(select, str) else ",".join(select)
            raise InvalidOption(
                f"--hosts {given!r} names no host of the inventory {path}",
                hint="name some of its hosts, comma-separated, or leave --hosts out for all of them: "
                + ", ".join(names),
            )
        for name in wanted:
            if name not in names:
                raise InvalidOption(
                    f"host {name!r} is not in the inventory {path}",
                    hint=suggest(name, names, end=" ") + "its hosts: " + ", ".join(names),
                )
        chosen = [host for host in inventory.hosts if host.name in wanted]
    base = path.parent
    fleet_known = known_hosts or _path(inventory.known_hosts, base, f"host inventory {path}: known_hosts")
    if check_files and fleet_known is not None and fleet_known.is_dir():
        # checked here as --known-hosts is, before any host is dialled
        raise InvalidOption(
            f"host inventory {path}: known_hosts {fleet_known} is a directory",
            hint="name the fleet's known_hosts file (relative to the inventory); it need not exist yet: "
            "new keys are recorded there with --accept-new-host-keys",
        )
    hosts = []
    for host in chosen:
        field = f"hosts[{host.name}].key_file" if host.key_file else "key_file"
        key = key_file or _path(host.key_file or inventory.key_file, base, f"host inventory {path}: {field}")
        if check_files and key_file is None and key is not None and (problem := key_file_problem(key)):
            # ssh only warns about an identity file it cannot read and goes on with the agent's keys
            raise InvalidOption(
                f"host inventory {path}: {field} {key} {problem}",
                hint="name the private key file the host accepts (relative to the inventory), or leave "
                "key_file out to use the SSH agent",
            )
        ssh = SshHost(
            host.address,
            host.port or inventory.port,
            host.user or inventory.user,
            key,
            fleet_known,
            origin=f"the inventory {path}",
        )
        hosts.append(DeployHost(ssh=ssh, name=host.name, gpu=host.gpu, labels=dict(host.labels)))
    return hosts


def inventory_json_schema() -> str:
    """The JSON schema of host inventories, as checked in under ``recipes/schema/``."""
    return json.dumps(Inventory.model_json_schema(), indent=2, sort_keys=True) + "\n"
