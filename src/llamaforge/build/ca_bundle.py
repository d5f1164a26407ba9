"""The CA bundle a builder image trusts: ``--ca-bundle``, else the one this host's pip and Python trust.

Behind a TLS-intercepting proxy the host trusts the proxy's CA through ``PIP_CERT``, ``SSL_CERT_FILE``,
``REQUESTS_CA_BUNDLE`` or pip's ``global.cert``, and a container inherits none of them: pip in the builder image
then fails with CERTIFICATE_VERIFY_FAILED. The first of those settings that is set names the host's bundle; the
platforms copy it into each builder image that downloads over TLS (see ``BuildOptions.ca_bundle_origin``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import InvalidOption

# Read in this order; the first one set wins, and pip's configuration comes after all of them.
ENV_SETTINGS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
GIVEN = "--ca-bundle"  # the origin of a bundle the user named


@dataclass(frozen=True)
class HostBundle:
    """A CA bundle a host setting names, and that setting (``PIP_CERT``, ``pip config /etc/pip.conf …``)."""

    path: Path
    origin: str
    setting: str  # what to change: the variable, or the pip config file and its key

    @property
    def exists(self) -> bool:
        """Whether the setting names a file."""
        return self.path.is_file()

    @property
    def absence(self) -> str:
        """Why the setting names no file, as a message says it: "does not exist", "is a directory, not a file"."""
        return "is a directory, not a file" if self.path.is_dir() else "does not exist"


def pip_config_files() -> list[Path]:
    """pip's configuration files, in the order pip reads them (a later file overrides an earlier one): the
    system's (``$XDG_CONFIG_DIRS/pip/pip.conf``, ``/etc/pip.conf``), the user's (``~/.pip/pip.conf``,
    ``$XDG_CONFIG_HOME/pip/pip.conf``), the environment's (``sys.prefix/pip.conf``) and ``$PIP_CONFIG_FILE``.
    ``PIP_CONFIG_FILE=/dev/null`` turns them all off, as it does for pip."""
    named = os.environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    system_dirs = os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [Path(folder) / "pip" / "pip.conf" for folder in system_dirs.split(os.pathsep) if folder]
    files.append(Path("/etc/pip.conf"))
    if not (named and Path(named).exists()):  # pip reads the user's files only without a PIP_CONFIG_FILE
        user = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        files += [Path.home() / ".pip" / "pip.conf", user / "pip" / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if named:
        files.append(Path(named))
    return files


def _pip_config_cert() -> HostBundle | None:
    """pip's ``global.cert`` from the last configuration file that sets it."""
    import configparser  # only when no variable names a bundle

    found = None
    for path in pip_config_files():
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()  # pip's reader: no interpolation
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError) as error:
            raise InvalidOption(
                f"pip config {path} cannot be read: {error}".splitlines()[0],
                hint=f"fix {path} (pip cannot read it either), or pass --ca-bundle PATH or --no-ca-bundle",
            ) from None
        cert = parser.get("global", "cert", fallback="").strip()
        if cert:
            found = HostBundle(Path(cert).expanduser(), f"pip config {path} (global.cert)", f"cert in {path}")
    return found


def find_host_bundle() -> HostBundle | None:
    """The CA bundle this host's settings name (``PIP_CERT``, ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, then
    pip's ``global.cert``), whether or not the file exists; None when none is set."""
    for name in ENV_SETTINGS:
        value = os.environ.get(name, "").strip()
        if value:
            return HostBundle(Path(value).expanduser(), name, name)
    return _pip_config_cert()


def host_bundle() -> HostBundle | None:
    """:func:`find_host_bundle`, refusing a setting that names no file (the host's own pip and downloads fail
    with it too)."""
    found = find_host_bundle()
    if found is not None and not found.exists:
        raise InvalidOption(
            f"{found.origin} names the CA bundle {found.path}, which {found.absence}",
            hint=f"point {found.setting} at a CA bundle file or unset it; or pass --ca-bundle PATH, or "
            "--no-ca-bundle to build without one",
        )
    return found


def choose_bundle(given: str | None, *, none: bool = False) -> tuple[Path | None, str | None]:
    """The CA bundle a build uses and the host setting that named it (None: given): ``given`` (``--ca-bundle``),
    else the host's (:func:`host_bundle`); no bundle with ``none`` (``--no-ca-bundle``)."""
    if none:
        if given:
            raise InvalidOption(
                "--ca-bundle and --no-ca-bundle contradict each other", hint="drop one of them"
            )
        return None, None
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            what = "is a directory, not a file" if path.is_dir() else "does not exist"
            raise InvalidOption(
                f"CA bundle {path} {what}",
                hint="give --ca-bundle a file of PEM certificates, e.g. /etc/ssl/certs/ca-certificates.crt",
            )
        return _readable(path.resolve(), GIVEN), None
    found = host_bundle()
    return (_readable(found.path.resolve(), found.origin), found.origin) if found else (None, None)


_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def _readable(bundle: Path, origin: str) -> Path:
    """``bundle``, once it can be read and holds a PEM certificate (the key holds its sha256, the image a copy
    that its downloads trust)."""
    try:
        text = bundle.read_bytes()
    except OSError as error:
        raise InvalidOption(
            f"CA bundle {bundle} ({origin}) cannot be read: {error.strerror}",
            hint="make it readable, name another with --ca-bundle PATH, or pass --no-ca-bundle",
        ) from None
    if _PEM_CERTIFICATE not in text:
        raise InvalidOption(
            f"CA bundle {bundle} ({origin}) holds no PEM certificate (no '-----BEGIN CERTIFICATE-----' line)",
            hint="give a file of PEM certificates, e.g. /etc/ssl/certs/ca-certificates.crt, or pass "
            "--no-ca-bundle",
        )
    return bundle
