"""The Metal backend (ggml-metal): macOS on Apple silicon, built on a Mac, the Metal library embedded in the binary
(no ``default.metallib`` to ship). Nothing runs Metal in a container."""

from __future__ import annotations

from typing import ClassVar

from llamaforge.backends.base import Backend
from llamaforge.build.names import BackendName, PlatformName


class MetalBackend(Backend):
    """ggml-metal, with its shader library embedded."""

    name: ClassVar[BackendName] = "metal"
    description: ClassVar[str] = "Apple GPUs (macOS)"
    platforms: ClassVar[tuple[PlatformName, ...]] = ("macos",)

    def cmake(self, archs: tuple[str, ...]) -> dict[str, str]:
        """Metal on, its library embedded."""
        return {"GGML_METAL": "ON", "GGML_METAL_EMBED_LIBRARY": "ON"}
