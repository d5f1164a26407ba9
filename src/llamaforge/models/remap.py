"""Rewrite a GGUF file: canonical tensor names, declarative metadata edits, streamed data, verified output.

Third-party converters sometimes keep Hugging Face (``model.layers.0.self_attn.q_proj.weight``) or Meta
(``layers.0.attention.wq.weight``) tensor names in GGUF files; stock llama.cpp looks tensors up by its own
names (``blk.0.attn_q.weight``) and refuses them. :func:`remap_gguf` renames every tensor through
``gguf.TensorNameMap`` for the file's architecture and block count, applies the metadata edits of a rules file
(``recipes/remaps/*.toml``: set / rename / delete keys, an optional relabel of ``general.architecture``) and
copies the tensor bytes unchanged, a few MiB at a time. The output is written next to the destination,
re-read and compared with the input (every metadata key; tensor names, types, shapes and the sha256 of every
tensor's bytes), and only then renamed into place.

The input is parsed by :func:`llamaforge.gguf.header.read_header` in its byte-exact mode, which checks every
length against the file size (a truncated or crafted file is an error, never a hang) and keeps every value as
the file holds it (strings as bytes, arrays whole); the output is written by ``gguf.GGUFWriter``.

Tensors are renamed only for the architectures whose Hugging Face → GGUF conversion changes names and nothing
else (:data:`llamaforge.models.remap_table.REMAP_ARCHS`: qwen3, qwen3moe); a file of another architecture passes
when its names are canonical already (metadata edits only). A remap never converts tensor data: no
transposes, no stacking of per-expert tensors, no dtype change.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import gguf
import numpy as np

from llamaforge.core.errors import InvalidOption, ModelError, RecipeError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.validation import suggest
from llamaforge.gguf.header import GGUFHeader, TensorInfo, read_header
from llamaforge.gguf.sources import CHUNK_SIZE, hash_gguf
from llamaforge.models.remap_rules import (
    ARCH_KEY,
    GGUF_TYPES,
    KNOWN_KEY_TYPES,
    MatchRules,
    MetadataRules,
    RemapRules,
    TypedValue,
    coerce_value,
    list_rules,
    load_rules,
    model_arch,
    parse_rules,
    rules_dir,
)
from llamaforge.models.remap_table import REMAP_ARCHS

# The rules API is re-exported: callers of remap_gguf need RemapRules and load_rules.
__all__ = [
    "MatchRules",
    "MetadataChange",
    "MetadataRules",
    "RemapResult",
    "RemapRules",
    "TypedValue",
    "list_rules",
    "load_rules",
    "parse_rules",
    "remap_gguf",
    "rules_dir",
]

_PROGRESS_STEP: Final[int] = 64 << 20
_STAGE: Final[str] = "remap"

_V = gguf.GGUFValueType
_BLOCK_COUNT_KEY: Final[str] = gguf.Keys.LLM.BLOCK_COUNT
_ALIGNMENT_KEY: Final[str] = gguf.Keys.General.ALIGNMENT

# ------------------------------------------------------------------------------------------------ planning

_SUFFIXES: Final[tuple[str, ...]] = (".weight", ".bias")


def _arch_member(name: str, *, what: str) -> gguf.MODEL_ARCH:
    try:
        return model_arch(name, what=what)
    except ValueError as error:
        raise ModelError(str(error)) from None


def _kind_label(kind: gguf.MODEL_TENSOR) -> str:
    return str(gguf.TENSOR_NAMES[kind]).removeprefix("blk.{bid}.")


def _some(names: Iterable[str], limit: int = 6) -> str:
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def _display(value: Any) -> Any:
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


def _key(header: GGUFHeader, key: str) -> KeyValue | None:
    """``key`` of an exact-mode header with its gguf types, or None."""
    if key not in header.metadata:
        return None
    type_name = header.value_types[key]
    if type_name.startswith("array["):
        item = gguf.GGUFValueType[type_name.removeprefix("array[").removesuffix("]").upper()]
        return KeyValue(key, _V.ARRAY, header.metadata[key], item)
    return KeyValue(key, gguf.GGUFValueType[type_name.upper()], header.metadata[key])


def _key_values(header: GGUFHeader) -> dict[str, KeyValue]:
    """Every key of an exact-mode header, in file order."""
    return {key: kv for key in header.metadata if (kv := _key(header, key)) is not None}


@dataclass(frozen=True)
class _Mapped:
    tensor: TensorInfo
    name: str  # canonical
    kind: gguf.MODEL_TENSOR
    start: int  # absolute offset of the data in the input


def _architecture(header: GGUFHeader) -> str:
    kv = _key(header, ARCH_KEY)
    if kv is None or kv.vtype != _V.STRING:
        raise ModelError(f"{header.source} has no {ARCH_KEY} string key; it is not a model GGUF")
    return str(_display(kv.value))


# TensorNameMap.__init__ merges an arch's block overrides (arctic's) into the class-level table in place,
# changing every map built after it; each of these maps works on its own copy, taken at import.
_BLOCK_TABLE: Final = dict(gguf.TensorNameMap.block_mappings_cfg)


class _IsolatedNameMap(gguf.TensorNameMap):
    def __init__(self, arch: gguf.MODEL_ARCH, n_blocks: int) -> None:
        self.block_mappings_cfg = dict(_BLOCK_TABLE)
        super().__init__(arch, n_blocks)


def _canonical_tensors(header: GGUFHeader, arch: str) -> list[_Mapped]:
    """Every tensor with its llama.cpp name, in file order; refuses names that map to nothing."""
    gguf_arch = _arch_member(arch, what=f"{Path(header.source).name}: cannot map tensor names")
    block_key = _BLOCK_COUNT_KEY.format(arch=arch)
    blocks = _key(header, block_key)
    if (
        blocks is None
        or isinstance(blocks.value, bool)
        or not isinstance(blocks.value, int)
        or blocks.value < 0
    ):
        raise ModelError(
            f"{header.source} has no integer {block_key} key, so its tensor names cannot be mapped"
        )
    n_blocks = int(blocks.value)
    name_map = _IsolatedNameMap(gguf_arch, n_blocks)
    canonical: dict[str, gguf.MODEL_TENSOR] = {}
    for kind in gguf.MODEL_TENSORS[gguf_arch]:
        template = str(gguf.TENSOR_NAMES[kind])
        if "{bid}" in template:
            canonical.update((template.format(bid=bid), kind) for bid in range(n_blocks))
        else:
            canonical[template] = kind
    mapped: list[_Mapped] = []
    unmapped: list[str] = []
    for tensor in header.tensors:
        suffix = next((s for s in _SUFFIXES if tensor.name.endswith(s)), "")
        base = tensor.name.removesuffix(suffix) if suffix else tensor.name
        if base in canonical:  # already llama.cpp's name: never re-mapped
            mapped.append(_Mapped(tensor, tensor.name, canonical[base], header.absolute_offset(tensor)))
            continue
        hit = name_map.get_type_and_name(tensor.name, try_suffixes=_SUFFIXES)
        if hit is None:
            unmapped.append(tensor.name)
        else:
            mapped.append(_Mapped(tensor, str(hit[1]), hit[0], header.absolute_offset(tensor)))
    if unmapped:
        raise ModelError(
            f"{Path(header.source).name}: {len(unmapped)} tensor name(s) map to no llama.cpp {arch} tensor "
            f"({block_key} = {n_blocks}): {_some(unmapped)}",
            hint=f"the file is not a {arch} model with {n_blocks} blocks, or a converter used names "
            "gguf.TensorNameMap does not know (per-expert tensors, for example, must be stacked, not renamed); "
            "llama.cpp would refuse these tensors too",
        )
    renamed = [item.tensor.name for item in mapped if item.tensor.name != item.name]
    if renamed and arch not in REMAP_ARCHS:
        raise ModelError(
            f"{Path(header.source).name}: {len(renamed)} tensor(s) have non-canonical names ({_some(renamed, 3)}), and "
            f"llamaforge renames tensors only for {', '.join(REMAP_ARCHS)}, not {arch}",
            hint=f"for {arch}, Hugging Face → GGUF conversion may change values as well as names; convert the "
            "original checkpoint with llama.cpp's convert_hf_to_gguf.py instead",
        )
    owners: dict[str, str] = {}
    for item in mapped:
        if item.name in owners:
            raise ModelError(
                f"{Path(header.source).name}: tensors {owners[item.name]!r} and {item.tensor.name!r} "
                f"both map to {item.name!r}",
                hint="the file holds the same weight twice under two naming styles; remove one copy",
            )
        owners[item.name] = item.tensor.name
    return mapped


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
        data = {"op": self.op, "key": self.key, "old": _display(self.old), "new": _display(self.new)}
        if self.note:
            data["note"] = self.note
        return data


def _same_value(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return math.isnan(a) and math.isnan(b)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return False


def _holds(kv: KeyValue, wanted: object) -> bool:
    if kv.vtype == _V.ARRAY:
        return False
    try:
        return _same_value(coerce_value(wanted, kv.vtype), kv.value)
    except ValueError:
        return False


@dataclass
class _MetadataPlan:
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
        kv = _key(header, full)
        if kv is None or not any(_holds(kv, value) for value in allowed):
            found = "does not have it" if kv is None else f"has {_display(kv.value)!r}"
            raise ModelError(
                f"remap rules {origin} apply only when {full} is one of {allowed}; {name} {found}", hint=hint
            )
    for key in match.absent:
        full = key.replace("{arch}", arch)
        kv = _key(header, full)
        if kv is not None:
            raise ModelError(
                f"remap rules {origin} apply only to files without {full}; {name} has it "
                f"({_display(kv.value)!r})",
                hint=hint,
            )


def _apply_edits(plan: _MetadataPlan, header: GGUFHeader, rules: RemapRules) -> str | None:
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
        plan.kvs = {renames.get(k, k): KeyValue(renames.get(k, k), kv.vtype, kv.value, kv.sub_type)
                    for k, kv in plan.kvs.items()}  # fmt: skip
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
        if existing is not None and existing.vtype == vtype and _same_value(existing.value, value):
            plan.changes.append(MetadataChange("set", full, old=value, new=value, note="unchanged"))
            continue
        plan.kvs[full] = KeyValue(full, vtype, value)
        plan.changes.append(MetadataChange("set", full, old=existing.value if existing else None, new=value))
    return relabel


def _plan_metadata(
    header: GGUFHeader, arch: str, rules: RemapRules | None, target_arch: str | None
) -> _MetadataPlan:
    """The output's metadata (in order), the edits made and the output architecture."""
    plan = _MetadataPlan(kvs=_key_values(header), arch=arch)
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
    _arch_member(out_arch, what="relabel")
    prefix, new_prefix = f"{arch}.", f"{out_arch}."
    moved = {k: new_prefix + k.removeprefix(prefix) for k in plan.kvs if k.startswith(prefix)}
    for old, new in moved.items():
        if new in plan.kvs:
            raise ModelError(
                f"cannot relabel {Path(header.source).name} to {out_arch}: it has both {old} and {new}"
            )
    plan.kvs = {moved.get(k, k): KeyValue(moved.get(k, k), kv.vtype, kv.value, kv.sub_type)
                for k, kv in plan.kvs.items()}  # fmt: skip
    plan.kvs[ARCH_KEY] = KeyValue(ARCH_KEY, _V.STRING, out_arch.encode("utf-8"))
    plan.changes.append(
        MetadataChange("relabel", ARCH_KEY, old=arch, new=out_arch,
                       note=f"{len(moved)} {arch}.* keys renamed to {out_arch}.*")
    )  # fmt: skip
    plan.arch = out_arch
    return plan


