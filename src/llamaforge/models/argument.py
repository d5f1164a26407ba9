"""The ``--model`` argument of the commands that serve a model (deploy, deploy.plan, smoke): a GGUF file, a model
recipe or a URL, resolved to a local file that llama.cpp can load, checked before anything is planned, run or
uploaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.events import CancelToken, Reporter, null_reporter
from llamaforge.models.fetch import fetch_model
from llamaforge.models.model_file import local_model_path, require_servable
from llamaforge.models.recipes import ModelRecipe, load_model_recipe


@dataclass(frozen=True)
class ModelArgument:
    """The model file an argument names, a label for reports, and its recipe (None for a file or a URL)."""

    path: Path
    label: str
    recipe: ModelRecipe | None = None


def resolve_model_argument(
    argument: str, *, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> ModelArgument:
    """The servable GGUF ``argument`` names: a local file (used where it lies), or the verified store copy of a
    recipe or URL (fetched when missing).

    A directory, a missing ``.gguf``, a file that is not a GGUF (``/etc/passwd``, an empty file) and a
    vocab-only GGUF are refused with an error naming the file."""
    local = local_model_path(argument)
    if local is not None and "://" not in argument:
        require_servable(local)
        return ModelArgument(local.resolve(), local.stem)
    recipe = None if "://" in argument else load_model_recipe(argument)
    fetched = fetch_model(recipe or argument, reporter=reporter, cancel=cancel)
    require_servable(fetched.path, name=fetched.source)
    label = Path(argument).stem if recipe is not None else fetched.path.stem
    return ModelArgument(fetched.path, label, recipe)
