"""Tensor names for the remap: every tensor of a GGUF with the name llama.cpp looks it up by.

``gguf.TensorNameMap`` for the file's architecture and block count maps Hugging Face and Meta names to GGUF
names; canonical names pass through. Renames are allowed only for :data:`~llamaforge.models.remap_table.
REMAP_ARCHS`, and a relabel to another architecture is refused when that architecture lacks a tensor kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import gguf

from llamaforge.core.errors import ModelError
from llamaforge.gguf.header import GGUFHeader, TensorInfo
from llamaforge.models.remap.rules import model_arch
from llamaforge.models.remap_table import REMAP_ARCHS

__all__ = ["Mapped", "arch_member", "canonical_tensors", "check_relabel"]

_BLOCK_COUNT_KEY: Final[str] = gguf.Keys.LLM.BLOCK_COUNT


_SUFFIXES: Final[tuple[str, ...]] = (".weight", ".bias")


def arch_member(name: str, *, what: str) -> gguf.MODEL_ARCH:
    """The ``gguf.MODEL_ARCH`` called ``name``; ModelError (with "did you mean") when gguf does not know it."""
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


@dataclass(frozen=True)
class Mapped:
    """An input tensor, its llama.cpp name and kind, and where its data starts in the input file."""

    tensor: TensorInfo
    name: str  # canonical
    kind: gguf.MODEL_TENSOR
    start: int  # absolute offset of the data in the input


# TensorNameMap.__init__ merges an arch's block overrides (arctic's) into the class-level table in place,
# changing every map built after it; each of these maps works on its own copy, taken at import.
_BLOCK_TABLE: Final = dict(gguf.TensorNameMap.block_mappings_cfg)


class _IsolatedNameMap(gguf.TensorNameMap):
    def __init__(self, arch: gguf.MODEL_ARCH, n_blocks: int) -> None:
        self.block_mappings_cfg = dict(_BLOCK_TABLE)
        super().__init__(arch, n_blocks)


def canonical_tensors(header: GGUFHeader, arch: str) -> list[Mapped]:
    """Every tensor with its llama.cpp name, in file order; refuses names that map to nothing."""
    gguf_arch = arch_member(arch, what=f"{Path(header.source).name}: cannot map tensor names")
    block_key = _BLOCK_COUNT_KEY.format(arch=arch)
    blocks = header.metadata.get(block_key)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        raise ModelError(
            f"{header.source} has no integer {block_key} key, so its tensor names cannot be mapped"
        )
    if blocks > len(header.tensors):  # every block has tensors: a larger count is damage, and sizes the maps
        raise ModelError(
            f"{header.source}: {block_key} is {blocks}, more blocks than the file has tensors "
            f"({len(header.tensors)})",
            hint="the file's metadata is damaged or does not belong to its tensors",
        )
    n_blocks = blocks
    name_map = _IsolatedNameMap(gguf_arch, n_blocks)
    canonical: dict[str, gguf.MODEL_TENSOR] = {}
    for kind in gguf.MODEL_TENSORS[gguf_arch]:
        template = str(gguf.TENSOR_NAMES[kind])
        if "{bid}" in template:
            canonical.update((template.format(bid=bid), kind) for bid in range(n_blocks))
        else:
            canonical[template] = kind
    mapped: list[Mapped] = []
    unmapped: list[str] = []
    for tensor in header.tensors:
        suffix = next((s for s in _SUFFIXES if tensor.name.endswith(s)), "")
        base = tensor.name.removesuffix(suffix) if suffix else tensor.name
        if base in canonical:  # already llama.cpp's name: never re-mapped
            mapped.append(Mapped(tensor, tensor.name, canonical[base], header.absolute_offset(tensor)))
            continue
        hit = name_map.get_type_and_name(tensor.name, try_suffixes=_SUFFIXES)
        if hit is None:
            unmapped.append(tensor.name)
        else:
            mapped.append(Mapped(tensor, str(hit[1]), hit[0], header.absolute_offset(tensor)))
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


def check_relabel(mapped: list[Mapped], arch: str, out_arch: str, path: Path) -> list[str]:
    """Refuse a relabel whose tensors the target arch does not have; warn about what it may lack."""
    target = set(gguf.MODEL_TENSORS[arch_member(out_arch, what="relabel")])
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
    source = set(gguf.MODEL_TENSORS[arch_member(arch, what="relabel")])
    extra = sorted(_kind_label(kind) for kind in target - source)
    warnings = [
        f"relabel {arch} → {out_arch}: every tensor fits {out_arch}, but gguf.MODEL_TENSORS cannot say which "
        f"tensors and {out_arch}.* keys llama.cpp requires; check the result loads"
    ]
    if extra:
        warnings.append(f"{out_arch} may use tensors no {arch} file holds: {_some(extra)}")
    return warnings
