"""The ``deploy.render`` result for a person: the rendered files as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def manifests_cli(result: dict[str, Any], console: Console) -> None:
    """``deploy.render``: the file's text as it is (so ``> compose.yaml`` works); several files each after a
    ``# ---- NAME`` line."""
    files: dict[str, str] = result["files"]
    for name, text in files.items():
        if len(files) > 1:
            console.out(f"# ---- {name}", highlight=False)
        console.out(text, end="", highlight=False)
