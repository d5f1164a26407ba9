"""Random access to a GGUF file's bytes, and a streamed hash of a file and of each tensor's data.

The header reader (:mod:`llamaforge.gguf.header`) reads through a :class:`ByteSource`, so the same parser reads
a local file (:class:`FileSource`), bytes in memory (:class:`BytesSource`) or a remote file through HTTP range
requests (:mod:`llamaforge.models.inspect`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from stat import S_ISREG
from typing import Final, Protocol, runtime_checkable

from llamaforge.core.errors import ModelError

__all__ = ["CHUNK_SIZE", "ByteSource", "BytesSource", "FileSource", "hash_gguf"]

#: Bytes read per call when streaming tensor data: the bound on the memory hashing and copying need.
CHUNK_SIZE: Final[int] = 4 << 20


@runtime_checkable
class ByteSource(Protocol):
    """Random access to the bytes of a file whose size is known up front."""

    name: str

    @property
    def size(self) -> int:
        """Total size in bytes."""
        ...

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at the end of the file)."""
        ...


class BytesSource:
    """A byte string as a source (tests, fuzzing)."""

    def __init__(self, data: bytes, name: str = "<bytes>") -> None:
        self._data = data
        self.name = name

    @property
    def size(self) -> int:
        """Total size in bytes."""
        return len(self._data)

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``."""
        return self._data[offset : offset + length]


class FileSource:
    """A local file read with ``pread``; a context manager that closes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = str(path)
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as error:
            raise ModelError(f"cannot open {path}: {error.strerror}", hint="check the path") from None
        stat = os.fstat(self._fd)
        if not S_ISREG(stat.st_mode):
            os.close(self._fd)
            raise ModelError(f"{path} is not a regular file", hint="pass the path of a .gguf file")
        self._size = stat.st_size

    @property
    def size(self) -> int:
        """Size of the file when it was opened."""
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``."""
        try:
            return os.pread(self._fd, length, offset)
        except OSError as error:
            raise ModelError(f"cannot read {self.name}: {error.strerror}") from None

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hash_gguf(
    path: Path, regions: Iterable[tuple[str, int, int]], on_bytes: Callable[[int], None] | None = None
) -> tuple[str, dict[str, str]]:
    """The sha256 of ``path`` and of each ``(name, absolute offset, size)`` region, in one sequential read
    with a fixed ``CHUNK_SIZE`` buffer (``on_bytes`` sees progress)."""
    ordered = sorted(regions, key=lambda region: region[1])
    digests = {name: hashlib.sha256() for name, _offset, _size in ordered}
    whole = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK_SIZE))
    pos = index = 0
    with path.open("rb") as fh:
        while n := fh.readinto(buffer):
            chunk, end = buffer[:n], pos + n
            whole.update(chunk)
            while index < len(ordered) and ordered[index][1] < end:
                name, offset, size = ordered[index]
                lo, hi = max(offset, pos), min(offset + size, end)
                if hi > lo:
                    digests[name].update(chunk[lo - pos : hi - pos])
                if offset + size > end:
                    break
                index += 1
            pos = end
            if on_bytes is not None:
                on_bytes(n)
    return whole.hexdigest(), {name: digest.hexdigest() for name, digest in digests.items()}
