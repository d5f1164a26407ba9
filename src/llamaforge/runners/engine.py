"""Connect to the Docker engine with one clear error when it is not reachable."""

from __future__ import annotations

from typing import Any

from llamaforge.core.errors import DockerUnavailable

# Every container llamaforge starts carries this label, so leftovers can be found and removed.
LABEL = "org.llamaforge.owned"


_CLIENTS: dict[str, Any] = {}


def docker_client() -> Any:
    """A connected ``docker.DockerClient`` (from the environment: DOCKER_HOST or the local socket).

    One client per DOCKER_HOST and process: its connection pool is shared by every operation.
    """
    import os

    address = os.environ.get("DOCKER_HOST", "")
    if address in _CLIENTS:
        return _CLIENTS[address]
    import docker
    import docker.errors

    client = None
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except (docker.errors.DockerException, OSError) as error:
        if client is not None:
            client.close()  # its connection pool would otherwise leak a socket
        raise DockerUnavailable(
            f"cannot reach the Docker engine: {error}",
            hint="start Docker (e.g. `dockerd &` as root) or set DOCKER_HOST; `invoke doctor` checks the setup; "
            "`invoke build --executor local` builds on this host without Docker",
        ) from None
    _CLIENTS[address] = client
    return client
