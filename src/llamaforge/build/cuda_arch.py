"""Parse and validate CUDA architecture lists (``--arch 86``, ``86,89``, ``89-real``, ``90a-virtual``)."""

from __future__ import annotations

import re

from llamaforge.core.errors import InvalidOption
from llamaforge.serve.gpus import cuda_arch_for, gpu_names

# Compute capabilities that CUDA 12.x/13.x nvcc accept as CMAKE_CUDA_ARCHITECTURES entries.
KNOWN_ARCHS: tuple[str, ...] = (
    "50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "88", "89",
    "90", "90a", "100", "100a", "100f", "101", "101a", "103", "103a", "110", "110a",
    "120", "120a", "120f", "121", "121a",
)  # fmt: skip

_ENTRY = re.compile(r"^(?P<arch>[0-9]+[af]?)(?:-(?P<kind>real|virtual))?$")


def parse_cuda_archs(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """Normalise an arch list to CMake entries, e.g. ``"86, 89-real"`` -> ``["86", "89-real"]``.

    Accepts commas, semicolons or spaces as separators, ``sm_86``/``compute_86`` spellings and the names of
    ``recipes/gpus.toml`` (cards such as ``rtx3090``, families such as ``rtx40``). Rejects anything else with
    the list of valid values.
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
        match = _ENTRY.match(entry)
        if match is None and (card_arch := cuda_arch_for(entry)) is not None:
            entry, match = card_arch, _ENTRY.match(card_arch)
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
                    + ", ".join(gpu_names())
                ),
            )
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
