"""Rewrite a GGUF file: canonical tensor names, declarative metadata edits, streamed data, verified output.

Third-party converters sometimes keep Hugging Face (``model.layers.0.self_attn.q_proj.weight``) or Meta
(``layers.0.attention.wq.weight``) tensor names in GGUF files; stock llama.cpp looks tensors up by its own
names (``blk.0.attn_q.weight``) and refuses them. :func:`remap_gguf` renames every tensor through
``gguf.TensorNameMap`` for the file's architecture and block count, applies the metadata edits of a rules file
(``recipes/remaps/*.toml``: set / rename / delete keys, an optional relabel of ``general.architecture``) and
copies the tensor bytes unchanged, a few MiB at a time. The output is written next to the destination,
re-read and compared with the input (tensor names, types, shapes, sha256 of every tensor's bytes, every
metadata key), and only then renamed into place.

The input is parsed by a bounded reader of its own, not ``gguf.GGUFReader``: every count, length and offset
is checked against the file size before it is used, so a truncated or crafted file gives a clear error
instead of a hang (GGUFReader 0.19.0 loops on array lengths near 2**63), and the 151 936-token Qwen
vocabulary parses in well under a second (GGUFReader takes ~9 s). The output is written by ``gguf.GGUFWriter``.

What it does not do: convert tensor data (no transposes, no merging of per-expert tensors, no dtype change),
write big-endian files, or set array-valued keys.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import mmap
import os
import re
import struct
import tempfile
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import gguf
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from llamaforge.errors import InvalidOption, ModelError, RecipeError
from llamaforge.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.resources import data_dir

__all__ = [
    "MatchRules",
    "MetadataChange",
    "MetadataRules",
    "RemapParams",
    "RemapResult",
    "RemapRules",
    "TypedValue",
    "list_rules",
    "load_rules",
    "parse_rules",
    "remap_from_params",
    "remap_gguf",
    "rules_dir",
]

#: Bytes copied (and hashed) per read: the bound on the memory a remap needs for tensor data.
CHUNK_SIZE: Final[int] = 4 << 20
_PROGRESS_STEP: Final[int] = 64 << 20
_STAGE: Final[str] = "remap"

_V = gguf.GGUFValueType
_K = gguf.Keys
_ARCH_KEY: Final[str] = _K.General.ARCHITECTURE
_ALIGNMENT_KEY: Final[str] = _K.General.ALIGNMENT
_BLOCK_COUNT_KEY: Final[str] = _K.LLM.BLOCK_COUNT

GGUFTypeName = Literal[
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "float64", "bool",
    "string",
]  # fmt: skip
_TYPE_BY_NAME: Final[Mapping[str, Any]] = {
    name: _V[name.upper()]
    for name in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32",
                 "float64", "bool", "string")
}  # fmt: skip

# How llama.cpp reads the keys rules usually edit (the types GGUFWriter's add_* methods write). llama.cpp
# refuses a key stored with another type, so a rule may not change these types.
_KNOWN_TYPES: Final[Mapping[str, Any]] = {
    _K.General.NAME: _V.STRING,
    _K.General.DESCRIPTION: _V.STRING,
    _ARCH_KEY: _V.STRING,
    _K.Tokenizer.CHAT_TEMPLATE: _V.STRING,
    _K.LLM.CONTEXT_LENGTH: _V.UINT32,
    _K.LLM.EXPERT_USED_COUNT: _V.UINT32,
    _K.Rope.FREQ_BASE: _V.FLOAT32,
    _K.Rope.SCALING_TYPE: _V.STRING,
    _K.Rope.SCALING_FACTOR: _V.FLOAT32,
    _K.Rope.SCALING_ORIG_CTX_LEN: _V.UINT32,
    _K.Rope.SCALING_FINETUNED: _V.BOOL,
}
_ROPE_SCALING_TYPES: Final[tuple[str, ...]] = tuple(t.value for t in gguf.RopeScalingType)

# Keys the file's layout depends on: editing them would make the tensors disagree with the metadata.
_PROTECTED: Final[Mapping[str, str]] = {
    _ALIGNMENT_KEY: "the tensor data layout depends on it",
    _BLOCK_COUNT_KEY: "the tensors are laid out per block; a remap never adds or drops blocks",
}

_INT_RANGES: Final[Mapping[Any, tuple[int, int]]] = {
    _V.UINT8: (0, 2**8 - 1), _V.INT8: (-(2**7), 2**7 - 1),
    _V.UINT16: (0, 2**16 - 1), _V.INT16: (-(2**15), 2**15 - 1),
    _V.UINT32: (0, 2**32 - 1), _V.INT32: (-(2**31), 2**31 - 1),
    _V.UINT64: (0, 2**64 - 1), _V.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip
_FLOAT32_MAX: Final[float] = 3.4028234663852886e38
_KEY_RE: Final[re.Pattern[str]] = re.compile(r"^(?:\{arch\}|[A-Za-z0-9_-]+)(?:\.[A-Za-z0-9_-]+)*$")


def _type_name(vtype: Any) -> str:
    return str(vtype.name).lower()


def _coerce(value: object, vtype: Any) -> Any:
    """``value`` (from TOML) as stored for a key of GGUF type ``vtype``; ValueError says what fits."""
    name = _type_name(vtype)
    if vtype in _INT_RANGES:
        low, high = _INT_RANGES[vtype]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expects an integer ({name}), not {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range for {name} ({low}..{high})")
        return value
    if vtype in (_V.FLOAT32, _V.FLOAT64):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expects a number ({name}), not {value!r}")
        number = float(value)
        if not math.isfinite(number) or (vtype == _V.FLOAT32 and abs(number) > _FLOAT32_MAX):
            raise ValueError(f"{value!r} is not a finite {name}")
        # store what the file will hold, so verification compares like with like
        return struct.unpack("<f", struct.pack("<f", number))[0] if vtype == _V.FLOAT32 else number
    if vtype == _V.BOOL:
        if not isinstance(value, bool):
            raise ValueError(f"expects true or false, not {value!r}")
        return value
    if vtype == _V.STRING:
        if not isinstance(value, str):
            raise ValueError(f"expects a string, not {value!r}")
        return value.encode("utf-8")
    raise ValueError(f"values of GGUF type {name} cannot be set by a rule")


def _known_type(key: str) -> Any | None:
    """GGUF type llama.cpp expects for ``key`` (``{arch}.…`` or ``qwen3.…``), or None."""
    if key in _KNOWN_TYPES:
        return _KNOWN_TYPES[key]
    head, dot, rest = key.partition(".")
    if dot and not head.startswith("general") and not head.startswith("tokenizer"):
        return _KNOWN_TYPES.get("{arch}." + rest)
    return None


# ------------------------------------------------------------------------------------------------- rules


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RuleScalar = StrictBool | StrictInt | StrictFloat | StrictStr


class TypedValue(_Strict):
    """A metadata value; ``type`` is the GGUF type (default: the key's type in the file, or llama.cpp's)."""

    type: GGUFTypeName | None = Field(default=None, description="GGUF type, e.g. uint32, float32, string")
    value: Any = Field(description="The value: an integer, number, string or boolean")

    @model_validator(mode="after")
    def _value_fits(self) -> TypedValue:
        if isinstance(self.value, list | dict) or not isinstance(self.value, bool | int | float | str):
            raise ValueError(f"value must be an integer, number, string or boolean, not {self.value!r}")
        if self.type is not None:
            _coerce(self.value, _TYPE_BY_NAME[self.type])
        return self


class MatchRules(_Strict):
    """Preconditions: a file that fails them is refused, never half-edited."""

    architectures: list[str] = Field(
        default_factory=list, description="general.architecture must be one of these (empty: any)"
    )
    metadata: dict[str, list[RuleScalar]] = Field(
        default_factory=dict, description="KEY = value or [values]: the key must hold one of the values"
    )
    absent: list[str] = Field(default_factory=list, description="Keys that must not be in the file")

    @field_validator("metadata", mode="before")
    @classmethod
    def _scalars_to_lists(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: v if isinstance(v, list) else [v] for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _valid_keys(self) -> MatchRules:
        for key in [*self.metadata, *self.absent]:
            _check_key_syntax(key)
        return self


class MetadataRules(_Strict):
    """Metadata edits, applied in this order: rename, delete, set. ``{arch}`` in a key is the file's arch."""

    rename: dict[str, str] = Field(default_factory=dict, description="OLD = NEW: move a key, keep its value")
    delete: list[str] = Field(default_factory=list, description="Keys to remove (absent keys are skipped)")
    set_: dict[str, TypedValue] = Field(
        default_factory=dict,
        alias="set",
        description="KEY = value, or KEY = { type = ..., value = ... } for a key llamaforge does not know",
    )

    @field_validator("set_", mode="before")
    @classmethod
    def _typed(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        typed: dict[str, Any] = {}
        for key, item in value.items():
            known = _known_type(str(key))
            entry = dict(item) if isinstance(item, dict) else {"value": item}
            given = entry.get("type")
            if known is not None:
                if given is not None and given != _type_name(known):
                    raise ValueError(f"{key}: llama.cpp reads this key as {_type_name(known)}, not {given}")
                entry.setdefault("type", _type_name(known))
            typed[key] = entry
        return typed

    @model_validator(mode="after")
    def _consistent(self) -> MetadataRules:
        seen: dict[str, str] = {}
        for op, keys in (("rename", [*self.rename, *self.rename.values()]), ("delete", self.delete),
                         ("set", list(self.set_))):  # fmt: skip
            for key in keys:
                _check_key_syntax(key)
                if key in seen and not (op == "rename" and seen[key] == "rename"):
                    raise ValueError(f"{key} appears in both {seen[key]} and {op}")
                seen[key] = op
        for key in [*self.rename, *self.rename.values(), *self.delete, *self.set_]:
            if key in _PROTECTED:
                raise ValueError(f"{key} cannot be edited: {_PROTECTED[key]}")
        for key in [*self.rename, *self.rename.values(), *self.delete]:
            if key == _ARCH_KEY:
                raise ValueError(f"{_ARCH_KEY} can only be set (a relabel), not renamed or deleted")
        scaling = self.set_.get(_K.Rope.SCALING_TYPE)
        if scaling is not None and scaling.value not in _ROPE_SCALING_TYPES:
            raise ValueError(
                f"{_K.Rope.SCALING_TYPE} must be one of {', '.join(_ROPE_SCALING_TYPES)} "
                f"(llama.cpp aborts on anything else), not {scaling.value!r}"
            )
        arch = self.set_.get(_ARCH_KEY)
        if arch is not None:
            _model_arch(str(arch.value), what="set general.architecture")
        return self


class RemapRules(_Strict):
    """A remap rules file (``recipes/remaps/NAME.toml``). Tensor names are always made canonical."""

    name: str = Field(default="", description="Rules name (the file name without .toml)")
    description: str = ""
    match: MatchRules = Field(default_factory=MatchRules)
    metadata: MetadataRules = Field(default_factory=MetadataRules)
    _origin: str = PrivateAttr(default="")

    @property
    def origin(self) -> str:
        """Where the rules came from, for messages (the file path, else the name)."""
        return self._origin or self.name or "(inline rules)"


def _check_key_syntax(key: str) -> None:
    if not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"{key!r} is not a metadata key (dotted words; '{{arch}}' may start it, e.g. '{{arch}}.context_length')"
        )


