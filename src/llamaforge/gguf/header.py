"""The one GGUF header reader: hardened (it never trusts the file), with a summarising and a byte-exact mode.

gguf 0.19.0's ``GGUFReader`` memory-maps a file and trusts its counts; a crafted array length near 2^63 makes
it hang. This parser reads the header (magic, version, key/value metadata, tensor infos) through a
:class:`~llamaforge.gguf.sources.ByteSource`, so the same code reads a local file or a remote one through HTTP
range requests, and checks every count and length against the bytes that remain (and against sane caps)
*before* it reads or allocates anything. Every failure is a :class:`GGUFFormatError` naming the byte offset and
the field.

Two modes, one parser. Inspection and verification (the default) summarise arrays longer than
``HeaderLimits.keep_array_items`` and decode strings leniently (invalid UTF-8 in token texts becomes U+FFFD),
so memory stays bounded on any file. Rewriting (``exact=True``, :mod:`llamaforge.models.remap`) keeps every
value byte-exact: strings stay ``bytes``, arrays come back whole as tuples, so a file written back from the
values loses nothing.

The checks follow llama.cpp b11312's ``gguf_init_from_reader``: version 2 or 3, non-empty unique keys, known
value types (no nested arrays), ``general.alignment`` a uint32 power of two, tensor names shorter than
GGML_MAX_NAME and unique, at most GGML_MAX_DIMS non-negative dims whose product fits in int64, a known ggml
type whose block size divides the row, offsets aligned; and beyond it: every tensor's data inside the file and
no two tensors overlapping.
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from llamaforge.core.errors import ModelError
from llamaforge.gguf.sources import ByteSource, FileSource

__all__ = [
    "GGML_TYPES",
    "ArraySummary",
    "GGMLType",
    "GGUFFormatError",
    "GGUFHeader",
    "HeaderLimits",
    "LongString",
    "TensorInfo",
    "read_header",
]

GGUF_MAGIC: Final = b"GGUF"
GGML_MAX_DIMS: Final = 4
GGML_MAX_NAME: Final = 64  # names must be shorter (llama.cpp keeps a NUL-terminated char[64])
DEFAULT_ALIGNMENT: Final = 32
INT64_MAX: Final = (1 << 63) - 1
_MIN_TENSOR_INFO: Final = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_MIN_KV: Final = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, smallest value


class GGUFFormatError(ModelError):
    """The file is not a well-formed GGUF: names the byte offset and the field where parsing stopped."""

    def __init__(
        self, message: str, *, source: str, offset: int, field: str, hint: str | None = None
    ) -> None:
        super().__init__(
            f"{source}: {message} (field {field} at byte {offset})",
            hint=hint
            or "the file is truncated, corrupt or not a GGUF model: download or convert it again and compare "
            "its size and sha256 with the source",
        )
        self.source = source
        self.offset = offset
        self.field = field


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: ``block_size`` elements take ``type_size`` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


# ggml types a GGUF may hold (ggml.h of the same release); ids 4, 5 and 31-33, 36-38 were removed from the format.
GGML_TYPES: Final[dict[int, GGMLType]] = {
    t.id: t
    for t in (
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(9, "Q8_1", 32, 40),
        GGMLType(10, "Q2_K", 256, 84),
        GGMLType(11, "Q3_K", 256, 110),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
        GGMLType(15, "Q8_K", 256, 292),
        GGMLType(16, "IQ2_XXS", 256, 66),
        GGMLType(17, "IQ2_XS", 256, 74),
        GGMLType(18, "IQ3_XXS", 256, 98),
        GGMLType(19, "IQ1_S", 256, 50),
        GGMLType(20, "IQ4_NL", 32, 18),
        GGMLType(21, "IQ3_S", 256, 110),
        GGMLType(22, "IQ2_S", 256, 82),
        GGMLType(23, "IQ4_XS", 256, 136),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", 256, 56),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", 256, 54),
        GGMLType(35, "TQ2_0", 256, 66),
        GGMLType(39, "MXFP4", 32, 17),
        GGMLType(40, "NVFP4", 64, 36),
        GGMLType(41, "Q1_0", 128, 18),
        GGMLType(42, "Q2_0", 64, 18),
    )
}

# GGUF value types: id -> (name, struct format or None for string/array, size in bytes).
_SCALARS: Final[dict[int, tuple[str, str, int]]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "B", 1),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}
_STRING: Final = 8
_ARRAY: Final = 9
_BOOL: Final = 7


@dataclass(frozen=True)
class HeaderLimits:
    """Caps on top of "fits in the remaining bytes"; the defaults accept every real model."""

    max_key_length: int = 65535  # GGUF spec: keys are at most 2^16-1 bytes
    max_string_length: int = 1 << 30  # llama.cpp GGUF_MAX_STRING_LENGTH
    max_array_items: int = 1 << 30  # llama.cpp GGUF_MAX_ARRAY_ELEMENTS
    max_kv: int = 1 << 20
    max_tensors: int = 1 << 20
    # Values beyond these are walked and checked but kept as summaries, so memory stays bounded.
    keep_array_items: int = 1024
    keep_string_bytes: int = 16 << 20


DEFAULT_LIMITS: Final = HeaderLimits()


@dataclass(frozen=True)
class ArraySummary:
    """An array too long to keep (e.g. ``tokenizer.ggml.tokens``): its item type, length and first items."""

    item_type: str
    count: int
    head: tuple[Any, ...]

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class LongString:
    """A string value too long to keep in memory: its length and first characters."""

    length: int
    head: str


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: ``shape`` in ggml order (``ne[0]`` first, the row length), ``offset`` relative to the data
    section, ``nbytes`` its size in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        """Number of elements (product of the dims)."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the tensor data, parsed and checked."""

    source: str
    file_size: int
    version: int
    metadata: dict[str, Any]  # exact mode: strings as bytes, arrays as tuples
    value_types: dict[str, str]  # GGUF type names: "uint32", "string", "array[string]", …
    tensors: list[TensorInfo]
    alignment: int
    header_end: int  # first byte after the tensor infos
    data_offset: int  # start of the (aligned) tensor data section
    packed: bool = field(
        default=True
    )  # offsets are what llama.cpp expects: in order, each padded to alignment

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` when it is a string (in either mode)."""
        value = self.metadata.get("general.architecture")
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        return value if isinstance(value, str) else None

    def absolute_offset(self, tensor: TensorInfo) -> int:
        """Where ``tensor``'s data starts in the file."""
        return self.data_offset + tensor.offset

    @property
    def data_end(self) -> int:
        """First byte after the last tensor's data."""
        return max((self.data_offset + t.offset + t.nbytes for t in self.tensors), default=self.data_offset)


# ------------------------------------------------------------------------------------------------ parser


class _Cursor:
    """Sequential reads over a source, buffered in chunks, every read bounded by the file size."""

    def __init__(self, source: ByteSource, chunk: int = 1 << 20) -> None:
        self.source = source
        self.size = source.size
        self.pos = 0
        self._buf = b""
        self._base = 0
        self._chunk = chunk

    def fail(
        self, message: str, field: str, offset: int | None = None, hint: str | None = None
    ) -> GGUFFormatError:
        return GGUFFormatError(
            message,
            source=self.source.name,
            offset=self.pos if offset is None else offset,
            field=field,
            hint=hint,
        )

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def _window(self, n: int, field: str) -> int:
        """Make bytes [pos, pos+n) available; returns their index in the buffer."""
        if n > self.size - self.pos:
            raise self.fail(f"file ends after {self.size} bytes, {n} more needed", field)
        rel = self.pos - self._base
        if rel < 0 or rel + n > len(self._buf):
            want = min(max(n, self._chunk), self.size - self.pos)
            data = self.source.read_at(self.pos, want)
            if len(data) < n:
                raise self.fail(f"short read: {len(data)} of {n} bytes", field)
            self._buf, self._base, rel = data, self.pos, 0
        return rel

    def unpack(self, fmt: str, size: int, field: str) -> Any:
        rel = self._window(size, field)
        self.pos += size
        return struct.unpack_from(fmt, self._buf, rel)[0]

    def take(self, n: int, field: str) -> bytes:
        rel = self._window(n, field)
        self.pos += n
        return self._buf[rel : rel + n]

    def skip(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"file ends after {self.size} bytes, {n} more needed", field)
        self.pos += n

    def length(self, field: str, cap: int, unit: int = 1) -> int:
        """A uint64 count of ``unit``-byte items, checked against ``cap`` and the bytes that remain."""
        start = self.pos
        value: int = self.unpack("<Q", 8, field)
        if value > cap:
            raise self.fail(f"length {value} exceeds the limit {cap}", field, start)
        if value * unit > self.size - self.pos:
            raise self.fail(
                f"length {value} runs past the end of the file ({self.remaining} bytes left)", field, start
            )
        return value

    def skip_strings(self, first: int, count: int, cap: int, field: str) -> None:
        """Walk items ``first`` to ``count - 1`` of a string array without keeping them (the hot loop for
        token lists)."""
        unpack = _U64.unpack_from
        size, pos, base, buf = self.size, self.pos, self._base, self._buf
        for index in range(first, count):
            rel = pos - base
            if rel < 0 or rel + 8 > len(buf):
                self.pos = pos
                rel = self._window(8, f"{field}[{index}] (string length)")
                base, buf = self._base, self._buf
            n = unpack(buf, rel)[0]
            if n > cap or n > size - pos - 8:
                self.pos = pos
                self.length(f"{field}[{index}] (string length)", cap)  # raises with the right message
            pos += 8 + n
        self.pos = pos

    def take_strings(self, count: int, cap: int, field: str) -> tuple[bytes, ...]:
        """The ``count`` items of a string array as raw bytes (the same hot loop, keeping each item)."""
        unpack = _U64.unpack_from
        items: list[bytes] = []
        size, pos, base, buf = self.size, self.pos, self._base, self._buf
        for index in range(count):
            rel = pos - base
            if rel < 0 or rel + 8 > len(buf):
                self.pos = pos
                rel = self._window(8, f"{field}[{index}] (string length)")
                base, buf = self._base, self._buf
            n = unpack(buf, rel)[0]
            if n > cap or n > size - pos - 8:
                self.pos = pos
                self.length(f"{field}[{index}] (string length)", cap)  # raises with the right message
            if rel + 8 + n > len(buf):
                self.pos = pos
                rel = self._window(8 + n, f"{field}[{index}]")
                base, buf = self._base, self._buf
            items.append(buf[rel + 8 : rel + 8 + n])
            pos += 8 + n
        self.pos = pos
        return tuple(items)


_U64: Final = struct.Struct("<Q")


def _decode(raw: bytes, cursor: _Cursor, field: str, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise cursor.fail("is not valid UTF-8", field, offset) from None


def _read_string(cursor: _Cursor, field: str, limits: HeaderLimits, exact: bool) -> str | LongString | bytes:
    n = cursor.length(field, limits.max_string_length)
    if exact:
        return cursor.take(n, field)
    if n > limits.keep_string_bytes:
        head = cursor.take(4096, field).decode("utf-8", errors="replace")
        cursor.skip(n - 4096, field)
        return LongString(n, head)
    # Values (token texts) may hold invalid UTF-8 that llama.cpp accepts: keep them readable, never fail.
    return cursor.take(n, field).decode("utf-8", errors="replace")


def _read_value(cursor: _Cursor, vtype: int, key: str, limits: HeaderLimits, exact: bool) -> Any:
    if vtype == _STRING:
        return _read_string(cursor, f"{key} (string length)", limits, exact)
    name, fmt, size = _SCALARS[vtype]
    value = cursor.unpack("<" + fmt, size, f"{key} ({name})")
    return bool(value) if vtype == _BOOL else value


def _read_array(cursor: _Cursor, key: str, limits: HeaderLimits, exact: bool) -> tuple[Any, str]:
    """An array's value and type name: whole (a tuple of raw items) when ``exact``, else a list, or an
    :class:`ArraySummary` past ``limits.keep_array_items``."""
    start = cursor.pos
    item_type: int = cursor.unpack("<I", 4, f"{key} (array item type)")
    if item_type == _ARRAY:
        raise cursor.fail("nested arrays are not supported by llama.cpp", f"{key} (array item type)", start)
    if item_type != _STRING and item_type not in _SCALARS:
        raise cursor.fail(f"unknown array item type {item_type}", f"{key} (array item type)", start)
    unit = 8 if item_type == _STRING else _SCALARS[item_type][2]
    count = cursor.length(f"{key} (array length)", limits.max_array_items, unit)
    type_name = "string" if item_type == _STRING else _SCALARS[item_type][0]
    keep = exact or count <= limits.keep_array_items
    n_read = count if keep else min(count, 8)
    if item_type == _STRING and exact:
        return cursor.take_strings(count, limits.max_string_length, key), f"array[{type_name}]"
    if item_type == _STRING:
        items: list[Any] = [
            _read_string(cursor, f"{key}[{index}] (string length)", limits, exact) for index in range(n_read)
        ]
        cursor.skip_strings(n_read, count, limits.max_string_length, key)
    else:
        _name, fmt, size = _SCALARS[item_type]
        raw = cursor.take(n_read * size, f"{key} (array data)")
        items = list(struct.unpack(f"<{n_read}{fmt}", raw))
        if item_type == _BOOL:
            items = [bool(item) for item in items]
        cursor.skip((count - n_read) * size, f"{key} (array data)")
    value: Any = (tuple(items) if exact else items) if keep else ArraySummary(type_name, count, tuple(items))
    return value, f"array[{type_name}]"


def _read_kv(
    cursor: _Cursor, n_kv: int, limits: HeaderLimits, exact: bool
) -> tuple[dict[str, Any], dict[str, str], dict[str, int]]:
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    offsets: dict[str, int] = {}
    for index in range(n_kv):
        start = cursor.pos
        field = f"kv[{index}].key"
        raw = cursor.take(cursor.length(field, limits.max_key_length), field)
        if not raw:
            raise cursor.fail("empty key", field, start)
        key = _decode(raw, cursor, field, start)
        if key in metadata:
            raise cursor.fail(f"duplicate key {key!r}", field, start)
        offsets[key] = start
        type_at = cursor.pos
        vtype: int = cursor.unpack("<I", 4, f"{key} (value type)")
        if vtype == _ARRAY:
            metadata[key], types[key] = _read_array(cursor, key, limits, exact)
        elif vtype == _STRING or vtype in _SCALARS:
            metadata[key] = _read_value(cursor, vtype, key, limits, exact)
            types[key] = "string" if vtype == _STRING else _SCALARS[vtype][0]
        else:
            raise cursor.fail(f"unknown value type {vtype}", f"{key} (value type)", type_at)
    return metadata, types, offsets


def _alignment(metadata: dict[str, Any], types: dict[str, str], at: int, cursor: _Cursor) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if types["general.alignment"] != "uint32":
        raise cursor.fail(f"must be uint32, not {types['general.alignment']}", "general.alignment", at)
    if value <= 0 or value & (value - 1):
        raise cursor.fail(f"alignment {value} is not a power of 2", "general.alignment", at)
    return int(value)


def _read_tensor_info(cursor: _Cursor, index: int, alignment: int, seen: set[str]) -> tuple[TensorInfo, int]:
    start = cursor.pos
    field = f"tensor[{index}].name"
    raw = cursor.take(cursor.length(field, 1 << 16), field)
    if not raw or len(raw) >= GGML_MAX_NAME:
        raise cursor.fail(f"tensor name must be 1..{GGML_MAX_NAME - 1} bytes, not {len(raw)}", field, start)
    name = _decode(raw, cursor, field, start)
    if name in seen:
        raise cursor.fail(f"duplicate tensor name {name!r}", field, start)
    seen.add(name)
    where = f"tensor {name!r}"
    dims_at = cursor.pos
    n_dims: int = cursor.unpack("<I", 4, f"{where} n_dims")
    if n_dims > GGML_MAX_DIMS:
        raise cursor.fail(f"{n_dims} dimensions, at most {GGML_MAX_DIMS}", f"{where} n_dims", dims_at)
    shape = []
    for axis in range(n_dims):
        at = cursor.pos
        dim: int = cursor.unpack("<Q", 8, f"{where} ne[{axis}]")
        if dim > INT64_MAX:
            raise cursor.fail(f"dimension {dim} is negative as int64", f"{where} ne[{axis}]", at)
        shape.append(dim)
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if n_elements > INT64_MAX:
        raise cursor.fail(f"shape {shape} has more than 2^63-1 elements", f"{where} shape", dims_at)
    type_at = cursor.pos
    type_id: int = cursor.unpack("<I", 4, f"{where} ggml type")
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise cursor.fail(f"unknown ggml type {type_id}", f"{where} ggml type", type_at)
    row = shape[0] if shape else 1
    if row % ggml_type.block_size:
        raise cursor.fail(
            f"row of {row} elements is not a multiple of {ggml_type.name}'s block size {ggml_type.block_size}",
            f"{where} shape",
            dims_at,
        )
    nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
    offset_at = cursor.pos
    offset: int = cursor.unpack("<Q", 8, f"{where} offset")
    if offset % alignment:
        raise cursor.fail(
            f"data offset {offset} is not a multiple of the alignment {alignment}",
            f"{where} offset",
            offset_at,
        )
    return TensorInfo(name, tuple(shape), ggml_type, offset, nbytes), offset_at


def _check_layout(
    cursor: _Cursor, tensors: list[TensorInfo], fields_at: list[int], data_offset: int, alignment: int
) -> bool:
    """Every tensor inside the file, no two overlapping; returns whether the layout is llama.cpp's packed one.

    Errors point at the tensor info's offset field (``fields_at``), where the bad value is.
    """
    for tensor, at in zip(tensors, fields_at, strict=True):
        start, end = data_offset + tensor.offset, data_offset + tensor.offset + tensor.nbytes
        if end > cursor.size:
            raise cursor.fail(
                f"tensor {tensor.name!r} data [{start}, {end}) runs past the end of the file ({cursor.size} bytes, "
                f"{end - cursor.size} bytes missing)",
                f"tensor {tensor.name!r} offset",
                at,
            )
    ordered = sorted(range(len(tensors)), key=lambda i: (tensors[i].offset, i))
    for first, second in itertools.pairwise(ordered):
        before, after = tensors[first], tensors[second]
        if after.offset < before.offset + before.nbytes:
            raise cursor.fail(
                f"tensor {after.name!r} data [{after.offset}, {after.offset + after.nbytes}) overlaps tensor "
                f"{before.name!r} data [{before.offset}, {before.offset + before.nbytes}) (relative offsets)",
                f"tensor {after.name!r} offset",
                fields_at[second],
            )
    expected = 0
    for tensor in tensors:
        if tensor.offset != expected:
            return False
        expected += -(-tensor.nbytes // alignment) * alignment
    return True


def read_header(
    source: str | os.PathLike[str] | ByteSource, *, exact: bool = False, limits: HeaderLimits = DEFAULT_LIMITS
) -> GGUFHeader:
    """Parse and check the GGUF header of ``source`` (a path or a :class:`~llamaforge.gguf.sources.ByteSource`).

    Raises :class:`GGUFFormatError` (with the byte offset and field) for anything malformed; never reads or
    allocates more than the file holds. By default (inspection) arrays longer than ``limits.keep_array_items``
    come back as :class:`ArraySummary`, strings longer than ``limits.keep_string_bytes`` as :class:`LongString`
    and strings are decoded leniently. With ``exact`` (rewriting) every value is kept byte-exact: strings as
    ``bytes``, arrays whole as tuples of raw items.
    """
    if isinstance(source, (str, os.PathLike)):
        with FileSource(Path(source)) as file_source:
            return read_header(file_source, exact=exact, limits=limits)
    cursor = _Cursor(source, chunk=getattr(source, "preferred_chunk", 1 << 20))
    if cursor.take(4, "magic") != GGUF_MAGIC:
        raise cursor.fail("not a GGUF file (bad magic)", "magic", 0)
    version: int = cursor.unpack("<I", 4, "version")
    if version & 0xFFFF == 0 and version:
        raise cursor.fail(
            f"version {version:#x} looks byte-swapped: big-endian GGUF is not supported", "version", 4
        )
    if version not in (2, 3):
        raise cursor.fail(f"unsupported GGUF version {version} (llama.cpp reads 2 and 3)", "version", 4)
    n_tensors = cursor.length("tensor count", limits.max_tensors, _MIN_TENSOR_INFO)
    n_kv = cursor.length("kv count", limits.max_kv, _MIN_KV)
    metadata, types, offsets = _read_kv(cursor, n_kv, limits, exact)
    alignment = _alignment(metadata, types, offsets.get("general.alignment", 0), cursor)
    seen: set[str] = set()
    infos = [_read_tensor_info(cursor, index, alignment, seen) for index in range(n_tensors)]
    tensors = [tensor for tensor, _at in infos]
    header_end = cursor.pos
    data_offset = -(-header_end // alignment) * alignment if tensors else header_end
    if data_offset > cursor.size:
        raise cursor.fail(
            f"data section would start at {data_offset}, past the end of the file", "data section", header_end
        )
    packed = _check_layout(cursor, tensors, [at for _tensor, at in infos], data_offset, alignment)
    return GGUFHeader(
        source=source.name,
        file_size=cursor.size,
        version=version,
        metadata=metadata,
        value_types=types,
        tensors=tensors,
        alignment=alignment,
        header_end=header_end,
        data_offset=data_offset,
        packed=packed,
    )
