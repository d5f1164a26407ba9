"""Two real Docker engines (this machine's, and a second dockerd of the session's extra engines, reached over
TCP + TLS on 127.0.0.1) and one Redis server: a matrix fanned out to the second engine with ``--builders`` hits
in the fleet's shared compiler cache what the first engine compiled, and ``--check-reproducible --on-builder far
--builders FLEET`` rebuilds the first engine's build on the second one (the builder image sent by id) with ccache
off: bit-identical, with both builders in the report and the manifest. A builder whose builder image compiles
differently (its ``cc`` adds -O0) is caught, the artifact and its ELF sections named.

Builder containers that use the remote cache get the engine host's network: both engines here share this
machine's network namespace, so the Redis port published on 127.0.0.1 is the same address for each."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import ExtraEngine, copy_image
from helpers import invoke, mini_recipe
from test_ccache_remote import PASSWORD, PREFIX, _docker, _manifest, redis  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def far(extra_engines: list[ExtraEngine], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtraEngine]:
    """The session's second extra engine, left as it was found: the mini project's builder image and the ccache
    volumes the tests make there are removed unless it had them."""
    from llamaforge.build.plan import plan_build
    from llamaforge.build.recipes import load_recipe

    engine = extra_engines[-1]
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path_factory.mktemp("plan"), ["llama-cli"]))))
    assert plan.environment.image is not None
    had = engine.has_image(plan.environment.image.tag)
    yield engine
    engine.docker("volume", "rm", "-f", f"{PREFIX}-far", check=False)
    if not had:
        engine.docker("image", "rm", plan.environment.image.tag, check=False)


@pytest.fixture
def fleet(far: ExtraEngine, redis: str, tmp_path: Path) -> Path:  # noqa: F811
    """A fleet of the two engines sharing the Redis cache (its password in a file beside the fleet file)."""
    (tmp_path / "redis-password").write_text(PASSWORD + "\n", encoding="utf-8")
    path = tmp_path / "pair.toml"
    path.write_text(
        f"""description = "this machine's engine and a second dockerd"

[ccache]
remote_storage = "{redis}"
password_file = "redis-password"

[[builders]]
name = "near"
engine = "unix:///var/run/docker.sock"
platforms = ["linux"]

[[builders]]
name = "far"
engine = "{far.url}"
tls_verify = true
cert_path = "{far.client}"
platforms = ["linux"]
""",
        encoding="utf-8",
    )
    return path


def _local_env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DOCKER_")}
    return {**env, "LLAMAFORGE_HOME": str(home)}


def test_a_fleet_builder_hits_what_another_engine_compiled(
    far: ExtraEngine, fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    """This machine's engine fills the Redis cache (--ccache-remote); then a matrix fanned out to the far builder
    (--builders FLEET:far) builds the same key there with an empty local cache: its one compilation comes from
    the fleet's [ccache]."""
    from llamaforge.build.farm import load_fleet

    cache = load_fleet(fleet).remote_cache()
    assert cache is not None and cache.password() == PASSWORD
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {
        **_local_env(lf_home),
        "LLAMAFORGE_CCACHE_VOLUME": f"{PREFIX}-far",
    }  # a fresh volume on each engine
    remote = ["--ccache-remote", cache.url, "--ccache-password-file", str(cache.password_file)]
    try:
        near = invoke(
            "build", "--recipe", str(recipe), "--cmake", "LLAMA_MINI_CCACHE=ON", "--json", *remote, env=env
        )
    finally:
        _docker("volume", "rm", "-f", f"{PREFIX}-far", check=False)
    first = _manifest(near)
    matrix = tmp_path / "one.toml"
    matrix.write_text(
        f'recipe = "{recipe}"\n\n[[builds]]\nname = "mini"\ncmake = {{ LLAMA_MINI_CCACHE = true }}\n'
    )
    fanned = invoke(
        "build", "--matrix", str(matrix), "--builders", f"{fleet}:far", "--force", "--json", env=env
    )
    assert fanned.returncode == 0, fanned.stderr[-3000:]
    (row,) = json.loads(fanned.stdout)["matrix"]
    assert row["key"] == first["key"] and row["builder"].startswith("far")
    second = json.loads((lf_home / "builds" / row["key"] / "manifest.json").read_text())
    assert first["image"]["engine"] == "unix:///var/run/docker.sock"  # type: ignore[index]
    assert second["image"]["engine"] == far.url and second["builder"]["name"] == "far"
    assert second["ccache"]["remote_storage"] == cache.url
    assert second["ccache"]["remote_hits"] == second["ccache"]["calls"] == 1
    assert PASSWORD not in fanned.stderr + fanned.stdout


