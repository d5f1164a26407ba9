"""Operation ``builders.status``: what each builder of a fleet offers now (see :mod:`llamaforge.build.farm`)."""

from __future__ import annotations

from pydantic import Field

from llamaforge.core.registry import (
    OperationContext,
    Params,
    Result,
    absent,
    empty_list,
    operation,
    path_field,
)


class BuildersStatusParams(Params):
    """Parameters of ``builders.status``."""

    builders: str = path_field(
        description="Builder fleet: recipes/builders/NAME.toml or a path; NAME:b1,b2 asks only those builders"
    )


class BuilderState(Result):
    """One builder: how it is reached, and what it answered (or why it did not)."""

    name: str
    kind: str = Field(description="engine (a Docker engine) or build-host (SSH)")
    address: str = Field(description="The engine URL or user@host:port")
    platforms: list[str]
    labels: list[str] = Field(default_factory=empty_list)
    concurrency: int
    reachable: bool
    version: str | None = absent("Docker engine version (or 'SSH build host')")
    system: str | None = absent("Operating system and architecture")
    cores: int | None = absent("CPU cores: the fleet's figure, else the probed one")
    cores_probed: bool = False
    memory_gib: float | None = absent("Memory in GiB: the fleet's figure, else the probed one")
    memory_probed: bool = False
    free_disk_gib: float | None = absent("Free disk where the engine keeps images (or in the host's home)")
    images: list[str] = Field(default_factory=empty_list, description="llamaforge images the engine has")
    error: str | None = absent("Why it did not answer")
    hint: str | None = absent("What to do about it")


class BuildersStatusResult(Result):
    """Every builder asked, in the fleet's order."""

    fleet: str
    builders: list[BuilderState]
    reachable: int = Field(description="How many builders answered")


@operation(
    "builders.status",
    BuildersStatusParams,
    read_only=True,
    cli="llamaforge.build.farm.render:builders_status_cli",
    html="llamaforge.build.farm.render:builders_status_html",
)
def builders_status_op(params: BuildersStatusParams, ctx: OperationContext) -> BuildersStatusResult:
    """Probe each builder of a fleet: reachable, engine version, cores, memory, free disk, cached builder images;
    one that does not answer is reported with the reason and the next step."""
    from llamaforge.build.farm.builders import load_fleet
    from llamaforge.build.farm.status import fleet_status

    name, _, chosen = params.builders.partition(":")
    fleet = load_fleet(name)
    states = [
        BuilderState(
            name=facts.builder.name,
            kind=facts.builder.kind,
            address=facts.builder.where,
            platforms=list(facts.builder.platforms),
            labels=list(facts.builder.labels),
            concurrency=facts.builder.concurrency,
            reachable=facts.reachable,
            version=facts.version,
            system=facts.system,
            cores=facts.cores,
            cores_probed=facts.cores_probed,
            memory_gib=facts.memory_gib,
            memory_probed=facts.memory_probed,
            free_disk_gib=facts.free_disk_gib,
            images=facts.images,
            error=facts.error,
            hint=facts.hint,
        )
        for facts in fleet_status(fleet.select(chosen or None))
    ]
    return BuildersStatusResult(
        fleet=fleet.origin, builders=states, reachable=sum(state.reachable for state in states)
    )
