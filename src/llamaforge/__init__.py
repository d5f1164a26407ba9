"""llamaforge: reproducible, patched llama.cpp builds for Qwen models."""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("llamaforge")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext llamaforge``: register the ``%llamaforge`` magic (imported only when a notebook asks)."""
    from llamaforge.fronts.jupyter import load_ipython_extension as load

    load(ipython)


__all__ = ["__version__", "load_ipython_extension"]
