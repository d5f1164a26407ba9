"""Two real Docker engines (this machine's, and a second dockerd reached over TCP + TLS on 127.0.0.1) and one
Redis server: the second engine hits in the shared compiler cache what the first one compiled, and
``--check-reproducible --on-builder far --builders FLEET`` rebuilds the first engine's build on the second one
with ccache off: bit-identical, with both builders in the report and the manifest. A builder whose builder image
compiles differently (its ``cc`` adds -O0) is caught, the artifact and its ELF sections named.

Builder containers that use the remote cache get the engine host's network: both engines here share this
machine's network namespace, so the Redis port published on 127.0.0.1 is the same address for each."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke, mini_recipe
from test_ccache_remote import PASSWORD, PREFIX, _docker, _manifest, redis  # noqa: F401 - the fixture
from test_remote_engine import _copy_image, remote_engine  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def far_engine(
    remote_engine: dict[str, str],  # noqa: F811 - the imported fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """The second engine, holding the mini project's builder image (sent by `docker save | docker load`, so its
    id is the first engine's)."""
    from llamaforge.build.executors import make_executor
    from llamaforge.build.plan import plan_build
    from llamaforge.build.recipes import load_recipe

    plan = plan_build(load_recipe(str(mini_recipe(tmp_path_factory.mktemp("plan"), ["llama-cli"]))))
    assert plan.environment.image is not None
    make_executor("docker").prepare_environment(plan, lambda event: None)
    _copy_image(plan.environment.image.tag, remote_engine)
    return {**remote_engine, "BUILDER_TAG": plan.environment.image.tag}


@pytest.fixture
def fleet(far_engine: dict[str, str], redis: str, tmp_path: Path) -> Path:  # noqa: F811
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
engine = "{far_engine["DOCKER_HOST"]}"
tls_verify = true
cert_path = "{far_engine["DOCKER_CERT_PATH"]}"
platforms = ["linux"]
""",
        encoding="utf-8",
    )
    return path


def _local_env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DOCKER_")}
    return {**env, "LLAMAFORGE_HOME": str(home)}


def test_the_second_engine_hits_what_the_first_compiled(
    far_engine: dict[str, str], fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    from llamaforge.build.farm import load_fleet

    cache = load_fleet(fleet).remote_cache()
    assert cache is not None and cache.password() == PASSWORD
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    volume = f"{PREFIX}-near"
    options = ["--cmake", "MINI_CCACHE=ON", "--json", "--ccache-remote", cache.url]
    options += ["--ccache-password-file", str(cache.password_file)]
    try:
        near = invoke(
            "build",
            "--recipe",
            str(recipe),
            *options,
            env={**_local_env(lf_home), "LLAMAFORGE_CCACHE_VOLUME": volume},
        )
    finally:
        _docker("volume", "rm", "-f", volume, check=False)
    first = _manifest(near)
    far_env = {**far_engine, "LLAMAFORGE_HOME": str(lf_home), "LLAMAFORGE_CCACHE_VOLUME": volume}
    far = invoke("build", "--recipe", str(recipe), *options, "--force", env=far_env)
    subprocess.run(["docker", "volume", "rm", "-f", volume], env=far_engine, capture_output=True, check=False)
    second = _manifest(far)
    assert first["key"] == second["key"]
    assert first["image"]["engine"] == "unix:///var/run/docker.sock"  # type: ignore[index]
    assert second["image"]["engine"] == far_engine["DOCKER_HOST"]  # type: ignore[index]
    assert second["ccache"]["remote_hits"] == second["ccache"]["calls"] == 1  # type: ignore[index]


def test_a_build_rebuilt_on_another_builder_is_bit_identical(
    far_engine: dict[str, str], fleet: Path, tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    check = ["--check-reproducible", "--on-builder", "far", "--builders", str(fleet), "--json"]
    result = invoke("build", "--recipe", str(recipe), *check, env=_local_env(lf_home))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    report = data["reproducibility"]
    assert report["reproducible"] and report["identical"] == ["bin/llama-cli"]
    assert report["built_on"] == "unix:///var/run/docker.sock"
    assert report["rebuilt_on"] == f"far ({far_engine['DOCKER_HOST']})"
    assert report["built_in"] == report["rebuilt_in"] and report["note"] is None
    manifest = json.loads((Path(data["build"]["path"]) / "manifest.json").read_text())
    (record,) = manifest["reproducibility"]
    assert record["built_on"] == report["built_on"] and record["rebuilt_on"] == report["rebuilt_on"]
    assert record["reproducible"] is True and record["different"] == []


@pytest.fixture
def skewed_far_engine(far_engine: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The far engine with another image under the builder tag: its ``cc`` compiles at -O0 whatever CMake asks
    for. The real image is tagged back afterwards."""
    tag = far_engine["BUILDER_TAG"]
    inspect = ["docker", "image", "inspect", "-f", "{{.Id}}", tag]
    original = subprocess.run(
        inspect, env=far_engine, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "Dockerfile").write_text(
        f"FROM {tag}\n"
        "RUN printf '#!/bin/sh\\nexec gcc \"$@\" -O0\\n' > /usr/local/bin/cc && chmod 755 /usr/local/bin/cc\n",
        encoding="utf-8",
    )
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(tmp_path)], env=far_engine, capture_output=True, check=True
    )
    try:
        yield far_engine
    finally:
        subprocess.run(["docker", "tag", original, tag], env=far_engine, capture_output=True, check=True)


def test_a_builder_that_compiles_differently_is_caught_with_its_sections(
    skewed_far_engine: dict[str, str], fleet: Path, tmp_path: Path, lf_home: Path
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
