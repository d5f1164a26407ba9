"""Where llamaforge finds its shipped data (recipes, templates, patches) and keeps its cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

DataKind = Literal["recipes", "templates", "patches"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def data_dir(kind: DataKind) -> Path:
    """Directory of shipped ``kind`` data: inside the wheel, or the source checkout's top-level folder."""
    override = os.environ.get(f"LLAMAFORGE_{kind.upper()}_DIR")
    if override:
        return Path(override)
    packaged = _PACKAGE_DIR / "data" / kind
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parents[1] / kind


def home() -> Path:
    """Root of llamaforge's caches and build store (``LLAMAFORGE_HOME``, else the XDG cache dir)."""
    explicit = os.environ.get("LLAMAFORGE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamaforge"
