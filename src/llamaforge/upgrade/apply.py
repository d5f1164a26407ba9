"""``--apply``: the recipe gets the new source pin and its series the rebased patches; nothing else is written.

The recipe file keeps its layout and comments: only its ``[source]`` table is rewritten, and the release it
names elsewhere (``bNNNN`` in the description, the sdist version in a comment) follows. The new text is parsed
as a recipe before anything is written; each file is replaced atomically."""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from llamaforge.build.patches import series_dir
from llamaforge.build.recipes import BuildRecipe, parse_recipe, recipe_dir, resolve_named_file
from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.paths import write_text_atomic

_TABLE = re.compile(r"^\s*\[")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    return json.dumps(str(value))


# The order the recipe models declare their fields in, which the shipped recipes follow.
_SOURCE_KEYS = ("kind", "url", "package", "version", "sha256", "subdir", "commit", "build_number", "date")


def render_source_table(source: dict[str, Any]) -> list[str]:
    """The ``[source]`` table's lines, keys in the order the recipe models declare them; the date a TOML date."""
    lines = ["[source]"]
    for key in sorted(
        source, key=lambda k: _SOURCE_KEYS.index(k) if k in _SOURCE_KEYS else len(_SOURCE_KEYS)
    ):
        value = source[key]
        if value is None:
            continue
        if key == "date":
            value = datetime.date.fromisoformat(str(value))
        lines.append(f"{key} = {_toml_value(value)}")
    return lines


def _replace_source(text: str, source: dict[str, Any], origin: Path) -> str:
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "[source]")
    except StopIteration:
        raise RecipeError(
            f"recipe {origin} has no [source] table to re-pin", hint="pin the source by hand"
        ) from None
    end = next((i for i in range(start + 1, len(lines)) if _TABLE.match(lines[i])), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return "\n".join([*lines[:start], *render_source_table(source), *lines[end:]]) + "\n"


def _follow_release(text: str, old: BuildRecipe, new_source: dict[str, Any]) -> str:
    """The release names outside [source] (description, comments) moved to the new release."""
    old_source = old.source
    replacements: list[tuple[str, str]] = []
    if old_source.build_number is not None and new_source.get("build_number") is not None:
        replacements.append((rf"\bb{old_source.build_number}\b", f"b{new_source['build_number']}"))
    if old_source.kind == "pypi-sdist" and new_source.get("kind") == "pypi-sdist":
        replacements.append(
            (rf"(?<![\d.]){re.escape(old_source.version)}(?![\d.])", str(new_source["version"]))
        )
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "[source]")
    end = next((i for i in range(start + 1, len(lines)) if _TABLE.match(lines[i])), len(lines))
    for index, line in enumerate(lines):
        if start <= index < end:
            continue
        moved = line
        for pattern, replacement in replacements:
            moved = re.sub(pattern, replacement, moved)
        lines[index] = moved
    return "\n".join(lines) + "\n"


def apply_upgrade(
    recipe: BuildRecipe, recipe_ref: str, new_source: dict[str, Any], candidate_series: Path
) -> list[str]:
    """Write the new pin into the recipe file and the rebased patches into its series; the files written."""
    path = resolve_named_file(recipe_ref, recipe_dir(), "build recipe")
    text = _replace_source(path.read_text(encoding="utf-8"), new_source, path)
    text = _follow_release(text, recipe, new_source)
    try:
        parse_recipe(tomllib.loads(text), name=path.stem, origin=path)
    except (RecipeError, tomllib.TOMLDecodeError) as error:
        raise InvalidOption(
            f"the re-pinned recipe {path} would not load: {error}", hint="nothing was written"
        ) from None
    writes: list[tuple[Path, str]] = [(path, text)]
    if recipe.patches is not None:
        target = series_dir(recipe.patches)
        for file in sorted(candidate_series.iterdir()):
            if file.is_file():
                content = file.read_text(encoding="utf-8")
                current = target / file.name
                if not current.is_file() or current.read_text(encoding="utf-8") != content:
                    writes.append((current, content))
    for destination, content in writes:
        write_text_atomic(destination, content)
    return [str(destination) for destination, _ in writes]
