"""The Docker engine connection, with one clear error when it is not reachable, and the few engine queries the
rest of llamaforge needs (image ids, digests, leftover containers), so no Docker code lives outside runners/."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.core.errors import DockerUnavailable, ImageError, InvalidOption

# Every container llamaforge starts carries this label, so leftovers can be found and removed.
LABEL = "org.llamaforge.owned"


@dataclass(frozen=True)
class EngineConfig:
    """How to reach a Docker engine; unset fields come from the environment (DOCKER_HOST, DOCKER_TLS_VERIFY,
    DOCKER_CERT_PATH), as for the docker CLI.

    ``url`` takes DOCKER_HOST's forms: ``unix:///var/run/docker.sock``, ``tcp://HOST:2376`` (with ``tls_verify``
    and ``cert_path``, a directory holding ca.pem, cert.pem and key.pem) or ``ssh://USER@HOST``.
    """

    url: str | None = None
    tls_verify: bool | None = None
    cert_path: Path | None = None

    SETTINGS = ("url", "tls_verify", "cert_path")

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> EngineConfig:
        """The config from string settings (``url``, ``tls_verify``, ``cert_path``), e.g. an executor's."""
        unknown = sorted(set(settings) - set(cls.SETTINGS))
        if unknown:
            raise InvalidOption(
                f"unknown Docker engine setting(s): {', '.join(unknown)}",
                hint="known: " + ", ".join(cls.SETTINGS),
            )
        verify = settings.get("tls_verify")
        if verify is not None and verify.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise InvalidOption(
                f"tls_verify={verify!r} is not a boolean", hint="use tls_verify=1 or tls_verify=0"
            )
        return cls(
            url=settings.get("url") or None,
            tls_verify=None if verify is None else verify.lower() in ("1", "true", "yes"),
            cert_path=Path(settings["cert_path"]) if settings.get("cert_path") else None,
        )

    def environment(self) -> dict[str, str]:
        """The DOCKER_* variables the docker SDK reads: this process's, overridden by the set fields."""
        env = {key: value for key, value in os.environ.items() if key.startswith("DOCKER_")}
        if self.url is not None:
            env["DOCKER_HOST"] = self.url
        if self.tls_verify is not None:
            if self.tls_verify:
                env["DOCKER_TLS_VERIFY"] = "1"
            else:
                env.pop("DOCKER_TLS_VERIFY", None)
        if self.cert_path is not None:
            env["DOCKER_CERT_PATH"] = str(self.cert_path)
        return env


