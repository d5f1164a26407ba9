"""Builder fleets: ``recipes/builders/NAME.toml`` (or any path) lists the machines a build matrix may fan out to.

A fleet is a typed, frozen model like the other recipes: unknown keys are refused naming the file and the field,
with "did you mean …?"; the JSON schema is checked in as ``recipes/schema/builder-fleet.schema.json``. Each
``[[builders]]`` entry is reached one way: a Docker ``engine`` (``unix://``, ``tcp://`` with ``tls_verify`` and
a ``cert_path`` directory holding ca.pem/cert.pem/key.pem, or ``ssh://user@host``) or an SSH ``build_host``
(``user@host:port``, with ``ssh_key`` / ``known_hosts``, as ``--executor ssh`` builds). It names the platforms it
builds, its cores and memory (probed when not given), free-form ``labels`` a matrix entry may require, and how
many builds it runs at once (``concurrency``).

An optional ``[ccache]`` table declares a remote ccache storage shared by the fleet: ``remote_storage`` (a
``redis://HOST:PORT`` or ``http(s)://`` URL without a password) and ``password_file`` (read only when a build
starts, never written into an argument, a log or a manifest).

Relative paths (``cert_path``, ``ssh_key``, ``known_hosts``, ``password_file``) are relative to the fleet file;
every path a fleet names passes the running front's path policy when the fleet is loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from llamaforge.build.ccache import check_storage_url
from llamaforge.build.names import PlatformName
from llamaforge.build.recipes import resolve_named_file
from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import read_toml, recipe_error, suggest

if TYPE_CHECKING:
    from llamaforge.build.ccache import RemoteCache
    from llamaforge.build.executors.base import Executor
    from llamaforge.runners.engine import EngineConfig
    from llamaforge.runners.ssh.connection import SshHost

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=/-]{0,62}$")
ENGINE_SCHEMES = ("unix", "tcp", "ssh")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_password(url: str, field: str) -> None:
    if urlsplit(url).password is not None:
        raise ValueError(
            f"{field} holds a password; put it in a file named by password_file (the URL is logged and recorded)"
        )


class Builder(_Strict):
    """One machine of a fleet: a Docker engine or an SSH build host."""

    name: str = Field(description="The builder's name in --builders selections, reports and manifests")
    engine: str | None = Field(
        None,
        description="Docker engine URL (DOCKER_HOST form): unix:///var/run/docker.sock, tcp://HOST:2376, "
        "ssh://USER@HOST",
    )
    tls_verify: bool = Field(False, description="tcp:// engines: verify the engine with cert_path's ca.pem")
    cert_path: str | None = Field(
        None, description="tcp:// engines: directory with ca.pem, cert.pem, key.pem (like DOCKER_CERT_PATH)"
    )
    build_host: str | None = Field(
        None, description="SSH build host, user@host:port (builds with the host's own toolchain)"
    )
    ssh_key: str | None = Field(None, description="build_host: private key file (default: the agent)")
    known_hosts: str | None = Field(
        None, description="build_host: known_hosts file read beside ~/.ssh/known_hosts"
    )
    platforms: list[PlatformName] = Field(min_length=1, description="Platforms it builds for")
    cores: int | None = Field(None, ge=1, description="CPU cores (probed when not given)")
    memory_gib: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Memory in GiB (probed when not given)"
    )
    labels: list[str] = Field(
        default_factory=list, description="Labels a matrix entry may require (cuda, fast, rack-a, …)"
    )
    concurrency: int = Field(1, ge=1, le=64, description="How many builds it runs at once")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("use letters, digits, '.', '_' and '-' (at most 63)")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        for label in value:
            if not _LABEL.fullmatch(label):
                raise ValueError(f"label {label!r}: use letters, digits and . _ : = / - (at most 63)")
        return value

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = urlsplit(value).scheme
        if scheme not in ENGINE_SCHEMES or value.startswith("-") or re.search(r"\s", value):
            raise ValueError(
                f"{value!r} is not a Docker engine URL: use unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST"
            )
        _no_password(value, "engine")
        parts = urlsplit(value)
        try:
            port = parts.port  # out of range or not a number: ValueError
        except ValueError:
            port = -1
        if (scheme == "unix" and not parts.path) or (
            scheme != "unix" and (not parts.hostname or port in (-1, 0))
        ):
            raise ValueError(
                f"{value!r} names no {'socket path' if scheme == 'unix' else 'host and valid port'}: use "
                "unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST"
            )
        if scheme != "unix" and (parts.path not in ("", "/") or parts.query or parts.fragment):
            # docker's client takes none of them; it failed with "Invalid bind address format" when probed
            raise ValueError(
                f"{value!r}: an engine URL names only the user, host and port, no path or query: use "
                f"{scheme}://{'USER@' if scheme == 'ssh' else ''}HOST:PORT"
            )
        return value

    @field_validator("build_host")
    @classmethod
    def _build_host(cls, value: str | None) -> str | None:
        if value is not None:
            from llamaforge.runners.ssh import parse_host

            if "://" in value:
                raise ValueError(f"{value!r} is not user@host:port")
            try:
                parse_host(value)
            except InvalidOption as error:
                raise ValueError(error.message) from None
        return value

    @model_validator(mode="after")
    def _one_way(self) -> Builder:
        if (self.engine is None) == (self.build_host is None):
            raise ValueError(
                "give exactly one of engine (a Docker engine URL) or build_host (user@host:port)"
            )
        if self.engine is not None and (self.ssh_key or self.known_hosts):
            raise ValueError(
                "ssh_key and known_hosts belong to a build_host; an ssh:// engine uses ~/.ssh (as docker does)"
            )
        if self.build_host is not None and (self.tls_verify or self.cert_path):
            raise ValueError("tls_verify and cert_path belong to a tcp:// engine, not a build_host")
        if (
            self.engine is not None
            and not self.engine.startswith("tcp://")
            and (self.tls_verify or self.cert_path)
        ):
            raise ValueError("tls_verify and cert_path apply to tcp:// engines only")
        if self.tls_verify and not self.cert_path:
            raise ValueError("tls_verify needs cert_path (a directory with ca.pem, cert.pem and key.pem)")
        if self.engine is not None and "macos" in self.platforms:
            # placement never sends a macOS build to an engine: such a builder only looked like it builds them
            raise ValueError(
                f"builder {self.name!r} lists macos: a Docker engine builds linux and windows (mingw); macOS "
                "builds need a Mac as build_host"
            )
        return self

    @property
    def kind(self) -> str:
        """``engine`` or ``build-host``."""
        return "engine" if self.engine is not None else "build-host"

    @property
    def where(self) -> str:
        """The engine URL or ``user@host:port`` (no secret in either)."""
        return self.engine or str(self.build_host)

    def label(self) -> str:
        """``NAME (WHERE)``: how reports and manifests name the builder."""
        return f"{self.name} ({self.where})"

    def engine_config(self) -> EngineConfig:
        """How to reach the builder's Docker engine (every field set, so no DOCKER_* variable of this process
        leaks into it)."""
        from llamaforge.runners.engine import EngineConfig

        if self.engine is None:
            raise InvalidOption(f"builder {self.name!r} is a build host, not a Docker engine")
        cert_path = Path(self.cert_path) if self.cert_path else None
        if cert_path is not None:
            self._check_cert_path(cert_path)
        return EngineConfig(url=self.engine, tls_verify=self.tls_verify, cert_path=cert_path)

    def _check_cert_path(self, cert_path: Path) -> None:
        """Name a cert_path that is no directory, or lacks the files the engine's TLS needs (the docker client
        said only that "a certificate and key files must be provided")."""
        needed = ("ca.pem", "cert.pem", "key.pem") if self.tls_verify else ("cert.pem", "key.pem")
        hint = (
            f"cert_path of builder {self.name} in the fleet file is a directory holding "
            + ", ".join(needed)
            + " (as DOCKER_CERT_PATH)"
        )
        if not cert_path.is_dir():
            what = "does not exist" if not cert_path.exists() else "is no directory"
            raise InvalidOption(f"the cert_path of builder {self.name}, {cert_path}, {what}", hint=hint)
        if missing := [name for name in needed if not (cert_path / name).is_file()]:
            raise InvalidOption(
                f"the cert_path of builder {self.name}, {cert_path}, has no {', '.join(missing)}", hint=hint
            )

    def ssh_host(self) -> SshHost:
        """How to reach the builder's SSH build host."""
        from llamaforge.runners.ssh import parse_host

        if self.build_host is None:
            raise InvalidOption(f"builder {self.name!r} is a Docker engine, not a build host")
        if self.ssh_key:
            from llamaforge.build.executors.ssh import check_key_file

            check_key_file(Path(self.ssh_key), f"builder {self.name}: ssh_key")
        if self.known_hosts and Path(self.known_hosts).is_dir():  # read only when a file
            raise InvalidOption(
                f"builder {self.name}: known_hosts {self.known_hosts} is a directory, not a known_hosts file",
                hint="give a file (it need not exist yet: new host keys are recorded there)",
            )
        return parse_host(
            self.build_host,
            key_file=Path(self.ssh_key) if self.ssh_key else None,
            known_hosts=Path(self.known_hosts) if self.known_hosts else None,
            origin=f"builder {self.name}",
        )

    def executor(self, remote_cache: RemoteCache | None = None) -> Executor:
        """A DockerExecutor on the builder's engine (its builds use ``remote_cache``, the fleet's shared ccache
        storage, when given), or the SSH executor on its build host, whose ccache is the host's own
        configuration (connects to nothing yet)."""
        if self.engine is not None:
            from llamaforge.build.executors.docker import DockerExecutor

            return DockerExecutor(self.engine_config(), remote_cache)
        from llamaforge.build.executors.ssh import SshBuildExecutor

        return SshBuildExecutor(self.ssh_host())


