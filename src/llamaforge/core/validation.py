"""One formatter for validation errors and "did you mean …?", used by every recipe kind and every front."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: str, known: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The names in ``known`` closest to ``word`` (at most ``n``, best first; empty when none is close)."""
    return difflib.get_close_matches(word, list(known), n=n, cutoff=cutoff)
