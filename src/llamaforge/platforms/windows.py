"""Windows: not built yet. A refusal that says so and what to do instead, until the platforms work fills it
(CPU/Vulkan as a mingw-w64 cross build from Linux, CUDA with MSVC on a Windows host; ``.exe`` artifacts)."""

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
        f"platform 'windows' (recipe {recipe.name!r}) is not built yet: llamaforge builds linux only",
        hint='set platform = "linux" in the recipe to build for Linux; for Windows today, build llama.cpp '
        'on a Windows host with `cmake -G "Visual Studio 17 2022" -A x64`',
    )


class WindowsPlatform:
    """Refuses every Windows build with a next step."""

    name: PlatformName = "windows"
    template_dir: str | None = None

    def check(self, recipe: BuildRecipe, backend: Backend) -> None:
        """Always refuses: no Windows builder exists yet."""
        _refuse(recipe)

    def build(
        self,
        recipe: BuildRecipe,
        backend: Backend,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Always refuses: no Windows builder exists yet."""
        _refuse(recipe)
