"""File transfer over an SSH runner's SFTP session: sha256-verified, skipped when the file is already there,
resumed from ``<destination>.part`` after an interruption and renamed into place atomically.

The sha256 on the host comes from ``sha256sum`` there (its bytes as they landed on its disk), never from what
this side sent. A ``.part`` longer than the file, or whose kept prefix turns out not to be this file's, is
sent again from the start once; a second mismatch fails and leaves the destination untouched.
"""

from __future__ import annotations

import hashlib
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from llamaforge.core.events import CancelToken
from llamaforge.runners.process import ProcessResult
from llamaforge.runners.ssh.connection import SshError, SshHost

CHUNK = 256 * 1024
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX  # never kept on a fetched file


@dataclass(frozen=True)
class TransferResult:
    """One file sent or fetched: where from and to, its sha256 and size, and what it took."""

    source: str
    destination: str
    sha256: str
    size: int
    sent_bytes: int  # bytes that crossed the connection (0 when skipped)
    skipped: bool  # the destination already had this sha256
    resumed_from: int  # bytes kept from an earlier interrupted transfer's .part (0: from the start)


def file_sha256(path: Path) -> str:
    """sha256 of a local file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _copy(source: Any, destination: Any, offset: int, cancel: CancelToken) -> int:
    source.seek(offset)
    destination.seek(offset)
    sent = 0
    while block := source.read(CHUNK):
        cancel.raise_if_cancelled()
        destination.write(block)
        sent += len(block)
    return sent


class RemoteHost(Protocol):
    """What a transfer needs of the SSH runner it belongs to: its host, its open connection (for SFTP), and
    commands on the host (``mkdir``, ``sha256sum``)."""

    host: SshHost

    @property
    def connection(self) -> Any:
        """The open ``fabric.Connection``."""
        ...

    def run(self, argv: Sequence[str]) -> ProcessResult:
        """Run ``argv`` on the host (a non-zero exit raises)."""
        ...

    def sha256(self, path: str) -> str | None:
        """The sha256 of the host's file ``path``, or None when there is no such file."""
        ...


class Transfer:
    """put and get for one :class:`~llamaforge.runners.ssh.runner.SshProcessRunner`."""

    def __init__(self, runner: RemoteHost) -> None:
        self._runner = runner

    def _sftp(self) -> Any:
        return self._runner.connection.sftp()

    def _failed(self, message: str) -> SshError:
        return SshError(message, hint="run it again: the transfer resumes from what arrived intact")

    def put(self, local: Path, remote: str, *, cancel: CancelToken | None = None) -> TransferResult:
        """Send ``local`` to ``remote`` on the host (parents made); skipped when ``remote`` already has the
        same sha256; resumes ``remote + ".part"``; the file keeps ``local``'s permission bits."""
        cancel = cancel or CancelToken()
        digest, size = file_sha256(local), local.stat().st_size
        if self._runner.sha256(remote) == digest:
            return TransferResult(str(local), remote, digest, size, 0, skipped=True, resumed_from=0)
        parent = posixpath.dirname(remote)
        if parent:
            self._runner.run(["mkdir", "-p", "--", parent])
        sftp = self._sftp()
        part = remote + ".part"
        try:
            kept = int(sftp.stat(part).st_size)
        except FileNotFoundError:
            kept = 0
        offset = kept if kept <= size else 0
        sent = 0
        for attempt in (offset, 0) if offset else (0,):
            with local.open("rb") as source, sftp.open(part, "r+b" if attempt else "wb") as destination:
                destination.set_pipelined(True)
                sent += _copy(source, destination, attempt, cancel)
            if self._runner.sha256(part) == digest:
                offset = attempt
                break
        else:
            raise self._failed(
                f"{remote} on {self._runner.host.host} does not match {local}'s sha256 after sending"
            )
        sftp.chmod(part, stat.S_IMODE(local.stat().st_mode))
        sftp.posix_rename(part, remote)
        return TransferResult(str(local), remote, digest, size, sent, skipped=False, resumed_from=offset)

    def get(self, remote: str, local: Path, *, cancel: CancelToken | None = None) -> TransferResult:
        """Fetch the host's ``remote`` to ``local`` (parents made); skipped when ``local`` already has the
        same sha256; resumes ``local`` + ``.part``; the file keeps ``remote``'s permission bits except setuid,
        setgid and sticky (a host's file never becomes a set-id program here)."""
        cancel = cancel or CancelToken()
        digest = self._runner.sha256(remote)
        if digest is None:
            raise self._failed(f"{remote} does not exist on {self._runner.host.host} (or cannot be read)")
        sftp = self._sftp()
        attributes = sftp.stat(remote)
        size = int(attributes.st_size)
        if local.is_file() and file_sha256(local) == digest:
            return TransferResult(remote, str(local), digest, size, 0, skipped=True, resumed_from=0)
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + ".part")
        kept = part.stat().st_size if part.is_file() else 0
        offset = kept if kept <= size else 0
        sent = 0
        for attempt in (offset, 0) if offset else (0,):
            with sftp.open(remote, "rb") as source, part.open("r+b" if attempt else "wb") as destination:
                source.seek(attempt)
                source.prefetch(size)
                sent += _copy(source, destination, attempt, cancel)
            if file_sha256(part) == digest:
                offset = attempt
                break
        else:
            raise self._failed(f"{local} does not match {remote}'s sha256 on {self._runner.host.host}")
        part.chmod(stat.S_IMODE(attributes.st_mode or 0o644) & ~_SPECIAL_BITS)
        part.replace(local)
        return TransferResult(remote, str(local), digest, size, sent, skipped=False, resumed_from=offset)
