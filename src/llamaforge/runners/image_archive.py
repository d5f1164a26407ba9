"""Image archives that travel between engines: ``docker save`` once per image id into a directory that keeps
only the archives used last, and ``docker load`` from such an archive into another engine. The docker deploy
target sends them to its hosts over SSH; a builder fleet loads them into the engines that lack an image."""

from __future__ import annotations

import threading
from pathlib import Path

from llamaforge.core.errors import ImageError
from llamaforge.runners.engine import EngineConfig, docker_client, save_image

_SAVING = threading.Lock()  # the hosts or builders of a batch ask at once: one of them saves


def saved_image(image: str, directory: Path, *, keep: int, config: EngineConfig | None = None) -> Path:
    """The ``docker save`` archive of ``image`` (an id) from the engine ``config`` names, as
    ``directory/<id>.tar``, made once per id; only the ``keep`` archives used last stay in ``directory`` (an
    archive is a few hundred MB, and it is made again in seconds)."""
    archive = directory / f"{image.removeprefix('sha256:')}.tar"
    with _SAVING:
        if archive.is_file():
            archive.touch()  # used now
        else:
            save_image(image, archive, config)
            for stale in sorted(directory.glob("*.tar"), key=_last_used, reverse=True)[keep:]:
                stale.unlink(missing_ok=True)  # one being loaded stays readable until it is closed
    return archive


def _last_used(archive: Path) -> float:
    try:
        return archive.stat().st_mtime
    except OSError:  # removed meanwhile by another llamaforge
        return 0.0


def load_image(archive: Path, tag: str, image: str, config: EngineConfig | None = None) -> None:
    """``docker load`` the ``docker save`` archive ``archive`` into the engine (streamed from the file), then make
    sure ``tag`` names ``image`` (an id) there; ImageError when the engine refuses it or ends up without it."""
    import docker.errors

    client = docker_client(config)
    repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    try:
        with archive.open("rb") as data:
            for chunk in client.api.load_image(data):
                if isinstance(chunk, dict) and chunk.get("error"):
                    raise ImageError(f"the Docker engine could not load {archive.name}: {chunk['error']}")
        client.api.tag(image, repository, version)
        loaded = str(client.images.get(tag).id)
    except docker.errors.APIError as error:
        raise ImageError(
            f"the Docker engine could not load {archive.name}: {error.explanation or error}",
            hint="check its free disk (`invoke builders.status`)",
        ) from None
    if loaded != image:
        raise ImageError(
            f"the Docker engine loaded {archive.name} but {tag} is {loaded[:19]}, not {image[:19]}"
        )
