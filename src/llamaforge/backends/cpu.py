"""The CPU backend (ggml-cpu): every hook's default. The CPU level (``--cpu``) is
:mod:`llamaforge.build.cpu_level`'s."""

from __future__ import annotations

from typing import ClassVar

from llamaforge.backends.base import Backend
from llamaforge.build.names import BackendName


class CpuBackend(Backend):
    """ggml-cpu only: built on every platform, run with no device."""

    name: ClassVar[BackendName] = "cpu"
    description: ClassVar[str] = "ggml-cpu only"
