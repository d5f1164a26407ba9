"""The ``deploy.render`` result for a person: the rendered files as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # showing one operation's result imports no other operation's module
    from rich.console import Console

    from llamaforge.deploy.manifests.ops import DeployRenderResult


def manifests_cli(result: DeployRenderResult, console: Console) -> None:
    """``deploy.render``: the file's text as it is (so ``> compose.yaml`` works); several files each after a
    ``# ---- NAME`` line."""
    for name, text in result.files.items():
        if len(result.files) > 1:
            console.out(f"# ---- {name}", highlight=False)
        console.out(text, end="", highlight=False)
