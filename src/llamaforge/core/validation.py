"""One formatter for validation errors and "did you mean …?", used by every recipe kind and every front.

* :func:`suggest` (and :func:`did_you_mean`) words the suggestion for a name that is not known (an operation,
  a recipe, a GPU, a threshold …).
* :func:`describe_errors` puts pydantic's complaints about parameters on one line, as fields or as the
  ``--flags`` of a command line.
* :func:`recipe_error` turns pydantic's complaints about a recipe file into a :class:`RecipeError` that names
  the file and each field, with "did you mean …?" for unknown keys.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ValidationError

from llamaforge.core.errors import RecipeError

__all__ = ["closest", "describe_errors", "did_you_mean", "fields_at", "messages", "recipe_error", "suggest"]

Loc = tuple[int | str, ...]


def closest(word: str, known: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The names in ``known`` closest to ``word``, best first (at most ``n``; empty when none is close)."""
    return difflib.get_close_matches(word, list(known), n=n, cutoff=cutoff)


def did_you_mean(names: Iterable[str], *, end: str = "") -> str:
    """``did you mean 'x'?`` (``'x' or 'y'`` for several names) followed by ``end``; ``""`` for no names."""
    shown = [repr(name) for name in names]
    return f"did you mean {' or '.join(shown)}?{end}" if shown else ""


def suggest(word: str, known: Iterable[str], *, n: int = 1, cutoff: float = 0.6, end: str = "") -> str:
    """:func:`did_you_mean` for the names in ``known`` closest to ``word``; ``""`` when none is close."""
    return did_you_mean(closest(word, known, n=n, cutoff=cutoff), end=end)


def _message(item: Mapping[str, Any]) -> str:
    return str(item["msg"]).removeprefix("Value error, ")


def messages(error: ValidationError) -> str:
    """Pydantic's problems alone, ``; ``-joined: for a value that is one field, where a field name adds nothing."""
    return "; ".join(_message(item) for item in error.errors())


def describe_errors(error: ValidationError, *, as_flags: bool = False) -> str:
    """Pydantic's errors as ``field: problem; …`` (``--field-name: problem`` with ``as_flags``), without
    repeating the caller's values."""
    parts = []
    for item in error.errors():
        if not item["loc"]:  # a check across fields: its message names them
            parts.append(_message(item))
            continue
        parts.append(f"{_location(item['loc'], as_flags=as_flags)}: {_message(item)}")
    return "; ".join(parts)


def _location(loc: tuple[int | str, ...], *, as_flags: bool) -> str:
    """Where a problem is: ``n_ctx``, ``inner.depth``, ``concurrency[0]``; as a flag ``--n-ctx`` and, for the Nth
    value of a repeated flag, ``--concurrency (value N)``."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f" (value {part + 1})" if as_flags else f"[{part}]"
        elif not name:
            name = f"--{part.replace('_', '-')}" if as_flags else part
        else:
            name += f".{part}"
    return name


def _members(annotation: Any) -> list[Any]:
    """The types an annotation may hold: unions and ``Annotated`` unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [annotation]


def _field(model: type[BaseModel], name: str) -> Any:
    for field_name, info in model.model_fields.items():
        if name in (field_name, info.alias):
            return info.annotation
    return None


def _step(annotation: Any, part: int | str) -> Any:
    """The annotation one ``loc`` element further in (a model field, a dict value, a list item)."""
    for member in _members(annotation):
        origin = typing.get_origin(member)
        if isinstance(member, type) and issubclass(member, BaseModel) and isinstance(part, str):
            found = _field(member, part)
            if found is not None:
                return found
        elif origin in (dict, Mapping) and isinstance(part, str):
            return typing.get_args(member)[1]
        elif origin in (list, tuple) and isinstance(part, int):
            return typing.get_args(member)[0]
    return None


def fields_at(
    root: type[BaseModel], loc: Loc, *, tags: Mapping[str, type[BaseModel]] | None = None
) -> list[str]:
    """The keys valid where ``loc``'s last element sits (``tags``: discriminated-union tags pydantic puts in
    a ``loc``, and the model each selects); the key spellings are the aliases where a field has one."""
    annotation: Any = root
    for part in loc[:-1]:
        if tags and isinstance(part, str) and part in tags:
            annotation = tags[part]
            continue
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    return [
        info.alias or name
        for member in _members(annotation)
        if isinstance(member, type) and issubclass(member, BaseModel)
        for name, info in member.model_fields.items()
    ]


