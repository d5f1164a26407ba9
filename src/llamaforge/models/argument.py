"""The ``--model`` argument of the commands that serve a model (deploy, deploy.plan, smoke): a GGUF file, a model
recipe or a URL, resolved to a local file that llama.cpp can load, checked before anything is planned, run or
uploaded; and the model of ``models.fit`` and ``models.split``, which read a local file only
(:func:`resolve_model_file`). Both take the tiny models' names (:mod:`llamaforge.models.tiny`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Reporter, null_reporter
from llamaforge.models.fetch import fetch_model
from llamaforge.models.inspect import resolve_local_model
from llamaforge.models.model_file import local_model_path, require_servable
from llamaforge.models.recipes import ModelRecipe, load_model_recipe
from llamaforge.models.tiny import named_tiny_model


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
    vocab-only GGUF are refused with an error naming the file. A tiny model's name (``tiny``, ``tiny-q4_k_m``)
    is its file here, written on first use."""
    tiny = named_tiny_model(argument, reporter, cancel)
    if tiny is not None:
        return ModelArgument(*tiny)
    local = local_model_path(argument)
    if local is not None and "://" not in argument:
        require_servable(local)
        return ModelArgument(local.resolve(), local.stem)
    recipe = None if "://" in argument else load_model_recipe(argument)
    fetched = fetch_model(recipe or argument, reporter=reporter, cancel=cancel)
    require_servable(fetched.path, name=fetched.source)
    label = Path(argument).stem if recipe is not None else fetched.path.stem
    return ModelArgument(fetched.path, label, recipe)


def resolve_model_file(target: str) -> Path:
    """The local GGUF of a FILE or fetched RECIPE argument (InvalidOption/RecipeError otherwise)."""
    path, recipe = resolve_local_model(target)
    if path is not None:
        if not path.is_file():
            raise InvalidOption(f"model file {path} does not exist")
        return path
    if recipe is not None:
        raise InvalidOption(
            f"model recipe {recipe.name!r} is not fetched yet",
            hint=f"run `invoke models.fetch {recipe.name}` first (or `invoke models.inspect {recipe.name} "
            "--remote` to look at its header without downloading)",
        )
    raise InvalidOption(
        f"models.fit needs a local GGUF or a fetched recipe, not {target!r}",
        hint="fetch it first (`invoke models.fetch URL`)",
    )
