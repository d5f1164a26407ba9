"""A container with a small surface: ``call``, ``copy_into``, ``write_file``, ``copy_out``; always removed on exit.

An engine that goes away under a running container (its machine stopped, the connection cut) or a container
removed behind its back raises :class:`EngineLost` from any of them, never the SDK's own exceptions: a caller
that fans builds out over several engines retries that work elsewhere."""

from __future__ import annotations

import contextlib
import io
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from llamaforge.core.errors import DockerUnavailable
from llamaforge.runners.engine import LABEL


class EngineLost(DockerUnavailable):
    """The engine stopped answering, or the container vanished, while a container was in use."""


@contextlib.contextmanager
def _engine_errors(what: str, engine: str) -> Iterator[None]:
    """Turn the SDK's lost-connection and vanished-container errors inside the block into EngineLost."""
    import docker.errors
    import requests.exceptions
    import urllib3.exceptions

    try:
        yield
    except docker.errors.NotFound as error:
        raise EngineLost(
            f"the container vanished on the Docker engine{engine} while {what}: {error.explanation or error}",
            hint="something removed it (docker rm, a prune, the engine's restart); run the build again",
        ) from None
    except (requests.exceptions.ConnectionError, urllib3.exceptions.HTTPError, OSError) as error:
        raise EngineLost(
            f"lost the Docker engine{engine} while {what}: {error}",
            hint="check that the engine's machine is up and reachable (`invoke builders.status`), then build "
            "again",
        ) from None


class Container:
    """A long-lived container that runs commands; use as a context manager so it is always removed. It has no
    network (``network="none"``) unless the caller names a Docker network mode (``"host"``: the engine host's)."""

    def __init__(
        self,
        client: Any,
        image: str,
        *,
        volumes: Mapping[str, Mapping[str, str]] | None = None,
        environment: Mapping[str, str] | None = None,
        name_hint: str = "build",
        network: str = "none",
    ) -> None:
        self._client = client
        self._image = image
        self._volumes = dict(volumes or {})
        self._environment = dict(environment or {})
        self._name_hint = name_hint
        self._network = network
        self._container: Any = None
        self._lock = threading.Lock()

    @property
    def _where(self) -> str:
        url = str(getattr(self._client.api, "base_url", ""))
        if not url or url.startswith(
            "http+docker://"
        ):  # the SDK's name for a unix socket or an ssh:// engine
            return ""
        return " at tcp://" + url.split("://", 1)[-1]

    def __enter__(self) -> Container:
        with _engine_errors("starting a container", self._where):
            self._start()
        return self

    def _start(self) -> None:
        self._container = self._client.containers.create(
            self._image,
            command=["sleep", "infinity"],
            volumes=self._volumes,
            environment=self._environment,
            labels={LABEL: "1", "org.llamaforge.role": self._name_hint},
            network_mode=self._network,
            init=True,
            detach=True,
        )
        self._container.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.remove()
            return
        with contextlib.suppress(EngineLost):  # the error in flight says more than a failed clean-up
            self.remove()

    @property
    def id(self) -> str:
        """Container id."""
        return str(self._container.id)

    def remove(self) -> None:
        """Kill and remove the container (idempotent, safe from another thread). An engine that cannot be reached
        raises EngineLost (and the container counts as gone from here)."""
        import docker.errors

        # Holding the lock while removing makes a second caller wait until the container is really gone.
        with self._lock:
            if self._container is None:
                return
            container, self._container = self._container, None
            with (
                _engine_errors("removing a container", self._where),
                contextlib.suppress(docker.errors.NotFound),
            ):
                container.remove(force=True)

    def call(
        self,
        command: Sequence[str],
        *,
        environment: Mapping[str, str] | None = None,
        workdir: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> int:
        """Run ``command``; stream each output line to ``on_line``; return the exit code."""
        with _engine_errors(f"running {command[0]}", self._where):
            return self._call(command, environment, workdir, on_line)

    def _call(
        self,
        command: Sequence[str],
        environment: Mapping[str, str] | None,
        workdir: str | None,
        on_line: Callable[[str], None] | None,
    ) -> int:
        api = self._client.api
        exec_id = api.exec_create(
            self.id,
            list(command),
            environment=dict(environment or {}),
            workdir=workdir,
            stdout=True,
            stderr=True,
        )["Id"]
        pending = ""
        stream = api.exec_start(exec_id, stream=True)
        try:
            for chunk in stream:
                pending += chunk.decode("utf-8", errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    if on_line:
                        on_line(line.rstrip("\r"))
        finally:
            # The SDK leaves the upgraded exec socket open; close it so no descriptor leaks per call.
            with contextlib.suppress(Exception):
                stream.close()
            with contextlib.suppress(Exception):
                stream._response.raw._fp.fp.raw._sock.close()
            stream._response.close()
        if pending and on_line:
            on_line(pending)
        code = api.exec_inspect(exec_id).get("ExitCode")
        return 137 if code is None else int(code)

    def copy_into(self, source: Path, destination: str, *, skip: tuple[str, ...] = ()) -> None:
        """Copy a host file or directory to ``destination`` (a directory path) in the container, leaving out the
        entries ``skip`` names (paths relative to ``source``)."""
        left_out = {f"{source.name}/{relative.strip('/')}" for relative in skip}

        def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return None if member.name in left_out else member

        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(source, arcname=source.name, filter=keep)
        buffer.seek(0)
        self.call(["mkdir", "-p", destination])
        with _engine_errors("copying files into the container", self._where):
            self._container.put_archive(destination, buffer)

    def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to the file ``path`` in the container (its directory is made), owned by root with
        ``mode``; the bytes go from memory into the container, never onto this host's disk."""
        directory, _, name = path.rpartition("/")
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.addfile(info, io.BytesIO(data))
        buffer.seek(0)
        self.call(["mkdir", "-p", directory or "/"])
        with _engine_errors("writing a file into the container", self._where):
            self._container.put_archive(directory or "/", buffer)

    def copy_out(self, source: str, destination: Path) -> None:
        """Copy the contents of directory ``source`` in the container into the host directory ``destination``."""
        with _engine_errors("copying files out of the container", self._where):
            stream, _ = self._container.get_archive(source)
            buffer = io.BytesIO(b"".join(stream))
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=buffer) as tar:
            for member in tar:
                _top, _, rest = member.name.partition("/")
                if not rest:
                    continue
                member.name = rest
                tar.extract(member, destination, filter="data")
