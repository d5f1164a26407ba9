"""macOS: not built yet. A refusal that says so and what to do instead, until the platforms work fills it
(Metal builds need Xcode on a Mac, run natively or over SSH; nothing runs Metal in Docker)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from llamaforge.build.recipes import Backend, BuildRecipe
from llamaforge.build.recipes import Platform as PlatformName
from llamaforge.core.errors import InvalidOption
from llamaforge.platforms import PlatformBuild

if TYPE_CHECKING:
    from llamaforge.build.plan import BuildOptions


def _refuse(recipe: BuildRecipe) -> NoReturn:
    raise InvalidOption(
        f"platform 'macos' (recipe {recipe.name!r}) is not built yet: llamaforge builds linux only",
        hint='set platform = "linux" in the recipe to build for Linux; for macOS today, build llama.cpp '
        "on a Mac with Xcode: `cmake -B build -DGGML_METAL=ON && cmake --build build`",
    )


class MacosPlatform:
    """Refuses every macOS build with a next step."""

    name: PlatformName = "macos"
    template_dir: str | None = None

    def check(self, recipe: BuildRecipe, backend: Backend) -> None:
        """Always refuses: no macOS builder exists yet."""
        _refuse(recipe)

    def build(
        self,
        recipe: BuildRecipe,
        backend: Backend,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Always refuses: no macOS builder exists yet."""
        _refuse(recipe)
