"""Where a reproducibility check rebuilds when it names another builder (``--check-reproducible --on-builder B
--builders FLEET``): builder B of the fleet, building the way the first build did, in the same builder image
(sent by id from the engine that made the build when B lacks it, never rebuilt there), with ccache off as every
reproducibility rebuild is."""

from __future__ import annotations

from llamaforge.build.executors.base import Executor
from llamaforge.build.executors.docker import DockerExecutor
from llamaforge.build.farm.builders import load_fleet
from llamaforge.build.farm.images import ImageShipper, sending_executor
from llamaforge.core.errors import InvalidOption


def rebuild_executor(fleet: str, name: str, executor: Executor) -> tuple[Executor, str]:
    """The executor of builder ``name`` of ``fleet`` for rebuilding what ``executor`` built, and the builder's
    label for reports; InvalidOption when the fleet has no such builder ("did you mean") or the builder builds
    another way (a Docker engine against a build host: their toolchains would differ, not the builders)."""
    builder = load_fleet(fleet).builder(name)
    rebuild = builder.executor()
    if rebuild.name != executor.name:
        raise InvalidOption(
            f"builder {builder.label()} builds with --executor {rebuild.name}, and this build with --executor "
            f"{executor.name}: their artifacts would differ by their toolchains, not by the builders",
            hint=f"pick a builder of the fleet that builds with --executor {executor.name}",
        )
    if isinstance(executor, DockerExecutor) and builder.engine is not None:
        shipper = ImageShipper([(executor.location(), executor.engine)])
        rebuild = sending_executor(builder, shipper)
    return rebuild, builder.label()