def rules_dir() -> Path:
    """Directory of the shipped remap rules."""
    return data_dir("recipes") / "remaps"


def list_rules() -> list[str]:
    """Names of the shipped remap rules files."""
    return sorted(path.stem for path in rules_dir().glob("*.toml"))


def _resolve_rules(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or "/" in text or os.sep in text:
        if not candidate.is_file():
            raise RecipeError(f"remap rules file {candidate} does not exist", hint="check the path")
        return candidate
    path = rules_dir() / f"{text}.toml"
    if not path.is_file():
        known = list_rules()
        close = difflib.get_close_matches(text, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RecipeError(
            f"unknown remap rules {text!r}",
            hint=hint + "known rules: " + (", ".join(known) or "none") + f" (in {rules_dir()})",
        )
    return path


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """Keys valid next to the last element of ``loc`` (for "did you mean")."""
    model: type[BaseModel] | None = None
    if len(loc) == 1:
        model = RemapRules
    elif len(loc) == 2 and loc[0] == "match":
        model = MatchRules
    elif len(loc) == 2 and loc[0] == "metadata":
        model = MetadataRules
    elif len(loc) == 4 and loc[:2] == ("metadata", "set"):
        model = TypedValue
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _describe(origin: str, error: ValidationError) -> RecipeError:
    problems: list[str] = []
    hints: list[str] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        dotted = ".".join(str(part) for part in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            problems.append(f"{dotted}: unknown key")
            close = difflib.get_close_matches(str(loc[-1]), _fields_at(loc), n=1)
            if close:
                hints.append(f"did you mean {close[0]!r} instead of {loc[-1]!r}?")
        else:
            problems.append(f"{dotted}: {str(item['msg']).removeprefix('Value error, ')}")
    return RecipeError(
        f"invalid remap rules {origin}:\n  " + "\n  ".join(problems),
        hint=" ".join(hints) or "see recipes/remaps/*.toml for examples",
    )


def parse_rules(data: Mapping[str, Any], *, name: str, origin: str | Path) -> RemapRules:
    """Validate rules ``data`` (parsed TOML); ``origin`` is named in errors."""
    try:
        rules = RemapRules.model_validate({**data, "name": name})
    except ValidationError as error:
        raise _describe(str(origin), error) from None
    rules._origin = str(origin)
    return rules


def load_rules(name_or_path: str | Path) -> RemapRules:
    """Load remap rules by name (``recipes/remaps/NAME.toml``) or by path."""
    path = _resolve_rules(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"remap rules {path} are not valid TOML: {error}", hint="fix the syntax") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecipeError(f"cannot read remap rules {path}: {error}") from None
    return parse_rules(data, name=path.stem, origin=path)


# ------------------------------------------------------------------------------------- bounded reader

_SCALARS: Final[Mapping[Any, str]] = {
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
class _KV:
    key: str
    vtype: Any
    value: Any  # int | float | bool | bytes (strings stay bytes) | tuple for arrays
    sub_type: Any = None


@dataclass(frozen=True)
class _Tensor:
    name: str
    ne: tuple[int, ...]  # ggml order (innermost first)
    ggml_type: Any
    offset: int  # absolute file offset of the data
    nbytes: int


@dataclass(frozen=True)
class _Layout:
    path: Path
    size: int
    version: int
    alignment: int
    kvs: tuple[_KV, ...]
    tensors: tuple[_Tensor, ...]

    def get(self, key: str) -> _KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)


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

    def value_type(self, raw: int, key: str) -> Any:
        try:
            return _V(raw)
        except ValueError:
            raise self.fail(f"key {key!r} has unknown value type {raw}") from None

    def value(self, vtype: Any, key: str) -> tuple[Any, Any]:
        if vtype == _V.STRING:
            return self.string(f"value of {key!r}"), None
        if vtype in _SCALARS:
            fmt = "<" + _SCALARS[vtype]
            return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), f"value of {key!r}"))[0], None
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

    def parse(self) -> _Layout:
        magic = self.need(4, "magic")
        if self.buf[magic : magic + 4] != b"GGUF":
            raise ModelError(f"{self.path} is not a GGUF file (magic {self.buf[magic:magic + 4]!r})")
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
        kvs: list[_KV] = []
        seen: set[str] = set()
        for _ in range(n_kv):
            key = self.text("metadata key")
            if key in seen:
                raise self.fail(f"duplicate metadata key {key!r}")
            seen.add(key)
            vtype = self.value_type(self.u32(f"type of {key!r}"), key)
            value, sub = self.value(vtype, key)
            kvs.append(_KV(key, vtype, value, sub))
        alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        for kv in kvs:
            if kv.key == _ALIGNMENT_KEY:
                if kv.vtype != _V.UINT32 or kv.value <= 0 or kv.value & (kv.value - 1):
                    raise self.fail(f"{_ALIGNMENT_KEY} must be a uint32 power of two, not {kv.value!r}")
                alignment = kv.value
        infos = [self.tensor_info() for _ in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        return _Layout(self.path, self.size, version, alignment, tuple(kvs), self.place(infos, data_start, alignment))

    def tensor_info(self) -> tuple[str, tuple[int, ...], Any, int]:
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
            raise self.fail(f"tensor {name!r}: row of {ne[0]} is not a multiple of {ggml_type.name}'s {block}")
        offset = self.u64(f"data offset of tensor {name!r}")
        return name, ne, ggml_type, offset

    def place(
        self, infos: list[tuple[str, tuple[int, ...], Any, int]], data_start: int, alignment: int
    ) -> tuple[_Tensor, ...]:
        tensors: list[_Tensor] = []
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
            tensors.append(_Tensor(name, ne, ggml_type, start, nbytes))
        ordered = sorted(tensors, key=lambda t: t.offset)
        for before, after in zip(ordered, ordered[1:], strict=False):
            if after.offset < before.offset + before.nbytes:
                raise self.fail(f"tensors {before.name!r} and {after.name!r} overlap")
        return tuple(tensors)


def _scan(path: Path) -> _Layout:
    """Parse and bound-check ``path``'s header (values are copied out; the file is closed on return)."""
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
