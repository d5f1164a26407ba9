"""Build platforms: what a recipe's ``platform`` means for a build, one module per platform.

A platform is a :class:`~llamaforge.platforms.base.Platform` registered in ``PLATFORMS`` below; its name is in
:data:`llamaforge.build.names.PlatformName`. Linux builds run in Docker or on a Linux host; Windows (MSVC) and
macOS (Metal) builds run on a host of their own, reached with the ssh executor (or natively, with the local
executor on that system); mingw cross-builds Windows binaries in Docker.
"""

from __future__ import annotations

from typing import get_args

from llamaforge.build.names import PlatformName
from llamaforge.core.errors import InvalidOption
from llamaforge.platforms.base import (
    BuildEnvironment,
    BuilderImage,
    BuildScript,
    HostTool,
    Platform,
    PlatformBuild,
    sha256_text,
)
from llamaforge.platforms.linux import LinuxPlatform
from llamaforge.platforms.macos import MacosPlatform
from llamaforge.platforms.windows import WindowsPlatform

__all__ = [
    "PLATFORMS",
    "BuildEnvironment",
    "BuildScript",
    "BuilderImage",
    "HostTool",
    "Platform",
    "PlatformBuild",
    "get_platform",
    "platform_names",
    "sha256_text",
]

PLATFORMS: dict[str, Platform] = {
    platform.name: platform for platform in (LinuxPlatform(), WindowsPlatform(), MacosPlatform())
}
if set(PLATFORMS) != set(get_args(PlatformName)):  # pragma: no cover - a registry edited without its name
    raise RuntimeError(f"platforms {sorted(PLATFORMS)} and PlatformName {get_args(PlatformName)} differ")


def get_platform(name: str) -> Platform:
    """The platform called ``name`` (a recipe's ``platform``)."""
    if name not in PLATFORMS:
        raise InvalidOption(f"unknown platform {name!r}", hint="one of " + ", ".join(platform_names()))
    return PLATFORMS[name]


def platform_names() -> list[str]:
    """Names of every registered platform."""
    return sorted(PLATFORMS)