def recipe_error(
    error: ValidationError,
    *,
    what: str,
    root: type[BaseModel],
    tags: Mapping[str, type[BaseModel]] | None = None,
    hint: str | None = None,
) -> RecipeError:
    """``invalid {what}:`` and one line per problem (``field.path: unknown key`` / ``field.path: problem``);
    the hint suggests the key meant for each unknown one, else ``hint``."""
    problems: list[str] = []
    hints: list[str] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        dotted = ".".join(str(part) for part in loc if not (tags and part in tags)) or "(top level)"
        if item["type"] == "extra_forbidden":
            problems.append(f"{dotted}: unknown key")
            close = closest(str(loc[-1]), fields_at(root, loc, tags=tags))
            if close:
                hints.append(f"did you mean {close[0]!r} instead of {loc[-1]!r}?")
        else:
            problems.append(f"{dotted}: {_message(item)}")
    return RecipeError(f"invalid {what}:\n  " + "\n  ".join(problems), hint=" ".join(hints) or hint)


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML document in ``path`` (a ``what``: "build recipe", "host inventory" …); RecipeError naming the
    file when it cannot be read or is not TOML."""
    try:
        # utf-8-sig: Windows editors (Notepad) start UTF-8 files with a byte-order mark, which TOML's grammar
        # does not allow and tomllib reported as "Invalid statement (at line 1, column 1)"
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"{what} {path} is not valid TOML: {error}", hint="fix the syntax") from None
    except UnicodeDecodeError as error:
        raise RecipeError(
            f"cannot read {what} {path}: it is not UTF-8 text (byte {error.start}: {error.reason})",
            hint="a TOML file is UTF-8 text: save it as such, or give the right file",
        ) from None
    except OSError as error:
        raise RecipeError(
            f"cannot read {what} {path}: {error.strerror or error}",
            hint=f"give the path of a {what} file" if path.is_dir() else None,
        ) from None


# Docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest], lower-case path
# components, a tag of at most 128 word characters, dots and dashes. A reference reaches Dockerfiles (FROM) and
# scripts, so nothing outside it (a newline, a space, `$`) may pass.
_IMAGE_REFERENCE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


def check_image_reference(value: str) -> str:
    """``value`` when it is an image reference by Docker's grammar (``debian:bookworm``,
    ``nvidia/cuda:12.8.1-devel-ubuntu24.04``, ``registry:5000/team/img@sha256:…``); ValueError otherwise."""
    if len(value) > 255 or not _IMAGE_REFERENCE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an image reference (e.g. debian:bookworm or nvidia/cuda:12.8.1-devel)"
        )
    return value


#: An image reference, checked when read (recipes, options, manifests).
ImageReference = Annotated[str, AfterValidator(check_image_reference)]

# A recipe's name: the file name without .toml. It reaches build.sh comments and labels.
_RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_recipe_name(value: str) -> str:
    """``value`` when it is a recipe name (letters, digits, ``.``, ``_``, ``-``; empty before a file names it)."""
    if value and not _RECIPE_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a recipe name (letters, digits, '.', '_' and '-', at most 64)")
    return value


# A build target: a CMake target name that becomes a `cmake --build --target` argument and a file name in bin/.
# It may not start with '-' (it would read as an option) or '.'.
_TARGET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


def check_target_name(value: str) -> str:
    """``value`` when it is a build target name (``llama-server``); ValueError for one that starts with ``-``
    or holds anything but letters, digits, ``_``, ``.``, ``+`` and ``-``."""
    if not _TARGET_NAME.fullmatch(value):
        raise ValueError(
            f"target {value!r} is not a CMake target name (letters, digits, '_', '.', '+' and '-', "
            "not starting with '-' or '.')"
        )
    return value


def check_target_options(params: BaseModel, target: str, owners: Mapping[str, str]) -> None:
    """Refuse an option set away from its default when only another target reads it (``owners``: option name →
    the one target that reads it): ``--listen 0.0.0.0`` with ``--target systemd`` would be dropped, and the
    user would believe the service exposed."""
    fields = type(params).model_fields
    for name, owner in owners.items():
        if owner != target and getattr(params, name) != fields[name].get_default(call_default_factory=True):
            raise ValueError(
                f"--{name.replace('_', '-')} is read by --target {owner} only, not by --target {target}"
            )


def booleans_for_numbers(name: str, value: Any, schema: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """Where ``value`` (of the parameter ``name`` whose JSON schema is ``schema``) gives a boolean for a number,
    alone or in a list (``name``, ``name[1]``), with the boolean: pydantic's lax mode reads True as 1, so
    ``ctx: true`` planned a context of one token and ``concurrency: [true]`` ran one client. Each front says it
    in its own words."""
    if isinstance(value, bool):
        if _takes_boolean(schema) or not _takes_number(schema):
            return []  # a boolean, or a value pydantic refuses in its own words (a string field)
        return [(name, value)]
    if isinstance(value, list) and (items := _item_schemas(schema)):
        return [
            found
            for index, item in enumerate(value)
            if all(booleans_for_numbers(f"{name}[{index}]", item, part) for part in items)
            for found in booleans_for_numbers(f"{name}[{index}]", item, items[0])
        ]
    return []


def _takes_boolean(schema: Mapping[str, Any]) -> bool:
    if "type" not in schema and "anyOf" not in schema:
        return True  # any value
    return schema.get("type") == "boolean" or any(_takes_boolean(part) for part in schema.get("anyOf", []))


def _takes_number(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") in ("integer", "number") or any(
        _takes_number(part) for part in schema.get("anyOf", [])
    )


def _item_schemas(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schemas of an array's items that ``schema`` (or one of its ``anyOf`` parts) allows."""
    if schema.get("type") == "array":
        return [schema.get("items", {})]
    return [item for part in schema.get("anyOf", []) for item in _item_schemas(part)]
