"""llamaforge: reproducible, patched llama.cpp builds for Qwen models."""

from typing import Any

from llamaforge.core.version import __version__


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext llamaforge``: register the ``%llamaforge`` magic (imported only when a notebook asks)."""
    from llamaforge.fronts.jupyter import load_ipython_extension as load

    load(ipython)


__all__ = ["__version__", "load_ipython_extension"]