class FleetCcache(_Strict):
    """A remote ccache storage shared by every builder of the fleet (ccache ≥ 4.4 ``remote_storage``)."""

    remote_storage: str = Field(description="redis://HOST:PORT or http(s)://HOST/PATH, without a password")
    password_file: str | None = Field(
        None, description="File holding the storage's password (relative to the fleet file)"
    )

    @model_validator(mode="after")
    def _url(self) -> FleetCcache:
        # The one check of a storage URL (build/ccache.py): the same for --ccache-remote and a fleet.
        try:
            check_storage_url(
                self.remote_storage, has_password_file=self.password_file is not None, origin="remote_storage"
            )
        except InvalidOption as error:
            raise ValueError(f"{error.message} ({error.hint})") from None
        return self


class BuilderFleet(_Strict):
    """A fleet file: its builders and an optional shared ccache. Loaded by :func:`load_fleet`, every path in it
    is absolute."""

    name: str = Field(description="The fleet's name (the file's stem)")
    description: str = ""
    ccache: FleetCcache | None = None
    builders: list[Builder] = Field(min_length=1, description="The builders")
    _origin: str = PrivateAttr("")

    @model_validator(mode="after")
    def _unique(self) -> BuilderFleet:
        names = [builder.name for builder in self.builders]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"builder names given twice: {', '.join(twice)}")
        return self

    @property
    def origin(self) -> str:
        """The file the fleet came from."""
        return self._origin or self.name

    def remote_cache(self) -> RemoteCache | None:
        """The fleet's shared ccache storage, checked (a password in the URL or a password file that cannot be
        read is an InvalidOption naming the fleet file), or None without a ``[ccache]`` table."""
        if self.ccache is None:
            return None
        from llamaforge.build.ccache import RemoteCache

        return RemoteCache.parse(
            self.ccache.remote_storage,
            self.ccache.password_file,
            origin=f"builder fleet {self.origin}: [ccache]",
        )

    def builder(self, name: str) -> Builder:
        """The builder ``name``; InvalidOption with "did you mean" and the fleet's builders otherwise."""
        names = [builder.name for builder in self.builders]
        for builder in self.builders:
            if builder.name == name:
                return builder
        raise InvalidOption(
            f"builder {name!r} is not in the builder fleet {self.origin}",
            hint=suggest(name, names, end=" ") + "its builders: " + ", ".join(names),
        )

    def select(self, names: str | Sequence[str] | None) -> list[Builder]:
        """The builders named in ``names`` (comma-separated; fleet order), or all of them for none."""
        if not names:
            return list(self.builders)
        wanted = [
            part.strip()
            for item in ([names] if isinstance(names, str) else names)
            for part in item.split(",")
            if part.strip()
        ]
        if not wanted:  # "NAME:," asked for builders and named none: it reported 0 of 0 builders
            raise InvalidOption(
                f"the selection {names!r} of builder fleet {self.origin} names no builder",
                hint="name builders after the colon, NAME:b1,b2, or give the fleet's name alone for all of them",
            )
        chosen = {self.builder(name).name for name in wanted}
        return [builder for builder in self.builders if builder.name in chosen]