def _check_relabel(mapped: list[_Mapped], arch: str, out_arch: str, path: Path) -> list[str]:
    """Refuse a relabel whose tensors the target arch does not have; warn about what it may lack."""
    target = set(gguf.MODEL_TENSORS[_arch_member(out_arch, what="relabel")])
    rejected = [item for item in mapped if item.kind not in target]
    if rejected:
        kinds = sorted({_kind_label(item.kind) for item in rejected})
        raise ModelError(
            f"refusing to relabel {path.name} from {arch} to {out_arch}: llama.cpp's {out_arch} has no "
            f"{', '.join(kinds)} tensors, so it would reject {len(rejected)} of the file's tensors "
            f"({_some(item.name for item in rejected)})",
            hint=f"{arch} is not {out_arch} and a relabel never converts weights; keep general.architecture = "
            f"{arch!r} and run a llama.cpp that supports {arch}",
        )
    source = set(gguf.MODEL_TENSORS[_arch_member(arch, what="relabel")])
    extra = sorted(_kind_label(kind) for kind in target - source)
    warnings = [
        f"relabel {arch} → {out_arch}: every tensor fits {out_arch}, but gguf.MODEL_TENSORS cannot say which "
        f"tensors and {out_arch}.* keys llama.cpp requires; check the result loads"
    ]
    if extra:
        warnings.append(f"{out_arch} may use tensors no {arch} file holds: {_some(extra)}")
    return warnings


