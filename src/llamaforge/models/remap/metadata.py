"""Metadata for the remap: a file's keys as the writer takes them, and a rules file's edits applied to them.

The keys come from the byte-exact mode of :func:`llamaforge.gguf.header.read_header` (strings as bytes, arrays
whole), so keys the rules leave alone are written back unchanged. A rules file may require keys (``[match]``),
rename, delete and set keys, and relabel ``general.architecture`` (its ``{arch}.*`` keys move with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gguf

from llamaforge.core.errors import InvalidOption, ModelError, RecipeError
from llamaforge.core.validation import suggest
from llamaforge.gguf.header import GGUFHeader
from llamaforge.models.remap.names import arch_member
from llamaforge.models.remap.rules import ARCH_KEY, GGUF_TYPES, KNOWN_KEY_TYPES, RemapRules, coerce_value

__all__ = [
    "KeyValue",
    "MetadataChange",
    "MetadataPlan",
    "architecture",
    "display",
    "key_value",
    "key_values",
    "plan_metadata",
    "same_value",
]

_V = gguf.GGUFValueType


def display(value: Any) -> Any:
    """A metadata value as JSON and messages show it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, tuple):
        return f"<array of {len(value)} items>"
    return value


@dataclass(frozen=True)
class KeyValue:
    """One metadata key as the writer takes it: GGUF type, value (strings as bytes, arrays as tuples), item type."""

    key: str
    vtype: gguf.GGUFValueType
    value: Any
    sub_type: gguf.GGUFValueType | None = None


def key_value(header: GGUFHeader, key: str) -> KeyValue | None:
    """``key`` of an exact-mode header with its gguf types, or None."""
    if key not in header.metadata:
        return None
    type_name = header.value_types[key]
    if type_name.startswith("array["):
        item = gguf.GGUFValueType[type_name.removeprefix("array[").removesuffix("]").upper()]
        return KeyValue(key, _V.ARRAY, header.metadata[key], item)
    return KeyValue(key, gguf.GGUFValueType[type_name.upper()], header.metadata[key])


def key_values(header: GGUFHeader) -> dict[str, KeyValue]:
    """Every key of an exact-mode header, in file order."""
    return {key: kv for key in header.metadata if (kv := key_value(header, key)) is not None}


def architecture(header: GGUFHeader) -> str:
    """``general.architecture`` of an exact-mode header; ModelError when the file has none (not a model)."""
    kv = key_value(header, ARCH_KEY)
    if kv is None or kv.vtype != _V.STRING:
        raise ModelError(f"{header.source} has no {ARCH_KEY} string key; it is not a model GGUF")
    return str(display(kv.value))