def fleet_dir() -> Path:
    """Where named fleets live: ``recipes/builders/``."""
    return data_dir("recipes") / "builders"


def _absolute(text: str | None, base: Path, what: str) -> str | None:
    """The fleet's path ``text`` made absolute (relative to the fleet file), checked by the path policy."""
    if text is None:
        return None
    path = Path(text).expanduser()
    path = path if path.is_absolute() else (base / path).absolute()
    check_file_path(what, path)
    return str(path)


def load_fleet(name_or_path: str | Path) -> BuilderFleet:
    """The fleet ``recipes/builders/NAME.toml`` or at a path; unknown keys get "did you mean", and every path it
    names is made absolute and passes the front's path policy."""
    path = resolve_named_file(name_or_path, fleet_dir(), "builder fleet")
    data = read_toml(path, "builder fleet")
    what = f"builder fleet {path}"
    try:
        fleet = BuilderFleet.model_validate({**data, "name": path.stem})
    except ValidationError as error:
        raise recipe_error(
            error,
            what=what,
            root=BuilderFleet,
            hint="see recipes/schema/builder-fleet.schema.json for the fields",
        ) from None
    base = path.absolute().parent
    builders = [
        builder.model_copy(
            update={
                field: _absolute(getattr(builder, field), base, f"{what}: builders[{builder.name}].{field}")
                for field in ("cert_path", "ssh_key", "known_hosts")
            }
        )
        for builder in fleet.builders
    ]
    ccache = fleet.ccache
    if ccache is not None:
        password = _absolute(ccache.password_file, base, f"{what}: ccache.password_file")
        ccache = ccache.model_copy(update={"password_file": password})
    resolved = fleet.model_copy(update={"builders": builders, "ccache": ccache})
    resolved._origin = str(path)
    return resolved


def fleet_json_schema() -> str:
    """The JSON schema of builder fleets, as checked in under ``recipes/schema/``."""
    return json.dumps(BuilderFleet.model_json_schema(), indent=2, sort_keys=True) + "\n"
