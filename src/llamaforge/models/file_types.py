"""GGUF file types by name (``Q4_K_M``, ``F16``): the names a file states or llama.cpp guesses, compared in any
spelling; apart from :mod:`llamaforge.models.inspect` so that recipes can check a name without reading files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# The file type llama.cpp guesses from the most common tensor type (llama-model-loader.cpp).
GUESSED_FILE_TYPE: Final[Mapping[str, str]] = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q2_K": "Q2_K",
    "Q3_K": "Q3_K_M",
    "Q4_K": "Q4_K_M",
    "Q5_K": "Q5_K_M",
    "Q6_K": "Q6_K",
    "TQ1_0": "TQ1_0",
    "TQ2_0": "TQ2_0",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "IQ3_S": "IQ3_S",
    "NVFP4": "NVFP4",
    "Q1_0": "Q1_0",
    "Q2_0": "Q2_0",
}


def normal_file_type(name: str) -> str:
    """A file type's name as compared: ``q4_k_m``, ``MOSTLY_Q4_K_M`` and ``UD-Q4_K_M`` are ``Q4_K_M``."""
    return name.upper().removeprefix("UD-").removeprefix("MOSTLY_").removeprefix("ALL_")


def known_file_types() -> set[str]:
    """Every file type a GGUF can state (``general.file_type``) or llama.cpp guesses, as :func:`normal_file_type`
    writes them."""
    import gguf

    stated = {normal_file_type(item.name) for item in gguf.LlamaFileType if item.name != "GUESSED"}
    return stated | set(GUESSED_FILE_TYPE.values())