@dataclass(frozen=True)
class MetadataChange:
    """One metadata edit the remap made (or found already made: ``note="unchanged"``)."""

    op: Literal["set", "rename", "delete", "relabel"]
    key: str
    old: Any = None
    new: Any = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (strings decoded, arrays summarised)."""
        data = {"op": self.op, "key": self.key, "old": display(self.old), "new": display(self.new)}
        if self.note:
            data["note"] = self.note
        return data


def same_value(a: Any, b: Any) -> bool:
    """Equal metadata values, NaN equal to NaN (element-wise for arrays)."""
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return math.isnan(a) and math.isnan(b)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return False


def _holds(kv: KeyValue, wanted: object) -> bool:
    if kv.vtype == _V.ARRAY:
        return False
    try:
        return same_value(coerce_value(wanted, kv.vtype), kv.value)
    except ValueError:
        return False


@dataclass
class MetadataPlan:
    """The output's metadata (in order), the edits made, warnings and the output architecture."""

    kvs: dict[str, KeyValue]
    arch: str
    changes: list[MetadataChange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _check_match(header: GGUFHeader, arch: str, rules: RemapRules) -> None:
    match, origin, name = rules.match, rules.origin, Path(header.source).name
    hint = "pick rules written for this model, or remap without rules (names only)"
    if match.architectures and arch not in match.architectures:
        raise ModelError(
            f"remap rules {origin} are for {', '.join(match.architectures)}; {name} is {arch}", hint=hint
        )
    for key, allowed in match.metadata.items():
        full = key.replace("{arch}", arch)
        kv = key_value(header, full)
        if kv is None or not any(_holds(kv, value) for value in allowed):
            found = "does not have it" if kv is None else f"has {display(kv.value)!r}"
            raise ModelError(
                f"remap rules {origin} apply only when {full} is one of {allowed}; {name} {found}", hint=hint
            )
    for key in match.absent:
        full = key.replace("{arch}", arch)
        kv = key_value(header, full)
        if kv is not None:
            raise ModelError(
                f"remap rules {origin} apply only to files without {full}; {name} has it "
                f"({display(kv.value)!r})",
                hint=hint,
            )


def _apply_edits(plan: MetadataPlan, header: GGUFHeader, rules: RemapRules) -> str | None:
    """Rename, delete, set; returns the architecture a ``set general.architecture`` asks for."""
    arch, origin, name = plan.arch, rules.origin, Path(header.source).name
    meta = rules.metadata

    def expand(key: str) -> str:
        return key.replace("{arch}", arch)

    renames = {expand(old): expand(new) for old, new in meta.rename.items()}
    deletes = {expand(key) for key in meta.delete}
    for old, new in renames.items():
        if old not in plan.kvs:
            raise ModelError(
                f"remap rules {origin}: metadata.rename: {name} has no key {old}",
                hint=suggest(old, plan.kvs) or "list the file's keys with gguf-dump",
            )
        if new in plan.kvs and new not in renames and new not in deletes:
            raise ModelError(f"remap rules {origin}: metadata.rename: {name} already has {new}")
    if renames:
        plan.kvs = {
            renames.get(k, k): KeyValue(renames.get(k, k), kv.vtype, kv.value, kv.sub_type)
            for k, kv in plan.kvs.items()
        }
        plan.changes.extend(MetadataChange("rename", new, old=old, new=new) for old, new in renames.items())
    for key in sorted(deletes):
        removed = plan.kvs.pop(key, None)
        if removed is None:
            plan.changes.append(MetadataChange("delete", key, note="already absent"))
        else:
            plan.changes.append(MetadataChange("delete", key, old=removed.value))
    relabel: str | None = None
    for key, typed in meta.set_.items():
        full = expand(key)
        if full == ARCH_KEY:
            relabel = str(typed.value)
            continue
        existing = plan.kvs.get(full)
        vtype = GGUF_TYPES[typed.type] if typed.type else (existing.vtype if existing else None)
        where = f"remap rules {origin}: metadata.set.{key}"
        if vtype is None:
            known = [*plan.kvs, *(k.format(arch=arch) for k in KNOWN_KEY_TYPES)]
            raise RecipeError(
                f"{where}: {name} has no key {full} and its GGUF type is unknown",
                hint=suggest(full, known, end=" ")
                + f'to add a new key, give its type: "{key}" = {{ type = "uint32", value = … }}',
            )
        if vtype == _V.ARRAY:
            raise RecipeError(f"{where}: {full} is an array in {name}; rules cannot set arrays")
        try:
            value = coerce_value(typed.value, vtype)
        except ValueError as error:
            raise RecipeError(f"{where}: {full} {error}") from None
        if existing is not None and existing.vtype == vtype and same_value(existing.value, value):
            plan.changes.append(MetadataChange("set", full, old=value, new=value, note="unchanged"))
            continue
        plan.kvs[full] = KeyValue(full, vtype, value)
        plan.changes.append(MetadataChange("set", full, old=existing.value if existing else None, new=value))
    return relabel


def plan_metadata(
    header: GGUFHeader, arch: str, rules: RemapRules | None, target_arch: str | None
) -> MetadataPlan:
    """The output's metadata (in order), the edits made and the output architecture."""
    plan = MetadataPlan(kvs=key_values(header), arch=arch)
    relabel: str | None = None
    if rules is not None:
        _check_match(header, arch, rules)
        relabel = _apply_edits(plan, header, rules)
    if target_arch and relabel and target_arch != relabel:
        raise InvalidOption(
            f"target architecture {target_arch!r} contradicts the rules' general.architecture = {relabel!r}"
        )
    out_arch = target_arch or relabel or arch
    if out_arch == arch:
        return plan
    arch_member(out_arch, what="relabel")
    prefix, new_prefix = f"{arch}.", f"{out_arch}."
    moved = {k: new_prefix + k.removeprefix(prefix) for k in plan.kvs if k.startswith(prefix)}
    for old, new in moved.items():
        if new in plan.kvs:
            raise ModelError(
                f"cannot relabel {Path(header.source).name} to {out_arch}: it has both {old} and {new}"
            )
    plan.kvs = {
        moved.get(k, k): KeyValue(moved.get(k, k), kv.vtype, kv.value, kv.sub_type)
        for k, kv in plan.kvs.items()
    }
    plan.kvs[ARCH_KEY] = KeyValue(ARCH_KEY, _V.STRING, out_arch.encode("utf-8"))
    plan.changes.append(
        MetadataChange(
            "relabel",
            ARCH_KEY,
            old=arch,
            new=out_arch,
            note=f"{len(moved)} {arch}.* keys renamed to {out_arch}.*",
        )
    )
    plan.arch = out_arch
    return plan
