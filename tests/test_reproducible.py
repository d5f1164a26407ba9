"""The reproducibility check on a tiny real project: a deterministic build passes, a salted one is caught
with the differing ELF sections named and the rebuilt copy kept."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import mini_recipe
from llamaforge.build.execute import run_build
from llamaforge.build.executors import make_executor
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.build.reproducible import check_reproducible, differing_sections, elf_sections

pytestmark = [
    pytest.mark.quick,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("cmake", "ninja", "cc")), reason="cmake, ninja and cc needed"
    ),
]


def _compile(tmp_path: Path, name: str, text: str) -> bytes:
    source = tmp_path / f"{name}.c"
    source.write_text(f'#include <stdio.h>\nint main(void) {{ puts("{text}"); return 0; }}\n')
    binary = tmp_path / name
    subprocess.run(["cc", "-O1", "-o", binary, source], check=True)
    return binary.read_bytes()


def test_differing_sections_names_rodata(tmp_path: Path) -> None:
    a = _compile(tmp_path, "a", "hello AAAA")
    b = _compile(tmp_path, "b", "hello BBBB")
    assert ".text" in elf_sections(a) and ".rodata" in elf_sections(a)
    assert ".rodata" in differing_sections(a, b)
    assert ".text" not in differing_sections(a, b)
    assert differing_sections(a, a) == []
    assert elf_sections(b"not an elf") == {}


def test_deterministic_build_is_reproducible(tmp_path: Path, lf_home: Path) -> None:
    options = BuildOptions()
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli"]))), options)
    result = run_build(plan, options, executor=make_executor("local"))
    report = check_reproducible(result, plan, executor=make_executor("local"))
    assert report.reproducible, report.to_json()
    assert report.identical == ("bin/llama-cli",)


def test_salted_build_is_caught_and_explained(tmp_path: Path, lf_home: Path) -> None:
    options = BuildOptions()
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli", "llama-random"]))), options)
    result = run_build(plan, options, executor=make_executor("local"))
    report = check_reproducible(result, plan, executor=make_executor("local"))
    assert not report.reproducible
    assert report.identical == ("bin/llama-cli",)
    (diff,) = report.different
    assert diff.path == "bin/llama-random"
    assert ".rodata" in diff.sections
    assert "constant data differs" in diff.explanation
    assert diff.kept and Path(diff.kept).is_file()


def test_a_build_that_is_not_reproducible_fails_the_build_task(tmp_path: Path, lf_home: Path) -> None:
    """`invoke build --check-reproducible` on a salted build: exit 8 (NotReproducible), the report still on stdout."""
    import json
    import os

    from helpers import invoke

    recipe = mini_recipe(tmp_path, ["llama-cli", "llama-random"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    result = invoke(
        "build", "--recipe", str(recipe), "--executor", "local", "--check-reproducible", "--json", env=env
    )
    assert result.returncode == 8, result.stderr[-2000:]
    report = json.loads(result.stdout)["reproducibility"]
    assert report["reproducible"] is False
    assert [item["path"] for item in report["different"]] == ["bin/llama-random"]
    assert "not reproducible" in result.stderr and "bin/llama-random" in result.stderr


@pytest.mark.parametrize("name", ["../../outside", "/etc/passwd", "bin/../../x", "bin\\..\\x"])
def test_a_manifest_artifact_outside_the_build_is_refused_before_anything_runs(
    name: str, tmp_path: Path, lf_home: Path
) -> None:
    from llamaforge.build.execute import BuildResult
    from llamaforge.core.errors import CacheError

    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli"]))), BuildOptions())
    manifest = {"artifacts": {name: {"sha256": "0" * 64, "size": 1}}}
    result = BuildResult("k" * 16, tmp_path / "build", manifest, cached=True, seconds=0.0)
    with pytest.raises(CacheError) as info:
        check_reproducible(result, plan, executor=make_executor("local"))
    assert repr(name) in info.value.message
    assert not (lf_home / "logs").exists() and not (lf_home / "reproduce").exists()
