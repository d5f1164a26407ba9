"""A bounded GGUF header reader: every count, length and offset is checked against the file size first.

``gguf.GGUFReader`` 0.19.0 trusts the file: it loops on an array length near 2**63 and never compares tensor
offsets with the file size. :func:`scan_gguf` refuses such files with a :class:`~llamaforge.core.errors.ModelError`
that says what is wrong and where, and it is fast: the 151 936-token Qwen vocabulary parses in well under a
second (GGUFReader needs ~9 s). Values are copied out (strings stay ``bytes``, byte-exact); tensor data is not
read. :func:`hash_gguf` hashes a file and each tensor's data in one sequential pass with a fixed buffer.

Little-endian GGUF versions 2 and 3; nested arrays are refused.

Why not :func:`llamaforge.gguf.header.read_header`: that parser serves inspection and verification (local or
remote sources, long arrays summarised, strings decoded with ``errors="replace"``), so a file rewritten from its
values could change token texts that are not valid UTF-8. Rewriting needs every value kept byte-exact.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import mmap
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import gguf

from llamaforge.core.errors import ModelError

__all__ = ["CHUNK_SIZE", "GGUFLayout", "KeyValue", "TensorInfo", "hash_gguf", "scan_gguf"]

#: Bytes read per call when streaming tensor data: the bound on the memory hashing and copying need.
CHUNK_SIZE: Final[int] = 4 << 20

_V = gguf.GGUFValueType
_ALIGNMENT_KEY: Final[str] = gguf.Keys.General.ALIGNMENT


_SCALARS: Final[Mapping[gguf.GGUFValueType, str]] = {
    _V.UINT8: "B", _V.INT8: "b", _V.UINT16: "H", _V.INT16: "h", _V.UINT32: "I", _V.INT32: "i",
    _V.FLOAT32: "f", _V.UINT64: "Q", _V.INT64: "q", _V.FLOAT64: "d", _V.BOOL: "?",
}  # fmt: skip
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_GGML_MAX_DIMS: Final[int] = 4
_HEADER_SIZE: Final[int] = 24
_MIN_KV_SIZE: Final[int] = 8 + 4 + 1  # key length, type, smallest value
_MIN_TENSOR_INFO_SIZE: Final[int] = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset


@dataclass(frozen=True)
class KeyValue:
    """One metadata key: its GGUF type, its value (strings as bytes, arrays as tuples) and item type."""

    key: str
    vtype: gguf.GGUFValueType
    value: Any  # int | float | bool | bytes (strings stay bytes) | tuple for arrays
    sub_type: gguf.GGUFValueType | None = None


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's data lies: ``ne`` in ggml order (innermost first), ``offset`` absolute."""

    name: str
    ne: tuple[int, ...]
    ggml_type: gguf.GGMLQuantizationType
    offset: int  # absolute file offset of the data
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    """A GGUF file's header, checked against its size."""

    path: Path
    size: int
    version: int
    alignment: int
    kvs: tuple[KeyValue, ...]
    tensors: tuple[TensorInfo, ...]

    def get(self, key: str) -> KeyValue | None:
        """The key ``key``, or None."""
        return next((kv for kv in self.kvs if kv.key == key), None)


_RawInfo = tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, int]  # name, ne, type, relative offset


