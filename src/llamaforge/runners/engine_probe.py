"""What a Docker engine of a builder fleet has to offer (version, cores, memory, free disk, llamaforge images),
asked with a short timeout, and why one cannot be reached in words a user can act on (TLS, SSH host key, refused
or silent address)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from llamaforge.core.errors import DockerUnavailable
from llamaforge.runners.engine import LABEL, EngineConfig, engine_api

PROBE_TIMEOUT_S = 20
IMAGE_PREFIXES = ("llamaforge-builder:", "llamaforge/")


@dataclass(frozen=True)
class EngineFacts:
    """One engine's answers: ``free_disk_bytes`` is None when it has no llamaforge image to measure with."""

    version: str
    api_version: str
    os: str
    architecture: str
    cores: int
    memory_bytes: int
    images: tuple[str, ...]
    free_disk_bytes: int | None


def unreachable(url: str, error: BaseException | str) -> DockerUnavailable:
    """The DockerUnavailable for an engine that did not answer, with the next step its error points at."""
    text = str(error)
    lowered = text.lower()
    if any(word in lowered for word in ("ssl", "certificate", "tls", "cert.pem", "key.pem", "ca.pem")):
        hint = (
            "a TLS failure: cert_path must hold ca.pem (the CA that signed the engine's certificate), cert.pem "
            "and key.pem (a client certificate that CA signed), and the engine's certificate must name the "
            "address in the URL; `DOCKER_HOST=URL DOCKER_TLS_VERIFY=1 DOCKER_CERT_PATH=DIR docker info` shows "
            "the same"
        )
    elif url.startswith("ssh://") and any(word in lowered for word in ("host key", "known_hosts", "hostkey")):
        hint = (
            "the SSH host key is unknown or changed: check it with `ssh-keyscan HOST | ssh-keygen -lf -`, then "
            "`ssh USER@HOST true` once to record it in ~/.ssh/known_hosts"
        )
    elif url.startswith("ssh://"):
        hint = "check that `ssh USER@HOST docker info` works with your key (the user must be in the docker group)"
    else:
        hint = (
            "check that the machine is up, that dockerd listens on that address (-H tcp://0.0.0.0:2376 "
            "--tlsverify …) and that no firewall drops the port"
        )
    return DockerUnavailable(f"cannot reach the Docker engine at {url}: {text}", hint=hint)


def _api(config: EngineConfig, timeout: int) -> Any:
    """A fresh low-level client with a short timeout (never the shared, long-timeout one)."""
    import docker.errors

    environment = config.environment()
    url = environment.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        return engine_api(environment, timeout)
    except (docker.errors.DockerException, OSError) as error:
        raise unreachable(url, error) from None


def ping_engine(config: EngineConfig, *, timeout: int = 10) -> DockerUnavailable | None:
    """None when the engine answers a ping within ``timeout`` seconds, else the error saying why not."""
    url = config.environment().get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        api = _api(config, timeout)
    except DockerUnavailable as error:
        return error
    try:
        api.ping()
    except Exception as error:  # noqa: BLE001 - the SDK, requests, paramiko and ssl raise their own kinds
        return unreachable(url, error)
    finally:
        with contextlib.suppress(Exception):
            api.close()
    return None


def probe_engine(config: EngineConfig, *, timeout: int = PROBE_TIMEOUT_S) -> EngineFacts:
    """The engine's version, cores, memory, llamaforge images and free disk; DockerUnavailable with a hint when
    it cannot be reached."""
    url = config.environment().get("DOCKER_HOST", "unix:///var/run/docker.sock")
    api = _api(config, timeout)
    try:
        info = api.info()
        version = api.version()
        tags = sorted(
            tag
            for image in api.images()
            for tag in image.get("RepoTags") or []
            if tag.startswith(IMAGE_PREFIXES)
        )
        free = _free_disk(api, tags)
    except DockerUnavailable:
        raise
    except Exception as error:  # noqa: BLE001 - the SDK, requests, paramiko and ssl raise their own kinds
        raise unreachable(url, error) from None
    finally:
        with contextlib.suppress(Exception):
            api.close()
    return EngineFacts(
        version=str(version.get("Version", "?")),
        api_version=str(version.get("ApiVersion", "?")),
        os=str(info.get("OperatingSystem", "?")),
        architecture=str(info.get("Architecture", "?")),
        cores=int(info.get("NCPU") or 0),
        memory_bytes=int(info.get("MemTotal") or 0),
        images=tuple(tags),
        free_disk_bytes=free,
    )


def _free_disk(api: Any, tags: list[str]) -> int | None:
    """Free bytes where the engine keeps images and containers: ``df`` of a throwaway container's root, which
    lives on the engine's data root (the engine's API reports no free space). None with no image to run."""
    if not tags:
        return None
    container = api.create_container(
        tags[0],
        command=["df", "-Pk", "/"],
        labels={LABEL: "1", "org.llamaforge.role": "probe"},
        host_config=api.create_host_config(network_mode="none"),
        network_disabled=True,
    )
    try:
        api.start(container)
        api.wait(container)
        output = api.logs(container, stdout=True, stderr=False).decode("utf-8", "replace").splitlines()
    finally:
        api.remove_container(container, force=True)
    fields = output[-1].split() if len(output) >= 2 else []
    return int(fields[3]) * 1024 if len(fields) >= 4 and fields[3].isdigit() else None
