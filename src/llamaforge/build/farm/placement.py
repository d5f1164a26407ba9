"""Where a matrix entry may run and where it goes next: pure functions over a fleet's builders.

An entry needs a platform (its own, else its recipe's), the labels it lists, and a kind of builder: a Linux build
runs on a Docker engine or a Linux build host; a Windows build cross-compiles with mingw on an engine, or builds
with MSVC on a Windows build host; a macOS build needs a Mac build host. Among the builders that qualify, the
next entry goes to the one with the most free slots (its ``concurrency`` less what runs there), then the most
cores, then the fleet's order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from llamaforge.build.farm.builders import Builder


@dataclass(frozen=True)
class Need:
    """What an entry asks of a builder."""

    entry: str
    platform: str
    labels: tuple[str, ...] = ()
    toolchain: str | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of builder (``engine``, ``build-host``) that can build it."""
        if self.platform == "macos" or self.toolchain == "msvc":
            return ("build-host",)
        if self.toolchain == "mingw":
            return ("engine",)
        return ("engine", "build-host")

    def describe(self) -> str:
        """``platform windows, labels cuda, fast`` for messages."""
        parts = [f"platform {self.platform}"]
        if self.toolchain:
            parts.append(f"toolchain {self.toolchain}")
        if self.labels:
            parts.append("labels " + ", ".join(self.labels))
        return "; ".join(parts)


def why_not(need: Need, builder: Builder) -> str | None:
    """None when ``builder`` can build ``need``, else why not (one short clause)."""
    if need.platform not in builder.platforms:
        return f"builds {', '.join(builder.platforms)}, not {need.platform}"
    if builder.kind not in need.kinds:
        what = "a Docker engine" if builder.kind == "engine" else "a build host"
        return f"is {what}; {need.platform} {need.toolchain or ''} needs {' or '.join(need.kinds)}".replace(
            "  ", " "
        )
    missing = [label for label in need.labels if label not in builder.labels]
    if missing:
        return f"lacks the label(s) {', '.join(missing)}"
    return None


def eligible(need: Need, builders: Sequence[Builder]) -> list[Builder]:
    """The builders that can build ``need``, in the fleet's order."""
    return [builder for builder in builders if why_not(need, builder) is None]


def refusal(need: Need, builders: Sequence[Builder]) -> str:
    """Why no builder of ``builders`` can build ``need``: one clause per builder."""
    return "; ".join(f"{builder.name} {why_not(need, builder)}" for builder in builders)


def choose(
    need: Need,
    builders: Sequence[Builder],
    running: Mapping[str, int],
    *,
    excluded: Collection[str] = (),
    cores: Mapping[str, int] | None = None,
) -> Builder | None:
    """The builder ``need`` goes to now: qualified, not excluded (lost, or already tried), with a free slot; the
    most free slots first, then the most cores, then the fleet's order. None when every qualified one is busy."""
    best: tuple[int, int, int] | None = None
    chosen = None
    for order, builder in enumerate(builders):
        if builder.name in excluded or why_not(need, builder) is not None:
            continue
        free = builder.concurrency - running.get(builder.name, 0)
        if free <= 0:
            continue
        count = (cores or {}).get(builder.name) or builder.cores or 0
        rank = (free, count, -order)
        if best is None or rank > best:
            best, chosen = rank, builder
    return chosen
