"""Parse and validate CUDA architecture lists (``--arch 86``, ``86,89``, ``89-real``, ``90a-virtual``)."""

from __future__ import annotations

import re

from llamaforge.core.errors import InvalidOption

# Compute capabilities that CUDA 12.x/13.x nvcc accept as CMAKE_CUDA_ARCHITECTURES entries.
KNOWN_ARCHS: tuple[str, ...] = (
    "50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "88", "89",
    "90", "90a", "100", "100a", "100f", "101", "101a", "103", "103a", "110", "110a",
    "120", "120a", "120f", "121", "121a",
)  # fmt: skip

# What people mean when they name a card rather than an arch.
GPU_ALIASES: dict[str, str] = {
    "rtx30": "86", "rtx3060": "86", "rtx3070": "86", "rtx3080": "86", "rtx3090": "86", "a6000": "86",
    "a100": "80", "rtx40": "89", "rtx4060": "89", "rtx4070": "89", "rtx4080": "89", "rtx4090": "89",
    "l4": "89", "l40s": "89", "h100": "90", "h200": "90", "rtx50": "120", "rtx5090": "120",
}  # fmt: skip

_ENTRY = re.compile(r"^(?P<arch>[0-9]+[af]?)(?:-(?P<kind>real|virtual))?$")


def parse_cuda_archs(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """Normalise an arch list to CMake entries, e.g. ``"86, 89-real"`` -> ``["86", "89-real"]``.

    Accepts commas, semicolons or spaces as separators, ``sm_86``/``compute_86`` spellings and GPU names
    such as ``rtx3090``. Rejects anything else with the list of valid values.
    """
    items = [value] if isinstance(value, str) else list(value)
    entries: list[str] = []
    for item in items:
        entries.extend(part for part in re.split(r"[,;\s]+", item.strip()) if part)
    if not entries:
        raise InvalidOption("empty CUDA arch list", hint="pass e.g. --arch 86 (RTX 30xx) or --arch 86,89")
    result: list[str] = []
    for raw in entries:
        entry = raw.lower().removeprefix("sm_").removeprefix("compute_")
        entry = GPU_ALIASES.get(entry, entry)
        match = _ENTRY.match(entry)
        if entry in ("native", "all", "all-major"):
            raise InvalidOption(
                f"CUDA arch {raw!r} depends on the build machine or builds every arch",
                hint="name the archs explicitly so the build is reproducible, e.g. --arch 86,89",
            )
        if match is None or match.group("arch") not in KNOWN_ARCHS:
            raise InvalidOption(
                f"invalid CUDA arch {raw!r}",
                hint=(
                    "valid archs: "
                    + ", ".join(KNOWN_ARCHS)
                    + " (optionally with -real or -virtual), or a GPU name: "
                    + ", ".join(sorted(GPU_ALIASES))
                ),
            )
        if entry not in result:
            result.append(entry)
    return result
