from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.build.recipes import list_recipes, load_recipe, recipe_json_schema
from llamaforge.core.errors import RecipeError
from llamaforge.core.paths import data_dir

pytestmark = pytest.mark.quick

SCHEMA = data_dir("recipes") / "schema" / "build-recipe.schema.json"


def test_shipped_recipes_load_and_pin_b11312() -> None:
    assert {"default", "github"} <= set(list_recipes())
    for name in list_recipes():
        recipe = load_recipe(name)
        assert recipe.source.commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
        assert recipe.source.build_number == 11312
    default = load_recipe("default")
    assert default.source.kind == "pypi-sdist"
    assert default.backend == "cpu"
    assert default.images["cuda"].tag.startswith("nvidia/cuda:")


def test_checked_in_schema_matches_model() -> None:
    # Regenerate with: python -c "from llamaforge.build.recipes import recipe_json_schema as s; print(s(), end='')" > …
    assert SCHEMA.read_text(encoding="utf-8") == recipe_json_schema()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD_SOURCE = """
[source]
kind = "archive"
url = "/tmp/x.tar.gz"
sha256 = "%s"
commit = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
build_number = 11312
""" % ("a" * 64)


def test_unknown_key_names_file_field_and_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path, 'targts = ["llama-cli"]\n' + GOOD_SOURCE)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert str(path) in info.value.message
    assert "targts: unknown key" in info.value.message
    assert "did you mean 'targets'" in (info.value.hint or "")


def test_unknown_nested_key_suggests_within_source(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SOURCE.replace("build_number", "buildnumber"))
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert "source.buildnumber: unknown key" in info.value.message
    assert "did you mean 'build_number'" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (GOOD_SOURCE.replace("a" * 64, "abc"), "source.sha256"),
        (GOOD_SOURCE + '\ncuda_architectures = ["77"]\n', "invalid CUDA arch '77'"),
        ('backend = "rocm"\n' + GOOD_SOURCE, "backend"),
        ("[source\n", "not valid TOML"),
        (GOOD_SOURCE.replace('kind = "archive"', 'kind = "svn"'), "source"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: str, needle: str) -> None:
    # cuda_architectures must sit above [source] to be top level; move it for that case
    if "cuda_architectures" in text:
        text = 'cuda_architectures = ["77"]\n' + GOOD_SOURCE
    with pytest.raises(RecipeError) as info:
        load_recipe(str(_write(tmp_path, text)))
    assert needle in info.value.render()


def test_unknown_recipe_name_suggests() -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe("defualt")
    assert "did you mean 'default'" in (info.value.hint or "")
