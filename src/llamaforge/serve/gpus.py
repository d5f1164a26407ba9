"""The GPU table, ``recipes/gpus.toml``: memory, bandwidth and CUDA architecture per card, read in one place.

The fit planner looks cards up by the name a user types (:func:`find_gpu`), the smoke roofline by the device
name llama-bench prints (:func:`gpu_for_device`), and ``--arch rtx4090`` and the MCP prompt by card or family
name (:func:`cuda_arch_for`). A card may lack a figure the table has no source for (memory size, compute
capability); whoever needs it says so instead of guessing.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from llamaforge.core.errors import InvalidOption
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import closest, did_you_mean

__all__ = [
    "GPU",
    "GpuTable",
    "closest_names",
    "cuda_arch_for",
    "find_card",
    "find_gpu",
    "gpu_for_device",
    "gpu_names",
    "load_gpus",
    "normalise",
]

GiB: Final = 1 << 30


@dataclass(frozen=True)
class GPU:
    """One card of ``recipes/gpus.toml`` (``vram_bytes`` / ``cuda_arch`` None where the table has no figure)."""

    key: str
    name: str
    bandwidth_gbs: float
    vram_bytes: int | None = None
    cuda_arch: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        """The key, the product name and the aliases."""
        return (self.key, self.name, *self.aliases)


@dataclass(frozen=True)
class GpuTable:
    """The cards, keyed by table key, and the card families (``rtx40`` → ``"89"``) for naming an arch."""

    gpus: dict[str, GPU]
    families: dict[str, str]


def normalise(name: str) -> str:
    """``"NVIDIA GeForce RTX 4060-Ti"`` → ``"rtx4060ti"``: lower case, no spaces, ``-`` or ``_``, no vendor."""
    return re.sub(r"[\s_\-]+", "", name.lower()).removeprefix("nvidia").removeprefix("geforce")


@functools.cache
def _load(path: Path) -> GpuTable:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark as in read_toml
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InvalidOption(f"cannot read the GPU table {path}: {error}") from None
    gpus = {}
    for key, item in data.get("gpus", {}).items():
        vram = item.get("vram_gib")
        arch = item.get("cuda_arch")
        gpus[key] = GPU(
            key=key,
            name=str(item["name"]),
            bandwidth_gbs=float(item["bandwidth_gbs"]),
            vram_bytes=int(float(vram) * GiB) if vram is not None else None,
            cuda_arch=str(arch) if arch is not None else None,
            aliases=tuple(item.get("aliases", ())),
        )
    families = {str(key): str(item["cuda_arch"]) for key, item in data.get("families", {}).items()}
    return GpuTable(gpus, families)


def load_gpus(path: Path | None = None) -> GpuTable:
    """The GPU table (``recipes/gpus.toml``, or ``path``); read once per path."""
    return _load(path or data_dir("recipes") / "gpus.toml")


def _by_spelling(table: GpuTable) -> dict[str, GPU]:
    by_name: dict[str, GPU] = {}
    for gpu in table.gpus.values():
        for spelling in gpu.spellings:
            by_name.setdefault(normalise(spelling), gpu)
    return by_name


def find_card(name: str, table: GpuTable | None = None) -> GPU | None:
    """The card called ``name`` (key, product name or alias, ignoring case, spaces, ``-``, ``_``, "nvidia",
    "geforce"), or None."""
    table = table if table is not None else load_gpus()
    return _by_spelling(table).get(normalise(name))


def closest_names(
    name: str, table: GpuTable | None = None, *, families: bool = False, n: int = 3
) -> list[str]:
    """The table keys (and family names with ``families``) whose spellings are closest to ``name``, best first:
    what "did you mean" offers for a card name that is not in the table."""
    table = table if table is not None else load_gpus()
    names = {spelling: gpu.key for spelling, gpu in _by_spelling(table).items()}
    if families:
        names.update({normalise(family): family for family in table.families})
    return list(dict.fromkeys(names[c] for c in closest(normalise(name), names, n=n, cutoff=0.5)))


def find_gpu(name: str, table: GpuTable | None = None) -> GPU:
    """The card called ``name`` (key, product name or alias, ignoring case, spaces, ``-``, ``_``, "nvidia",
    "geforce"); InvalidOption with "did you mean …?" otherwise."""
    table = table if table is not None else load_gpus()
    card = find_card(name, table)
    if card is not None:
        return card
    keys = closest_names(name, table)
    raise InvalidOption(
        f"unknown GPU {name!r}",
        hint=did_you_mean(keys, end=" ")
        + "known: "
        + ", ".join(sorted(table.gpus))
        + "; or give the memory with --vram 24GiB",
    )


def gpu_for_device(device: str, table: GpuTable | None = None) -> GPU | None:
    """The card a device name such as llama-bench's ``NVIDIA GeForce RTX 3060 Ti`` names: the card with the
    longest spelling found in it (so "RTX 3060 Ti" beats "RTX 3060"), or None."""
    table = table if table is not None else load_gpus()
    compact = normalise(device)
    hits = [
        (len(spelling), gpu)
        for spelling, gpu in _by_spelling(table).items()
        if spelling and spelling in compact
    ]
    return max(hits, key=lambda hit: hit[0])[1] if hits else None


def cuda_arch_for(name: str, table: GpuTable | None = None) -> str | None:
    """The compute capability of a card or card family (``rtx4090``, ``RTX 4090``, ``rtx40``), or None when
    the name is neither or the table has no figure for it."""
    table = table if table is not None else load_gpus()
    wanted = normalise(name)
    family = {normalise(key): arch for key, arch in table.families.items()}
    if wanted in family:
        return family[wanted]
    gpu = _by_spelling(table).get(wanted)
    return gpu.cuda_arch if gpu is not None else None


def gpu_names(table: GpuTable | None = None) -> list[str]:
    """Table keys and family names, sorted: what ``--arch`` accepts besides compute capabilities."""
    table = table if table is not None else load_gpus()
    return sorted({*(key for key, gpu in table.gpus.items() if gpu.cuda_arch), *table.families})