def _check_writable(kvs: Iterable[KeyValue], mapped: Iterable[_Mapped], path: Path) -> None:
    for item in mapped:
        tensor = item.tensor
        if not tensor.shape:
            raise ModelError(
                f"{path.name}: tensor {tensor.name} has no dimensions, which gguf's writer cannot write"
            )
        try:
            gguf.GGMLQuantizationType(tensor.ggml_type.id)
        except ValueError:
            raise ModelError(
                f"{path.name}: tensor {tensor.name} has ggml type {tensor.ggml_type.name}, which the installed "
                "gguf package cannot write",
                hint="upgrade the gguf package",
            ) from None
    for kv in kvs:
        if kv.vtype == _V.ARRAY and not kv.value:
            raise ModelError(
                f"{path.name}: key {kv.key} is an empty array, which gguf's writer cannot write",
                hint=f'delete it with a rules file: [metadata] delete = ["{kv.key}"]',
            )


# --------------------------------------------------------------------------------------- write and verify


class _Progress:
    """Progress events for a byte count, at most one per ``_PROGRESS_STEP`` bytes (plus the last)."""

    def __init__(self, reporter: Reporter, what: str, total: int, cancel: CancelToken | None) -> None:
        self.reporter, self.what, self.total, self.cancel = reporter, what, total, cancel
        self.done = self.last = 0

    def add(self, n: int, *, final: bool = False) -> None:
        self.done += n
        if final or self.done - self.last >= _PROGRESS_STEP:
            self.last = self.done
            mib = f"{self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
            self.reporter(Event("progress", f"{self.what} {mib}", stage=_STAGE, completed=self.done,
                                total=self.total))  # fmt: skip
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()