def test_a_build_rebuilt_on_another_builder_is_bit_identical(
    far: ExtraEngine, fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    check = ["--check-reproducible", "--on-builder", "far", "--builders", str(fleet), "--json"]
    result = invoke("build", "--recipe", str(recipe), *check, env=_local_env(lf_home))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    report = data["reproducibility"]
    assert report["reproducible"] and report["identical"] == ["bin/llama-cli"]
    assert report["built_on"] == "unix:///var/run/docker.sock"
    assert report["rebuilt_on"] == f"far ({far.url})"
    assert report["built_in"] == report["rebuilt_in"] and report["note"] is None
    manifest = json.loads((Path(data["build"]["path"]) / "manifest.json").read_text())
    (record,) = manifest["reproducibility"]
    assert record["built_on"] == report["built_on"] and record["rebuilt_on"] == report["rebuilt_on"]
    assert record["reproducible"] is True and record["different"] == []


@pytest.fixture
def skewed_far(far: ExtraEngine, tmp_path: Path) -> Iterator[ExtraEngine]:
    """The far engine with another image under the builder tag: its ``cc`` compiles at -O0 whatever CMake asks
    for. The real image is tagged back afterwards and the other one removed."""
    from llamaforge.build.plan import plan_build
    from llamaforge.build.recipes import load_recipe

    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli"]))))
    assert plan.environment.image is not None
    tag = plan.environment.image.tag
    copy_image(tag, far)
    original = far.docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
    (tmp_path / "Dockerfile").write_text(
        f"FROM {tag}\n"
        "RUN printf '#!/bin/sh\\nexec gcc \"$@\" -O0\\n' > /usr/local/bin/cc && chmod 755 /usr/local/bin/cc\n",
        encoding="utf-8",
    )
    far.docker("build", "-q", "-t", tag, str(tmp_path))
    skewed = far.docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
    try:
        yield far
    finally:
        far.docker("tag", original, tag)
        far.docker("image", "rm", skewed, check=False)


def test_a_builder_that_compiles_differently_is_caught_with_its_sections(
    skewed_far: ExtraEngine, fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    check = ["--check-reproducible", "--on-builder", "far", "--builders", str(fleet), "--json"]
    result = invoke("build", "--recipe", str(recipe), *check, env=_local_env(lf_home))
    assert result.returncode == 8, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout)["reproducibility"]
    (diff,) = report["different"]
    assert diff["path"] == "bin/llama-cli" and ".text" in diff["sections"]
    assert "machine code differs" in diff["explanation"]
    assert report["note"] and "may come from the images" in report["note"]
    assert "bin/llama-cli" in result.stderr and "not reproducible" in result.stderr
    manifest = json.loads((lf_home / "builds" / report["key"] / "manifest.json").read_text())
    assert manifest["reproducibility"][-1]["different"][0]["path"] == "bin/llama-cli"


def test_on_builder_needs_its_fleet_a_known_builder_and_the_check(
    fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    recipe = str(mini_recipe(tmp_path, ["llama-cli"]))
    cases = [
        (["--check-reproducible", "--on-builder", "far"], "add --builders FLEET"),
        (["--on-builder", "far", "--builders", str(fleet)], "add --check-reproducible"),
        (["--check-reproducible", "--on-builder", "fra", "--builders", str(fleet)], "did you mean 'far'"),
    ]
    for extra, words in cases:
        result = invoke("build", "--recipe", recipe, "--dry-run", *extra, env=_local_env(lf_home))
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