_CLIENTS: dict[tuple[tuple[str, str], ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()  # builds on several engines at once ask for clients from several threads
_DEFAULT_SOCKET_URL = "unix:///var/run/docker.sock"
_UNAVAILABLE_HINT = (
    "start Docker (e.g. `dockerd &` as root) or set DOCKER_HOST; `invoke doctor` checks the setup; "
    "`invoke build --executor local` builds on this host without Docker"
)


def _check_socket(url: str) -> None:
    socket = Path(url.removeprefix("unix://")) if url.startswith("unix://") else None
    if socket is not None and not socket.exists():
        raise DockerUnavailable(
            f"cannot reach the Docker engine at {url}: {socket} does not exist", hint=_UNAVAILABLE_HINT
        )


def _socket_image_id(url: str, tag: str) -> str | None:
    """``GET /images/{tag}/json`` on the engine's unix socket: the same answer as the SDK's ``images.get``."""
    import http.client
    import json
    import socket
    import urllib.parse

    _check_socket(url)
    path = url.removeprefix("unix://")

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(path)

    connection = UnixConnection("localhost", timeout=60)
    try:
        connection.request("GET", f"/images/{urllib.parse.quote(tag, safe='/:')}/json")
        response = connection.getresponse()
        body = response.read()
    except OSError as error:
        raise DockerUnavailable(
            f"cannot reach the Docker engine at {url}: {error}", hint=_UNAVAILABLE_HINT
        ) from None
    finally:
        connection.close()
    if response.status == 404:
        return None
    if response.status != 200:
        message = body.decode("utf-8", "replace").strip()
        raise ImageError(f"the Docker engine could not look up image {tag}: {response.status} {message}")
    return str(json.loads(body)["Id"])


def _engine_api() -> Any:
    """docker's APIClient, except that the engine's own CA (DOCKER_CERT_PATH/ca.pem) verifies it: requests lets
    REQUESTS_CA_BUNDLE, set on many machines behind a TLS proxy, replace it on every request."""
    import docker

    class EngineAPI(docker.APIClient):  # type: ignore[misc]
        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if isinstance(self.verify, str) and verify is None:
                settings["verify"] = self.verify
            return settings

    return EngineAPI


def docker_client(config: EngineConfig | None = None) -> Any:
    """A connected ``docker.DockerClient`` for ``config`` (default: the environment's engine).

    One client per engine address and process: its connection pool is shared by every operation.
    """
    environment = (config or EngineConfig()).environment()
    address = tuple(sorted(environment.items()))
    if address in _CLIENTS:
        return _CLIENTS[address]
    with _CLIENTS_LOCK:
        if address not in _CLIENTS:
            _CLIENTS[address] = _connect(environment)
        return _CLIENTS[address]


def engine_api(environment: Mapping[str, str], timeout: int) -> Any:
    """A new (uncached) low-level API client for the engine the DOCKER_* ``environment`` names."""
    import docker

    return _engine_api()(timeout=timeout, **docker.utils.kwargs_from_env(environment=dict(environment)))


def _connect(environment: dict[str, str]) -> Any:
    import docker
    import docker.errors

    url = environment.get("DOCKER_HOST", "")
    _check_socket(url)  # first: the SDK leaks the socket object of a failed unix connect
    client = None
    try:
        api = engine_api(environment, 600)
        client = docker.DockerClient.__new__(docker.DockerClient)  # DockerClient(...) would make its own API
        client.api = api
        client.ping()
    except (docker.errors.DockerException, OSError) as error:
        if client is not None:
            client.close()  # its connection pool would otherwise leak a socket
        where = f" at {url}" if url else ""
        raise DockerUnavailable(
            f"cannot reach the Docker engine{where}: {error}", hint=_UNAVAILABLE_HINT
        ) from None
    return client


def image_id(tag: str, config: EngineConfig | None = None) -> str | None:
    """Id of the local image ``tag``, or None when the engine has no such image (changes nothing).

    On a local engine (a unix socket, the default) with no SDK client made yet, the one HTTP request is sent
    without the docker SDK: a cache hit needs only this id, and importing the SDK costs more than the hit.
    """
    environment = (config or EngineConfig()).environment()
    url = environment.get("DOCKER_HOST", _DEFAULT_SOCKET_URL)
    if tuple(sorted(environment.items())) not in _CLIENTS and url.startswith("unix://"):
        return _socket_image_id(url, tag)
    import docker.errors

    try:
        return str(docker_client(config).images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as error:
        raise ImageError(f"the Docker engine could not look up image {tag}: {error}") from None


def image_repo_digest(tag: str, config: EngineConfig | None = None) -> str | None:
    """The first registry digest recorded for the local image ``tag`` (None for images never pulled)."""
    attrs = docker_client(config).images.get(tag).attrs
    return next(iter(attrs.get("RepoDigests") or []), None)


def image_config(tag: str, config: EngineConfig | None = None) -> dict[str, Any]:
    """The local image ``tag``'s config as the engine reports it (Labels, User, Healthcheck, Entrypoint, …)."""
    attrs = docker_client(config).images.get(tag).attrs
    return dict(attrs.get("Config") or {})


def image_labels(tag: str, config: EngineConfig | None = None) -> dict[str, str]:
    """The labels of the local image ``tag``, read from the engine."""
    return dict(image_config(tag, config).get("Labels") or {})


def remove_unused_image(image: str, config: EngineConfig | None = None) -> bool:
    """Remove the local image ``image`` (an id) unless a container uses it; whether it was removed."""
    import docker.errors

    try:
        docker_client(config).images.remove(image)
    except docker.errors.APIError:  # in use (a container, a service's task) or gone already: keep it
        return False
    return True


def registry_digest(tag: str, config: EngineConfig | None = None) -> str:
    """The digest a registry reports for ``tag`` (asks the registry through the engine)."""
    import docker.errors

    client = docker_client(config)
    try:
        return str(client.images.get_registry_data(tag).id)
    except (docker.errors.DockerException, OSError) as error:
        raise ImageError(
            f"registry did not answer for {tag}: {error}",
            hint="a registry must be reachable from the Docker engine (or set a registry mirror)",
        ) from None


def import_image(archive: Path, tag: str, config: EngineConfig | None = None) -> str:
    """``docker import`` a root-filesystem tar as ``tag``; returns the image id."""
    client = docker_client(config)
    repository, _, version = tag.partition(":")
    client.api.import_image_from_file(str(archive), repository=repository, tag=version or "latest")
    return str(client.images.get(tag).id)


def save_image(image: str, archive: Path, config: EngineConfig | None = None) -> int:
    """``docker save`` the local image ``image`` (an id or tag) to ``archive``, whole or not at all (written to a
    temporary file of its own beside it and renamed, so two savers never mix); returns its size in bytes."""
    import tempfile

    import docker.errors

    archive.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".tmp")
    part = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in docker_client(config).images.get(image).save(named=True):
                out.write(chunk)
        part.replace(archive)
    except docker.errors.APIError as error:
        raise ImageError(f"the Docker engine could not save image {image}: {error}") from None
    finally:
        part.unlink(missing_ok=True)
    return archive.stat().st_size


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


def build_image(
    context: Path,
    tag: str,
    *,
    on_line: Callable[[str], None] | None = None,
    config: EngineConfig | None = None,
) -> str:
    """Build ``context`` (a directory holding a Dockerfile) as ``tag`` without pulling; returns the image id.

    Each line of the build's output goes to ``on_line``; a failed step raises ImageError with the last lines.
    """
    import docker.errors

    client = docker_client(config)
    tail: list[str] = []
    try:
        for chunk in client.api.build(
            path=str(context), tag=tag, rm=True, forcerm=True, decode=True, pull=False
        ):
            if "error" in chunk:
                raise ImageError(
                    f"building {tag} failed: {chunk['error'].strip()}",
                    hint="last lines:\n" + "\n".join(tail[-15:]),
                )
            text = str(chunk.get("stream", "")).rstrip()
            if text:
                tail.append(text)
                if on_line is not None:
                    on_line(text)
    except docker.errors.APIError as error:
        raise ImageError(f"building {tag} failed: {error}") from None
    return str(client.images.get(tag).id)


@dataclass(frozen=True)
class OwnedContainer:
    """A container labelled LABEL: its short id, name, role (``build``, …) and state (``running``, ``exited``…)."""

    short_id: str
    name: str
    role: str
    state: str

    @property
    def running(self) -> bool:
        """True while its process runs (a build, a smoke may be using it): never remove it then."""
        return self.state in ("running", "restarting", "paused")


@dataclass(frozen=True)
class EngineStatus:
    """What ``doctor`` reports about the engine."""

    version: str
    api_version: str
    image_tags: frozenset[str]
    containers: tuple[OwnedContainer, ...]  # every container labelled LABEL, running or not

    @property
    def leftover_containers(self) -> tuple[str, ...]:
        """Short ids of the labelled containers that stopped: what is safe to remove."""
        return tuple(container.short_id for container in self.containers if not container.running)


def engine_status(config: EngineConfig | None = None) -> EngineStatus:
    """Version, local image tags and the llamaforge containers of the engine (raises DockerUnavailable)."""
    client = docker_client(config)
    version = client.version()
    tags = frozenset(tag for image in client.images.list() for tag in image.tags)
    owned = client.containers.list(all=True, filters={"label": LABEL})
    return EngineStatus(
        str(version.get("Version")),
        str(version.get("ApiVersion")),
        tags,
        tuple(
            OwnedContainer(
                container.short_id,
                str(container.name),
                str(container.labels.get("org.llamaforge.role", "")),
                str(container.status),
            )
            for container in owned
        ),
    )