def _write(
    tmp: Path, header: GGUFHeader, plan: _MetadataPlan, mapped: list[_Mapped], progress: _Progress
) -> dict[str, str]:
    """Write the output through GGUFWriter, streaming tensor bytes; returns the input sha256 per tensor."""
    writer = gguf.GGUFWriter(tmp, plan.arch)  # writes general.architecture itself
    try:
        for kv in plan.kvs.values():
            if kv.key == ARCH_KEY:
                continue
            if kv.key == _ALIGNMENT_KEY:
                writer.add_custom_alignment(kv.value)
            else:
                writer.add_key_value(kv.key, kv.value, kv.vtype, sub_type=kv.sub_type)
        for item in mapped:
            tensor = item.tensor
            block, type_size = tensor.ggml_type.block_size, tensor.ggml_type.type_size
            # numpy-order byte shape; GGUFWriter turns it back into ggml's element shape for raw_dtype
            byte_shape = (*reversed(tensor.shape[1:]), tensor.shape[0] // block * type_size)
            writer.add_tensor_info(item.name, byte_shape, np.dtype(np.uint8), tensor.nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType(tensor.ggml_type.id))  # fmt: skip
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None  # opened by write_header_to_file
        out = writer.fout[0]
        writer.write_padding(out, out.tell())
        hashes: dict[str, str] = {}
        buffer = memoryview(bytearray(CHUNK_SIZE))
        with Path(header.source).open("rb") as src:
            for item in mapped:
                digest = hashlib.sha256()
                src.seek(item.start)
                left = item.tensor.nbytes
                while left:
                    n = src.readinto(buffer[: min(left, CHUNK_SIZE)])
                    if not n:
                        raise ModelError(
                            f"{header.source} shrank while it was read (tensor {item.tensor.name})"
                        )
                    digest.update(buffer[:n])
                    out.write(buffer[:n])
                    left -= n
                    progress.add(n)
                writer.write_padding(out, item.tensor.nbytes)
                hashes[item.name] = digest.hexdigest()
        progress.add(0, final=True)
        out.flush()
        os.fsync(out.fileno())
    finally:
        writer.close()
    return hashes


def _verify(
    tmp: Path, plan: _MetadataPlan, alignment: int, mapped: list[_Mapped], hashes: Mapping[str, str],
    progress: _Progress,
) -> str:  # fmt: skip
    """Re-read the written file and compare it with what was intended; returns its sha256."""
    out = read_header(tmp, exact=True)
    problems: list[str] = []
    if out.alignment != alignment:
        problems.append(f"alignment {out.alignment}, expected {alignment}")
    got = _key_values(out)
    missing, unexpected = sorted(set(plan.kvs) - set(got)), sorted(set(got) - set(plan.kvs))
    if missing or unexpected:
        problems.append(f"metadata keys differ: missing {missing}, unexpected {unexpected}")
    for key in sorted(set(got) & set(plan.kvs)):
        want, have = plan.kvs[key], got[key]
        if (want.vtype, want.sub_type) != (have.vtype, have.sub_type) or not _same_value(
            want.value, have.value
        ):
            problems.append(f"key {key} holds {_display(have.value)!r}, expected {_display(want.value)!r}")
    if [t.name for t in out.tensors] != [item.name for item in mapped]:
        problems.append("tensor names or order differ from the plan")
    else:
        for tensor, item in zip(out.tensors, mapped, strict=True):
            if (tensor.ggml_type, tensor.shape) != (item.tensor.ggml_type, item.tensor.shape):
                problems.append(f"tensor {tensor.name}: type or shape differs from {item.tensor.name!r}")
    regions = [(t.name, out.absolute_offset(t), t.nbytes) for t in out.tensors]
    file_sha, tensor_sha = hash_gguf(tmp, regions, progress.add)
    progress.add(0, final=True)
    for item in mapped:
        if tensor_sha.get(item.name) != hashes[item.name]:
            problems.append(
                f"tensor {item.name}: sha256 of its data differs from input tensor {item.tensor.name!r}"
            )
    if problems:
        raise ModelError(
            "the written file does not match its input; nothing was published:\n  "
            + "\n  ".join(problems[:12]),
            hint="check the disk (free space, errors); if it persists, report it with the input's sha256",
        )
    return file_sha


# ------------------------------------------------------------------------------------------------- public


@dataclass(frozen=True)
class RemapResult:
    """What :func:`remap_gguf` wrote (it raises rather than return an unverified file)."""

    src: Path
    dst: Path
    rules: str | None
    arch: str
    target_arch: str
    tensor_count: int
    tensor_bytes: int
    renamed: tuple[tuple[str, str], ...]
    metadata_changes: tuple[MetadataChange, ...]
    warnings: tuple[str, ...]
    size: int
    sha256: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """Summary for ``--json`` and tool results."""
        return {
            "src": str(self.src),
            "dst": str(self.dst),
            "rules": self.rules,
            "arch": self.arch,
            "target_arch": self.target_arch,
            "tensor_count": self.tensor_count,
            "tensor_bytes": self.tensor_bytes,
            "renamed_count": len(self.renamed),
            "renamed": dict(self.renamed),
            "metadata_changes": [change.to_json() for change in self.metadata_changes],
            "warnings": list(self.warnings),
            "size": self.size,
            "sha256": self.sha256,
            "verified": True,
            "seconds": round(self.seconds, 3),
        }


def _check_paths(src: Path, dst: Path, overwrite: bool) -> None:
    if not src.is_file():
        raise InvalidOption(f"input {src} does not exist or is not a file")
    if src.resolve() == dst.resolve():
        raise InvalidOption(
            f"output {dst} is the input file", hint="write to a new path; the input is never modified"
        )
    if dst.is_dir():
        raise InvalidOption(f"output {dst} is a directory", hint="give a file path ending in .gguf")
    if dst.exists():
        if src.samefile(dst):
            raise InvalidOption(
                f"output {dst} is the input file under another name (a link)",
                hint="write to a new path; the input is never modified",
            )
        if not overwrite:
            raise InvalidOption(f"output {dst} exists", hint="pass --overwrite to replace it")


def remap_gguf(
    src: Path,
    dst: Path,
    rules: RemapRules | None = None,
    *,
    target_arch: str | None = None,
    overwrite: bool = False,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> RemapResult:
    """Copy GGUF ``src`` to ``dst`` with llama.cpp's tensor names and ``rules``' metadata edits applied.

    Tensor names go through ``gguf.TensorNameMap`` for the file's architecture and block count (canonical
    names pass through); a name that maps to nothing is an error naming it. ``target_arch`` (or a rule setting
    ``general.architecture``) relabels the file, refused when a tensor does not exist in the target arch.
    Tensor bytes are streamed ``CHUNK_SIZE`` at a time; the output is written next to ``dst``, re-read and
    compared with the input (metadata, tensor names, types, shapes and data sha256) and renamed into place.
    ``dst`` must not be ``src`` and must not exist unless ``overwrite``.
    """
    started = time.monotonic()
    src, dst = Path(src), Path(dst)
    _check_paths(src, dst, overwrite)
    reporter(Event("stage", f"reading {src}", stage=_STAGE))
    header = read_header(src, exact=True)
    arch = _architecture(header)
    mapped = _canonical_tensors(header, arch)
    plan = _plan_metadata(header, arch, rules, target_arch)
    if plan.arch != arch:
        plan.warnings.extend(_check_relabel(mapped, arch, plan.arch, src))
    _check_writable(plan.kvs.values(), mapped, src)
    for warning in plan.warnings:
        reporter(Event("warning", warning, stage=_STAGE))
    if cancel is not None:
        cancel.raise_if_cancelled()
    tensor_bytes = sum(item.tensor.nbytes for item in mapped)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        reporter(Event("stage", f"writing {dst}", stage=_STAGE))
        hashes = _write(tmp, header, plan, mapped, _Progress(reporter, "copied", tensor_bytes, cancel))
        reporter(Event("stage", f"verifying {dst.name}", stage=_STAGE))
        size = tmp.stat().st_size
        sha256 = _verify(
            tmp, plan, header.alignment, mapped, hashes, _Progress(reporter, "verified", size, cancel)
        )
        tmp.chmod(0o644)
        tmp.replace(dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    renamed = tuple((item.tensor.name, item.name) for item in mapped if item.tensor.name != item.name)
    edits = sum(1 for change in plan.changes if not change.note.startswith(("unchanged", "already")))
    reporter(Event("info", f"wrote {dst}: {len(renamed)} of {len(mapped)} tensors renamed, {edits} metadata "
                           "edits, verified", stage=_STAGE))  # fmt: skip
    return RemapResult(
        src=src, dst=dst, rules=rules.origin if rules else None, arch=arch, target_arch=plan.arch,
        tensor_count=len(mapped), tensor_bytes=tensor_bytes, renamed=renamed,
        metadata_changes=tuple(plan.changes), warnings=tuple(plan.warnings), size=size, sha256=sha256,
        seconds=time.monotonic() - started,
    )  # fmt: skip
