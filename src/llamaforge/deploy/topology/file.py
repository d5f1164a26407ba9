"""A topology in a TOML file (``--topology FILE``): the head and its RPC workers, instead of the list options.

```toml
[topology]
head = "lf@gpu1:22"
rpc_port = 50052            # optional
[[topology.workers]]
host = "lf@gpu2:22"
rpc_address = "10.0.0.2"    # the private address its RPC server binds
memory = "24GiB"            # optional: its device memory for the split
```

Kept to its own ``[topology]`` table so it can sit in a host inventory file beside other tables; unknown keys
inside it are refused with the file, the field and "did you mean".
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamaforge.core.errors import InvalidOption
from llamaforge.core.validation import recipe_error
from llamaforge.serve.launcher import DEFAULT_RPC_PORT


class WorkerEntry(BaseModel):
    """One ``[[topology.workers]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="user@host:port for SSH")
    rpc_address: str = Field(description="The private address its RPC server binds")
    memory: str | None = Field(None, description="Its device memory, e.g. 24GiB")


class TopologyEntry(BaseModel):
    """The ``[topology]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head: str
    rpc_port: int = Field(DEFAULT_RPC_PORT, ge=1, le=65535)
    workers: list[WorkerEntry] = Field(min_length=1)


class TopologyFile(BaseModel):
    """A file with a ``[topology]`` table (other tables belong to the inventory and are left alone)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    topology: TopologyEntry


def load_topology(path: Path) -> TopologyEntry:
    """The ``[topology]`` table of ``path``; RecipeError naming the file and field when it is not valid."""
    try:
        is_file = path.is_file()
    except OSError as error:  # read in the parameters' own validation, before their path checks
        raise InvalidOption(
            f"topology file: {error.strerror or error} ({len(str(path))} characters)",
            hint="give the TOML file with the [topology] table (head, rpc_port, [[topology.workers]])",
        ) from None
    if not is_file:
        raise InvalidOption(
            f"topology file {path} is a directory"
            if path.is_dir()
            else f"topology file {path} does not exist",
            hint="give the TOML file with the [topology] table (head, rpc_port, [[topology.workers]])",
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark as in read_toml
    except tomllib.TOMLDecodeError as error:
        raise InvalidOption(
            f"topology file {path} is not valid TOML: {error}", hint="fix the syntax"
        ) from None
    except UnicodeDecodeError as error:
        raise InvalidOption(
            f"topology file {path} is not UTF-8 text (byte {error.start}: {error.reason})",
            hint="a TOML file is UTF-8 text: save it as such, or give the right file",
        ) from None
    try:
        return TopologyFile.model_validate(data).topology
    except ValidationError as error:
        raise recipe_error(
            error,
            what=f"topology file {path}",
            root=TopologyFile,
            hint="see docs: [topology] head, rpc_port, [[topology.workers]]",
        ) from None


def topology_options(entry: TopologyEntry) -> dict[str, str | int | None]:
    """The file's topology as the list options (``head``, ``rpc_workers``, ``rpc_addresses``, ``rpc_port``,
    ``worker_memory``)."""
    memory = [worker.memory for worker in entry.workers]
    if any(memory) and not all(memory):
        raise InvalidOption("give every worker's memory in the topology file, or none")
    return {
        "head": entry.head,
        "rpc_workers": ",".join(worker.host for worker in entry.workers),
        "rpc_addresses": ",".join(worker.rpc_address for worker in entry.workers),
        "rpc_port": entry.rpc_port,
        "worker_memory": ",".join(m for m in memory if m) or None,
    }
