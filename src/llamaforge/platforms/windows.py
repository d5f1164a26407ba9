"""Windows: not built yet. A refusal that says so and what to do instead, until the platforms work fills it
(CPU/Vulkan as a mingw-w64 cross build from Linux, CUDA with MSVC on a Windows host; ``.exe`` artifacts)."""

from __future__ import annotations

from llamaforge.platforms import UnbuiltPlatform

WINDOWS = UnbuiltPlatform(
    "windows",
    next_step='for Windows today, build llama.cpp on a Windows host with `cmake -G "Visual Studio 17 2022" -A x64`',
)
