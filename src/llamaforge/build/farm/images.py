"""The builder image goes to the engines that lack it: sent by image id from an engine that has it (this
machine's first, then the fleet's), never rebuilt there, so every builder builds in the same image and a build's
key (which holds the image id) is the same whichever builder makes it.

An image is saved once per id to ``$LLAMAFORGE_HOME/images/<id>.tar`` (the archives the docker deploy target
sends; the ones used last stay) and loaded from that file into each engine that needs it; one transfer per image
and engine runs at a time. Only an image no engine has is built, on the builder that needs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import suppress

from llamaforge.build.ccache import RemoteCache
from llamaforge.build.executors.base import Executor
from llamaforge.build.executors.docker import DockerExecutor
from llamaforge.build.farm.builders import Builder
from llamaforge.build.plan import BuildPlan
from llamaforge.core.events import Event, Reporter
from llamaforge.core.paths import home
from llamaforge.runners.engine import EngineConfig, image_id
from llamaforge.runners.image_archive import load_image, saved_image

MIB = 1024 * 1024
KEEP_ARCHIVES = 2  # image archives kept in $LLAMAFORGE_HOME/images, the ones used last (as deploy keeps)


class ImageShipper:
    """Sends builder images between engines (shared by every entry of a matrix; safe from several threads)."""

    def __init__(self, sources: Sequence[tuple[str, EngineConfig]]) -> None:
        self.sources = list(sources)
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.sent: list[dict[str, object]] = []  # one record per transfer: image, from, to, bytes, seconds

    def _lock_for(self, key: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    def find(self, tag: str, *, besides: str) -> tuple[str, EngineConfig, str] | None:
        """(name, engine, image id) of the first source other than ``besides`` that has ``tag``."""
        for name, config in self.sources:
            if name == besides:
                continue
            with suppress(Exception):  # a source that cannot answer is no source
                found = image_id(tag, config)
                if found is not None:
                    return name, config, found
        return None

    def making(self, tag: str) -> threading.Lock:
        """The lock held while ``tag`` is built on one engine."""
        return self._lock_for(f"make:{tag}")

    def ensure(self, tag: str, target_name: str, target: EngineConfig, reporter: Reporter) -> str | None:
        """The id of ``tag`` on ``target`` once it is there: found, or sent from a source that has it; None
        when no source has it (the caller builds it)."""
        with self._lock_for(f"load:{target_name}:{tag}"):
            existing = image_id(tag, target)
            if existing is not None:
                return existing
            found = self.find(tag, besides=target_name)
            if found is None:
                return None
            source_name, source, image = found
            started = time.monotonic()
            archive = saved_image(image, home() / "images", keep=KEEP_ARCHIVES, config=source)
            size = archive.stat().st_size
            reporter(
                Event(
                    "stage",
                    f"sending the builder image {tag} ({image[:19]}, {size / MIB:.0f} MiB) from {source_name} to "
                    f"{target_name}",
                    stage="image",
                )
            )
            load_image(archive, tag, image, target)
            seconds = time.monotonic() - started
            self.sent.append(
                {
                    "image": image,
                    "tag": tag,
                    "from": source_name,
                    "to": target_name,
                    "bytes": size,
                    "seconds": seconds,
                }
            )
            reporter(Event("info", f"{target_name} has {tag} now ({seconds:.1f} s)", stage="image"))
            return image


class FleetDockerExecutor(DockerExecutor):
    """A DockerExecutor on a fleet builder's engine whose builder image, when the engine lacks it, is sent from
    another engine that has it; only an image no engine has is built (here)."""

    def __init__(
        self,
        engine: EngineConfig,
        *,
        builder: str,
        shipper: ImageShipper,
        remote_cache: RemoteCache | None = None,
    ) -> None:
        super().__init__(engine, remote_cache)
        self.builder = builder
        self.shipper = shipper

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """The builder image's id on this engine: there already, sent from another engine, or built here."""
        image = plan.environment.image
        if image is None:
            return super().prepare_environment(plan, reporter)
        sent = self.shipper.ensure(image.tag, self.builder, self.engine, reporter)
        if sent is not None:
            return sent
        # No engine has it: one builder builds it, the others wait and are sent that image.
        with self.shipper.making(image.tag):
            sent = self.shipper.ensure(image.tag, self.builder, self.engine, reporter)
            return sent or super().prepare_environment(plan, reporter)


def sending_executor(
    builder: Builder, shipper: ImageShipper | None = None, remote_cache: RemoteCache | None = None
) -> Executor:
    """The executor a build on ``builder`` uses: on an engine, one that is sent the builder image by ``shipper``
    (default: from this machine's engine) when the engine lacks it, with the fleet's shared compiler cache; on a
    build host, the SSH executor."""
    if builder.engine is None:
        return builder.executor()
    shipper = shipper or ImageShipper([("this machine", EngineConfig())])
    return FleetDockerExecutor(
        builder.engine_config(), builder=builder.name, shipper=shipper, remote_cache=remote_cache
    )
