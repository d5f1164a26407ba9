"""Remap rules: typed, frozen models loaded from ``recipes/remaps/*.toml``.

A rules file guards which files it applies to (``[match]``) and edits metadata (``[metadata]``: rename, delete,
set, in that order; ``{arch}`` in a key stands for the file's architecture). Setting ``general.architecture``
is a relabel, which :mod:`llamaforge.models.remap` refuses when the tensors do not fit the target arch. Values are
typed: the keys llama.cpp reads with a fixed type (context length, rope base and scaling, chat template, name)
are checked against that type here; other keys keep the type they have in the file, or take an explicit
``{ type = "uint32", value = … }``. Errors name the file and the field; unknown keys get "did you mean".
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args

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

from llamaforge.build.recipes import resolve_named_file
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import read_toml, recipe_error, suggest

__all__ = [
    "ARCH_KEY",
    "GGUF_TYPES",
    "KNOWN_KEY_TYPES",
    "MatchRules",
    "MetadataRules",
    "RemapRules",
    "TypedValue",
    "coerce_value",
    "list_rules",
    "load_rules",
    "model_arch",
    "parse_rules",
    "rules_dir",
    "rules_json_schema",
]

_V = gguf.GGUFValueType
_K = gguf.Keys
ARCH_KEY: Final[str] = _K.General.ARCHITECTURE
_ALIGNMENT_KEY: Final[str] = _K.General.ALIGNMENT
_BLOCK_COUNT_KEY: Final[str] = _K.LLM.BLOCK_COUNT

GGUFTypeName = Literal[
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float32",
    "float64",
    "bool",
    "string",
]
GGUF_TYPES: Final[Mapping[str, gguf.GGUFValueType]] = {
    name: gguf.GGUFValueType[name.upper()] for name in get_args(GGUFTypeName)
}

# How llama.cpp reads the keys rules usually edit (the types GGUFWriter's add_* methods write). llama.cpp
# refuses a key stored with another type, so a rule may not change these types.
KNOWN_KEY_TYPES: Final[Mapping[str, gguf.GGUFValueType]] = {
    _K.General.NAME: _V.STRING,
    _K.General.DESCRIPTION: _V.STRING,
    ARCH_KEY: _V.STRING,
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

_INT_RANGES: Final[Mapping[gguf.GGUFValueType, tuple[int, int]]] = {
    _V.UINT8: (0, 2**8 - 1),
    _V.INT8: (-(2**7), 2**7 - 1),
    _V.UINT16: (0, 2**16 - 1),
    _V.INT16: (-(2**15), 2**15 - 1),
    _V.UINT32: (0, 2**32 - 1),
    _V.INT32: (-(2**31), 2**31 - 1),
    _V.UINT64: (0, 2**64 - 1),
    _V.INT64: (-(2**63), 2**63 - 1),
}
_FLOAT32_MAX: Final[float] = 3.4028234663852886e38
_KEY_RE: Final[re.Pattern[str]] = re.compile(r"^(?:\{arch\}|[A-Za-z0-9_-]+)(?:\.[A-Za-z0-9_-]+)*$")


def _type_name(vtype: gguf.GGUFValueType) -> str:
    return str(vtype.name).lower()


def coerce_value(value: object, vtype: gguf.GGUFValueType) -> int | float | bool | bytes:
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
        return float(struct.unpack("<f", struct.pack("<f", number))[0]) if vtype == _V.FLOAT32 else number
    if vtype == _V.BOOL:
        if not isinstance(value, bool):
            raise ValueError(f"expects true or false, not {value!r}")
        return value
    if vtype == _V.STRING:
        if not isinstance(value, str):
            raise ValueError(f"expects a string, not {value!r}")
        return value.encode("utf-8")
    raise ValueError(f"values of GGUF type {name} cannot be set by a rule")


def _template(key: str) -> str:
    """``qwen3.context_length`` → ``{arch}.context_length``; ``general.*`` and ``tokenizer.*`` stay."""
    head, dot, rest = key.partition(".")
    return "{arch}." + rest if dot and head not in ("general", "tokenizer", "{arch}") else key


def _known_type(key: str) -> gguf.GGUFValueType | None:
    """GGUF type llama.cpp expects for ``key`` (``{arch}.…`` or ``qwen3.…``), or None."""
    return KNOWN_KEY_TYPES.get(_template(key))


def model_arch(name: str, *, what: str) -> gguf.MODEL_ARCH:
    """The ``gguf.MODEL_ARCH`` for ``name``; ValueError (with "did you mean") when gguf does not know it."""
    for member, arch in gguf.MODEL_ARCH_NAMES.items():
        if arch == name:
            return member
    close = suggest(name, gguf.MODEL_ARCH_NAMES.values())
    raise ValueError(
        f"{what}: the gguf package does not know architecture {name!r}" + (f"; {close}" if close else "")
    )


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
            coerce_value(self.value, GGUF_TYPES[self.type])
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
        for op, keys in (
            ("rename", [*self.rename, *self.rename.values()]),
            ("delete", self.delete),
            ("set", list(self.set_)),
        ):
            for key in keys:
                _check_key_syntax(key)
                if key in seen and not (op == "rename" and seen[key] == "rename"):
                    raise ValueError(f"{key} appears in both {seen[key]} and {op}")
                seen[key] = op
        for key in [*self.rename, *self.rename.values(), *self.delete, *self.set_]:
            if _template(key) in _PROTECTED:
                raise ValueError(f"{key} cannot be edited: {_PROTECTED[_template(key)]}")
        for key in [*self.rename, *self.rename.values(), *self.delete]:
            if key == ARCH_KEY:
                raise ValueError(f"{ARCH_KEY} can only be set (a relabel), not renamed or deleted")
        scaling = next((v for k, v in self.set_.items() if _template(k) == _K.Rope.SCALING_TYPE), None)
        if scaling is not None and scaling.value not in _ROPE_SCALING_TYPES:
            raise ValueError(
                f"{_K.Rope.SCALING_TYPE} must be one of {', '.join(_ROPE_SCALING_TYPES)} "
                f"(llama.cpp aborts on anything else), not {scaling.value!r}"
            )
        arch = self.set_.get(ARCH_KEY)
        if arch is not None:
            model_arch(str(arch.value), what="set general.architecture")
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
    return resolve_named_file(name_or_path, rules_dir(), "remap rules")


def parse_rules(data: Mapping[str, Any], *, name: str, origin: str | Path) -> RemapRules:
    """Validate rules ``data`` (parsed TOML); ``origin`` is named in errors."""
    try:
        rules = RemapRules.model_validate({**data, "name": name})
    except ValidationError as error:
        raise recipe_error(
            error,
            what=f"remap rules {origin}",
            root=RemapRules,
            hint="see recipes/remaps/*.toml for examples",
        ) from None
    rules._origin = str(origin)
    return rules


def load_rules(name_or_path: str | Path) -> RemapRules:
    """Load remap rules by name (``recipes/remaps/NAME.toml``) or by path."""
    path = _resolve_rules(name_or_path)
    return parse_rules(read_toml(path, "remap rules file"), name=path.stem, origin=path)


def rules_json_schema() -> str:
    """The JSON schema of remap rules files."""
    return json.dumps(RemapRules.model_json_schema(by_alias=True), indent=2, sort_keys=True) + "\n"
