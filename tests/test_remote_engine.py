"""The docker executor on a remote engine, the way users point it at one: DOCKER_HOST=tcp://HOST:2376 with
DOCKER_TLS_VERIFY and DOCKER_CERT_PATH. The remote engine is a second dockerd (its own data root, its own
bridge, a CA and server/client certificates made with openssl), listening only on 127.0.0.1 with TLS
verification; it gets the base and builder images by `docker save | docker load`, never from a registry. The
mini project is built there for real and its artifacts come back.

The engine is the session's first extra engine (tests/engines.py), shared with the builder-fleet tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engines import ExtraEngine, copy_image
from helpers import invoke, invoke_json, mini_recipe

pytestmark = pytest.mark.docker


@pytest.fixture
def remote_engine(extra_engines: list[ExtraEngine]) -> dict[str, str]:
    """DOCKER_* variables that reach the first extra engine over tcp + TLS on 127.0.0.1 (tests/engines.py)."""
    return extra_engines[0].env


def _copy_image(tag: str, env: dict[str, str], engines: list[ExtraEngine]) -> None:
    copy_image(tag, next(engine for engine in engines if engine.url == env["DOCKER_HOST"]))


def test_a_build_runs_on_a_remote_engine_over_tls(
    remote_engine: dict[str, str],
    extra_engines: list[ExtraEngine],
    base_image: str,
    tmp_path: Path,
    lf_home: Path,
) -> None:
    from llamaforge.build.executors import make_executor
    from llamaforge.build.plan import plan_build
    from llamaforge.build.recipes import load_recipe

    recipe = mini_recipe(tmp_path, ["llama-cli"])
    plan = plan_build(load_recipe(str(recipe)))
    assert plan.environment.image is not None
    make_executor("docker").prepare_environment(plan, lambda event: None)  # the builder image, on this engine
    for tag in (base_image, plan.environment.image.tag):
        _copy_image(tag, remote_engine, extra_engines)
    env = {**remote_engine, "LLAMAFORGE_HOME": str(lf_home)}
    built = invoke_json("build", "--recipe", str(recipe), env=env)["build"]
    binary = Path(built["path"]) / "bin" / "llama-cli"
    assert "commit 0c1e570" in subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    manifest = invoke_json("builds.show", built["key"], env=env)["manifest"]
    inspect = ["docker", "image", "inspect", "-f", "{{.Id}}", plan.environment.image.tag]
    remote_id = subprocess.run(
        inspect, env=remote_engine, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert manifest["image"]["builder_id"] == remote_id, (
        "the manifest names the remote engine's builder image"
    )
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q"], env=remote_engine, capture_output=True, text=True
    )
    assert "llamaforge-ccache" in volumes.stdout.split(), "the remote engine keeps its own ccache volume"
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=org.llamaforge.owned"],
        env=remote_engine,
        capture_output=True,
        text=True,
    )
    assert leftovers.stdout.strip() == "", "the build container was removed on the remote engine"


def test_a_remote_engine_without_the_client_certificate_is_a_clear_error(
    remote_engine: dict[str, str], tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**remote_engine, "LLAMAFORGE_HOME": str(lf_home), "DOCKER_TLS_VERIFY": "", "DOCKER_CERT_PATH": ""}
    result = invoke("build", "--recipe", str(recipe), env=env)
    assert result.returncode == 5, result.stderr
    assert f"cannot reach the Docker engine at {remote_engine['DOCKER_HOST']}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (lf_home / "builds").exists() or not any((lf_home / "builds").iterdir())