class _Parser:
    """Walks a GGUF header; every length is checked against the file size before it is used."""

    def __init__(self, path: Path, buf: mmap.mmap, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, detail: str) -> ModelError:
        return ModelError(
            f"{self.path} is truncated or corrupt ({self.size} bytes): {detail}",
            hint="download or convert the file again and compare its size and sha256 with the source",
        )

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or n > self.size - start:
            raise self.fail(f"{what} at byte {start} needs {n} bytes, but the file ends at byte {self.size}")
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.buf, self.need(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack_from(self.buf, self.need(8, what))[0])

    def string(self, what: str) -> bytes:
        length = self.u64(f"length of {what}")
        start = self.need(length, what)
        return self.buf[start : start + length]

    def text(self, what: str) -> str:
        raw = self.string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} {raw[:60]!r} is not UTF-8") from None

    def value_type(self, raw: int, key: str) -> gguf.GGUFValueType:
        try:
            return _V(raw)
        except ValueError:
            raise self.fail(f"key {key!r} has unknown value type {raw}") from None

    def value(self, vtype: gguf.GGUFValueType, key: str) -> tuple[Any, gguf.GGUFValueType | None]:
        if vtype == _V.STRING:
            return self.string(f"value of {key!r}"), None
        if vtype in _SCALARS:
            fmt = "<" + _SCALARS[vtype]
            return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), f"value of {key!r}"))[
                0
            ], None
        sub = self.value_type(self.u32(f"array type of {key!r}"), key)
        count = self.u64(f"array length of {key!r}")
        if sub == _V.ARRAY:
            raise ModelError(f"{self.path}: key {key!r} is a nested array, which llamaforge cannot rewrite")
        item = 8 if sub == _V.STRING else struct.calcsize("<" + _SCALARS[sub])
        if count > (self.size - self.pos) // item:  # the bound GGUFReader lacks
            raise self.fail(f"array {key!r} claims {count} items, more than the rest of the file can hold")
        if sub != _V.STRING:
            fmt = f"<{count}{_SCALARS[sub]}"
            return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), f"array {key!r}")), sub
        items: list[bytes] = []
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        for index in range(count):  # hot loop (300k strings in a Qwen vocabulary): no method calls
            if size - pos < 8:
                self.pos = pos
                raise self.fail(f"item {index} of array {key!r} runs past the end of the file")
            length = unpack(buf, pos)[0]
            pos += 8
            if length > size - pos:
                self.pos = pos
                raise self.fail(f"item {index} of array {key!r} runs past the end of the file")
            items.append(buf[pos : pos + length])
            pos += length
        self.pos = pos
        return tuple(items), sub

    def parse(self) -> GGUFLayout:
        magic = self.need(4, "magic")
        if self.buf[magic : magic + 4] != b"GGUF":
            raise ModelError(f"{self.path} is not a GGUF file (magic {self.buf[magic : magic + 4]!r})")
        version = self.u32("version")
        if version & 0xFFFF == 0 and version:
            raise ModelError(f"{self.path} is a big-endian GGUF file, which llamaforge cannot rewrite")
        if version not in (2, 3):
            raise ModelError(f"{self.path} is GGUF version {version}; llamaforge reads versions 2 and 3")
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("metadata count")
        room = self.size - _HEADER_SIZE
        if n_kv > room // _MIN_KV_SIZE or n_tensors > room // _MIN_TENSOR_INFO_SIZE:
            raise self.fail(f"the header claims {n_tensors} tensors and {n_kv} keys, too many for the file")
        kvs: list[KeyValue] = []
        seen: set[str] = set()
        for _ in range(n_kv):
            key = self.text("metadata key")
            if key in seen:
                raise self.fail(f"duplicate metadata key {key!r}")
            seen.add(key)
            vtype = self.value_type(self.u32(f"type of {key!r}"), key)
            value, sub = self.value(vtype, key)
            kvs.append(KeyValue(key, vtype, value, sub))
        alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        for kv in kvs:
            if kv.key == _ALIGNMENT_KEY:
                if kv.vtype != _V.UINT32 or kv.value <= 0 or kv.value & (kv.value - 1):
                    raise self.fail(f"{_ALIGNMENT_KEY} must be a uint32 power of two, not {kv.value!r}")
                alignment = kv.value
        infos = [self.tensor_info() for _ in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        return GGUFLayout(
            self.path, self.size, version, alignment, tuple(kvs), self.place(infos, data_start, alignment)
        )

    def tensor_info(self) -> _RawInfo:
        name = self.text("tensor name")
        n_dims = self.u32(f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= _GGML_MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions (ggml allows 1..{_GGML_MAX_DIMS})")
        ne = tuple(self.u64(f"shape of tensor {name!r}") for _ in range(n_dims))
        raw_type = self.u32(f"type of tensor {name!r}")
        try:
            ggml_type = gguf.GGMLQuantizationType(raw_type)
            block = gguf.GGML_QUANT_SIZES[ggml_type][0]
        except (ValueError, KeyError):
            raise self.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        if ne[0] % block:
            raise self.fail(
                f"tensor {name!r}: row of {ne[0]} is not a multiple of {ggml_type.name}'s {block}"
            )
        offset = self.u64(f"data offset of tensor {name!r}")
        return name, ne, ggml_type, offset

    def place(self, infos: list[_RawInfo], data_start: int, alignment: int) -> tuple[TensorInfo, ...]:
        tensors: list[TensorInfo] = []
        names: set[str] = set()
        for name, ne, ggml_type, offset in infos:
            if name in names:
                raise self.fail(f"duplicate tensor name {name!r}")
            names.add(name)
            block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
            nbytes = math.prod(ne) // block * type_size
            start = data_start + offset
            if offset % alignment:
                raise self.fail(f"tensor {name!r} has data offset {offset}, not a multiple of {alignment}")
            if start + nbytes > self.size:
                raise self.fail(
                    f"tensor {name!r} needs bytes {start}..{start + nbytes}, but the file ends at byte "
                    f"{self.size} ({start + nbytes - self.size} bytes missing)"
                )
            tensors.append(TensorInfo(name, ne, ggml_type, start, nbytes))
        ordered = sorted(tensors, key=lambda t: t.offset)
        for before, after in itertools.pairwise(ordered):
            if after.offset < before.offset + before.nbytes:
                raise self.fail(f"tensors {before.name!r} and {after.name!r} overlap")
        return tuple(tensors)


def scan_gguf(path: Path) -> GGUFLayout:
    """Parse and bound-check ``path``'s header; ModelError names what is truncated or corrupt, and where."""
    try:
        size = path.stat().st_size
        if size < _HEADER_SIZE:
            raise ModelError(
                f"{path} is truncated or corrupt: {size} bytes is too short for a GGUF header",
                hint="download or convert the file again",
            )
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Parser(path, buf, size).parse()
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error.strerror or error}") from None


def hash_gguf(
    path: Path, tensors: Iterable[TensorInfo], on_bytes: Callable[[int], None] | None = None
) -> tuple[str, dict[str, str]]:
    """The sha256 of ``path`` and of each tensor's data, in one sequential read (``on_bytes`` sees progress)."""
    regions = sorted(tensors, key=lambda t: t.offset)
    digests = {t.name: hashlib.sha256() for t in regions}
    whole = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK_SIZE))
    pos = index = 0
    with path.open("rb") as fh:
        while n := fh.readinto(buffer):
            chunk, end = buffer[:n], pos + n
            whole.update(chunk)
            while index < len(regions) and regions[index].offset < end:
                tensor = regions[index]
                lo, hi = max(tensor.offset, pos), min(tensor.offset + tensor.nbytes, end)
                if hi > lo:
                    digests[tensor.name].update(chunk[lo - pos : hi - pos])
                if tensor.offset + tensor.nbytes > end:
                    break
                index += 1
            pos = end
            if on_bytes is not None:
                on_bytes(n)
    return whole.hexdigest(), {name: digest.hexdigest() for name, digest in digests.items()}
