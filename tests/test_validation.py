"""core.validation and core.registry.find_operation: one wording for every recipe kind and every front."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamaforge.build.recipes import BuildRecipe, GitSource, PypiSdistSource
from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.registry import find_operation, operations
from llamaforge.core.validation import (
    describe_errors,
    did_you_mean,
    fields_at,
    read_toml,
    recipe_error,
    suggest,
)
from llamaforge.models.recipes import ModelExpectations, ModelRecipe
from llamaforge.models.remap.rules import MatchRules, MetadataRules, RemapRules, TypedValue

pytestmark = pytest.mark.quick


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: int = Field(ge=1)


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_ctx: int = Field(ge=1)
    inner: _Inner | None = None
    named: dict[str, _Inner] = {}
    levels: list[int] = []


def _error(data: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate(data)
    return caught.value


def test_suggestions() -> None:
    assert suggest("buidl", ["build", "builds.list"]) == "did you mean 'build'?"
    assert suggest("zzz", ["build"]) == "" and suggest("zzz", ["build"], end=" ") == ""
    assert suggest("rtx", ["rtx3090", "rtx4090"], n=2, cutoff=0.3, end=" ").endswith("? ")
    assert did_you_mean(["a", "b"]) == "did you mean 'a' or 'b'?" and did_you_mean([]) == ""


def test_parameter_errors_as_fields_and_as_flags() -> None:
    error = _error({"n_ctx": 0, "inner": {"depth": 0}})
    assert describe_errors(error) == (
        "n_ctx: Input should be greater than or equal to 1; inner.depth: Input should be greater than or equal to 1"
    )
    assert describe_errors(error, as_flags=True).startswith("--n-ctx: Input should be")


def test_the_nth_value_of_a_list_is_named_by_its_place() -> None:
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate({"n_ctx": 1, "levels": [1, "x"]})
    assert (
        describe_errors(caught.value)
        == "levels[1]: Input should be a valid integer, unable to parse string as an integer"
    )
    assert describe_errors(caught.value, as_flags=True).startswith(
        "--levels (value 2): Input should be a valid integer"
    )


def test_fields_at_walks_models_unions_tags_dicts_and_aliases() -> None:
    assert fields_at(_Outer, ("inner", "dept")) == ["depth"]
    assert fields_at(_Outer, ("named", "any", "dept")) == ["depth"]
    assert set(fields_at(BuildRecipe, ("targts",))) == set(BuildRecipe.model_fields)
    tags = {"git": GitSource, "pypi-sdist": PypiSdistSource}
    assert set(fields_at(BuildRecipe, ("source", "pypi-sdist", "buildnumber"), tags=tags)) == set(
        PypiSdistSource.model_fields
    )
    assert set(fields_at(ModelRecipe, ("expect", "x"))) == set(ModelExpectations.model_fields)
    assert "set" in fields_at(RemapRules, ("metadata", "sett"))  # the alias, as the file spells it
    assert set(fields_at(RemapRules, ("match", "architecture"))) == set(MatchRules.model_fields)
    assert "type" in fields_at(RemapRules, ("metadata", "set", "x.y", "typ"))
    assert set(fields_at(RemapRules, ("metadata", "x"))) == {
        info.alias or name for name, info in MetadataRules.model_fields.items()
    }
    assert {info.alias or name for name, info in TypedValue.model_fields.items()} == {"type", "value"}
    assert fields_at(_Outer, ("n_ctx", "x", "y")) == []


def test_recipe_error_names_the_file_each_field_and_suggests() -> None:
    error = recipe_error(
        _error({"n_ctx": 0, "inner": {"dept": 2}}), what="thing /x.toml", root=_Outer, hint="docs"
    )
    first, *problems = error.message.splitlines()
    assert first == "invalid thing /x.toml:"
    assert sorted(problems) == [
        "  inner.dept: unknown key",
        "  inner.depth: Field required",
        "  n_ctx: Input should be greater than or equal to 1",
    ]
    assert error.hint == "did you mean 'depth' instead of 'dept'?"
    plain = recipe_error(_error({"n_ctx": 0}), what="thing", root=_Outer, hint="see the docs")
    assert plain.hint == "see the docs"


def test_one_operation_lookup() -> None:
    registry = operations()
    assert find_operation("models.fit") is registry["models.fit"]
    with pytest.raises(InvalidOption, match="unknown operation 'fit'") as exact_only:
        find_operation("fit")  # the job manager's lookup: exact names
    assert "known: build, " in (exact_only.value.hint or "")
    with pytest.raises(InvalidOption, match=r"unknown operation 'models\.fti'") as typo:
        find_operation("models.fti")
    assert (typo.value.hint or "").startswith("did you mean 'models.fit'? known: ")
    assert find_operation("fit", short_names=True) is registry["models.fit"]
    with pytest.raises(InvalidOption, match="'list' is ambiguous") as ambiguous:
        find_operation("list", short_names=True)
    assert "builds.list" in (ambiguous.value.hint or "")
    with pytest.raises(InvalidOption, match="unknown operation 'x'"):
        find_operation("x", {})


def test_a_toml_file_that_cannot_be_read_is_named_with_what_to_do(tmp_path: Path) -> None:
    binary = tmp_path / "r.toml"
    binary.write_bytes(b"\xff\xfename = 1\n")
    with pytest.raises(RecipeError) as refused:
        read_toml(binary, "recipe")
    assert f"cannot read recipe {binary}: it is not UTF-8 text (byte 0" in refused.value.message
    assert "UTF-8" in (refused.value.hint or "")
    with pytest.raises(RecipeError) as refused:
        read_toml(tmp_path, "host inventory")
    assert f"cannot read host inventory {tmp_path}" in refused.value.message
    assert refused.value.hint == "give the path of a host inventory file"
