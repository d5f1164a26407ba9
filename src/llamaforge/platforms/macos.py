"""macOS: not built yet. A refusal that says so and what to do instead, until the platforms work fills it
(Metal builds need Xcode on a Mac, run natively or over SSH; nothing runs Metal in Docker)."""

from __future__ import annotations

from llamaforge.platforms import UnbuiltPlatform

MACOS = UnbuiltPlatform(
    "macos",
    next_step="for macOS today, build llama.cpp on a Mac with Xcode: "
    "`cmake -B build -DGGML_METAL=ON && cmake --build build`",
)
