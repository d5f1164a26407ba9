"""Parse and validate CUDA architecture lists (``--arch 86``, ``86,89``, ``8.6``, ``89-real``, ``rtx4090``).

GPU names come from the one GPU table, ``recipes/gpus.toml`` (:mod:`llamaforge.serve.gpus`), the same table
``models.fit --gpu`` reads.
"""

from __future__ import annotations

import re

from llamaforge.core.errors import InvalidOption
from llamaforge.core.validation import closest, did_you_mean
from llamaforge.serve.gpus import GpuTable, closest_names, cuda_arch_for, find_card, load_gpus

# Compute capabilities that CUDA 12.x/13.x nvcc accept as CMAKE_CUDA_ARCHITECTURES entries.
KNOWN_ARCHS: tuple[str, ...] = (
    "50",
    "52",
    "53",
    "60",
    "61",
    "62",
    "70",
    "72",
    "75",
    "80",
    "86",
    "87",
    "88",
    "89",
    "90",
    "90a",
    "100",
    "100a",
    "100f",
    "101",
    "101a",
    "103",
    "103a",
    "110",
    "110a",
    "120",
    "120a",
    "120f",
    "121",
    "121a",
)

_ENTRY = re.compile(r"^(?P<arch>[0-9]+[af]?)(?:-(?P<kind>real|virtual))?$")
# A compute capability as NVIDIA's tables and nvidia-smi print it: 8.6, 12.0, 9.0a (-real/-virtual allowed).
_DOTTED = re.compile(r"^(?P<major>[0-9]{1,2})\.(?P<minor>[0-9])(?P<rest>[af]?(?:-(?:real|virtual))?)$")
_EXAMPLES = (
    "e.g. 86 or 8.6 (RTX 30xx), 89 (RTX 40xx), 120 (RTX 50xx), 80 (A100), 90 (H100), optionally with -real or "
    "-virtual; or a GPU name from recipes/gpus.toml such as rtx4090, a10, l40 or a family such as rtx40"
)


def _spelled(raw: str) -> str:
    """``sm_86`` / ``compute_86`` / ``8.6`` (any case) as CMake spells it, ``86``; anything else lower-cased."""
    entry = raw.lower().removeprefix("sm_").removeprefix("compute_")
    if dotted := _DOTTED.match(entry):
        entry = f"{dotted.group('major')}{dotted.group('minor')}{dotted.group('rest')}"
    return entry


def _known(word: str, table: GpuTable) -> bool:
    """True when ``word`` is a known arch (``86``, ``sm_86``, ``8.6``) or names a card or family."""
    match = _ENTRY.match(_spelled(word))
    if match is not None and match.group("arch") in KNOWN_ARCHS:
        return True
    return find_card(word, table) is not None or cuda_arch_for(word, table) is not None


def _entries(item: str, table: GpuTable) -> list[str]:
    """One ``--arch`` item split into entries: commas and semicolons always separate, spaces only where the
    piece is not one GPU name ("RTX 4090" is a card, "86 89" two archs); a piece none of whose words reads
    as an arch or a name stays whole, so the error names what was typed ("RTX 4909")."""
    entries: list[str] = []
    for piece in (part.strip() for part in re.split(r"[,;]+", item)):
        words = piece.split()
        if not words:
            continue
        if len(words) > 1 and (
            cuda_arch_for(piece, table) is not None or not any(_known(w, table) for w in words)
        ):
            entries.append(piece)
        else:
            entries.extend(words)
    return entries


def _unknown(raw: str, entry: str, table: GpuTable) -> InvalidOption:
    """The error for an entry that is neither a known arch nor a GPU name: "did you mean" the closest few."""
    card = find_card(raw, table)
    if card is not None:  # a card the table knows, without a sourced compute capability
        return InvalidOption(
            f"the GPU table has no compute capability for {card.name} ({raw!r})",
            hint=f"give the arch as a number, {_EXAMPLES}",
        )
    bare = re.sub(r"^(?:sm|compute)_?", "", entry)
    if re.match(r"^[0-9]", bare):  # a number: the closest compute capabilities
        near = closest(bare, KNOWN_ARCHS, n=3, cutoff=0.6) or closest(bare, KNOWN_ARCHS, n=3, cutoff=0.3)
    else:
        near = closest_names(raw, table, families=True)
    return InvalidOption(f"invalid CUDA arch {raw!r}", hint=did_you_mean(near, end=" ") + _EXAMPLES)


def parse_cuda_archs(value: str | list[str] | tuple[str, ...], table: GpuTable | None = None) -> list[str]:
    """Normalise an arch list to CMake entries, e.g. ``"86, 89-real"`` -> ``["86", "89-real"]``.

    Accepts commas, semicolons or spaces as separators, ``sm_86``/``compute_86``/``8.6`` spellings and the
    names of ``recipes/gpus.toml`` (cards such as ``rtx3090`` or ``RTX 4090``, families such as ``rtx40``).
    Rejects anything else with "did you mean" and a few examples.
    """
    table = table if table is not None else load_gpus()
    items = [value] if isinstance(value, str) else list(value)
    entries = [entry for item in items for entry in _entries(item, table)]
    if not entries:
        raise InvalidOption("empty CUDA arch list", hint="pass e.g. --arch 86 (RTX 30xx) or --arch 86,89")
    result: list[str] = []
    for raw in entries:
        entry = _spelled(raw)
        match = _ENTRY.match(entry)
        if match is None and (card_arch := cuda_arch_for(raw, table)) is not None:
            entry, match = card_arch, _ENTRY.match(card_arch)
        if entry in ("native", "all", "all-major"):
            raise InvalidOption(
                f"CUDA arch {raw!r} depends on the build machine or builds every arch",
                hint="name the archs explicitly so the build is reproducible, e.g. --arch 86,89",
            )
        if match is None or match.group("arch") not in KNOWN_ARCHS:
            raise _unknown(raw, entry, table)
        if entry not in result:
            result.append(entry)
    return result


# The oldest compute capability each CUDA major release still compiles for (CUDA 13 dropped Maxwell to Volta).
OLDEST_ARCH: dict[int, int] = {12: 50, 13: 75}


def check_toolkit_range(archs: list[str], major: int | None, toolkit: str) -> None:
    """Refuse archs that CUDA ``major`` (the toolkit named ``toolkit``) cannot target; unknown majors pass."""
    oldest = OLDEST_ARCH.get(major) if major is not None else None
    if oldest is None:
        return
    below = [arch for arch in archs if int(re.sub(r"\D.*", "", arch)) < oldest]
    if below:
        raise InvalidOption(
            f"CUDA {major} ({toolkit}) cannot target arch {', '.join(below)}: it builds {oldest} and newer",
            hint=f"drop {', '.join(below)}, or use a CUDA 12 toolkit (--cuda-toolkit image with an nvidia/cuda:12.x "
            "base image)",
        )
