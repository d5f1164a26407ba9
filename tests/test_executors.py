"""Executors, cache, locking and failure paths on a tiny real CMake project (seconds, not minutes).

The same build script and store code run here as for llama.cpp; test_build_docker.py builds llama.cpp itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke, invoke_json, mini_recipe
from llamaforge.build.execute import run_build
from llamaforge.build.executors import make_executor
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.build.store import list_builds
from llamaforge.core.errors import BuildFailed, Cancelled
from llamaforge.core.events import CancelToken, Event

pytestmark = pytest.mark.quick

needs_local_toolchain = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("cmake", "ninja", "cc")), reason="cmake, ninja and cc needed"
)


@pytest.fixture
def owned_before(docker_engine: object) -> set[str]:
    """Ids of llamaforge containers that existed before the test (e.g. another build on this machine)."""
    return {c.id for c in docker_engine.containers.list(all=True, filters={"label": "org.llamaforge.owned"})}  # type: ignore[attr-defined]


def _leftovers(client: object, before: set[str]) -> list[str]:
    owned = client.containers.list(all=True, filters={"label": "org.llamaforge.owned"})  # type: ignore[attr-defined]
    return [c.id for c in owned if c.id not in before]


@needs_local_toolchain
def test_local_executor_builds_caches_and_maps_paths(tmp_path: Path, lf_home: Path) -> None:
    options = BuildOptions()
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli"]))), options)
    first = run_build(plan, options, executor=make_executor("local"))
    assert not first.cached
    output = subprocess.run([first.artifact("llama-cli")], capture_output=True, text=True, check=True).stdout
    assert "build 11312, commit 0c1e570" in output
    assert "file ./main.c" in output, "source paths must be mapped out of the binary"
    manifest = first.manifest
    assert manifest["image"]["executor"] == "local"
    assert manifest["artifacts"]["bin/llama-cli"]["size"] == first.artifact("llama-cli").stat().st_size
    second = run_build(plan, options, executor=make_executor("local"))
    assert second.cached and second.key == first.key
    assert not any((lf_home / "tmp").iterdir()), "staging directories must not be left behind"


@needs_local_toolchain
def test_local_build_failure_keeps_log_and_publishes_nothing(tmp_path: Path, lf_home: Path) -> None:
    options = BuildOptions()
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-broken"]))), options)
    with pytest.raises(BuildFailed) as info:
        run_build(plan, options, executor=make_executor("local"))
    assert any("this_does_not_compile" in line for line in info.value.tail)
    assert info.value.log_path and Path(info.value.log_path).is_file()
    assert list_builds() == []
    assert not any((lf_home / "tmp").iterdir())


@pytest.mark.docker
def test_docker_build_failure_reports_tail_and_cleans_up(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-broken"])
    result = invoke("build", "--recipe", str(recipe), env={**os.environ, "LLAMAFORGE_HOME": str(lf_home)})
    assert result.returncode == 6, result.stderr
    assert "this_does_not_compile" in result.stderr
    assert "full log:" in result.stderr
    assert "Traceback" not in result.stderr
    assert _leftovers(docker_engine, owned_before) == []
    assert list_builds() == []


@pytest.mark.docker
def test_docker_build_cancel_removes_container(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    options = BuildOptions()
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli", "llama-slow"]))), options)
    cancel = CancelToken()
    seen: list[str] = []

    def reporter(event: Event) -> None:
        seen.append(event.message)
        if event.kind == "stage" and event.message == "build":
            threading.Timer(3.0, cancel.cancel).start()

    started = time.monotonic()
    with pytest.raises(Cancelled):
        run_build(plan, options, executor=make_executor("docker"), reporter=reporter, cancel=cancel)
    assert time.monotonic() - started < 55, "cancel must stop the running build, not wait for it"
    assert _leftovers(docker_engine, owned_before) == []
    assert list_builds() == []
    assert not any((lf_home / "tmp").iterdir())


@pytest.mark.docker
def test_docker_ctrl_c_removes_container_and_publishes_nothing(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    import signal

    recipe = mini_recipe(tmp_path, ["llama-cli", "llama-slow"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    with subprocess.Popen(
        [os.sys.executable, "-m", "invoke", "build", "--recipe", str(recipe)],  # type: ignore[attr-defined]
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stderr is not None
        for line in process.stderr:
            if line.strip().endswith("build"):
                break
        time.sleep(3)
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 130, rest
    assert "interrupted" in rest
    assert _leftovers(docker_engine, owned_before) == []
    assert list_builds() == []


@pytest.mark.docker
def test_concurrent_builds_of_one_key_build_once(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    command = [os.sys.executable, "-m", "invoke", "build", "--recipe", str(recipe), "--json"]  # type: ignore[attr-defined]
    repo = Path(__file__).resolve().parents[1]
    processes = [
        subprocess.Popen(
            command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    import json

    results = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        results.append(json.loads(out)["build"])
    assert results[0]["key"] == results[1]["key"]
    assert sorted(result["cached"] for result in results) == [False, True]
    assert len(list_builds()) == 1


@pytest.mark.docker
def test_two_builds_on_a_fresh_machine_build_the_builder_image_once(
    tmp_path: Path, lf_home: Path, docker_engine: Any, base_image: str, owned_before: set[str]
) -> None:
    """Two builds started at once with no builder image yet: one builds the image while the other waits for it,
    so both get one image id, so one cache key, and the tree is compiled once. (Each used to build the image:
    two ids, two keys, two compiles of the same tree.)"""
    import io
    import json

    fresh = f"llamaforge-test/base:fresh-{os.getpid()}"
    # A base of its own (another image id: a label is enough), so no layer of its builder image is cached and
    # each image build would really run, and get ids of its own.
    dockerfile = f"FROM {base_image}\nLABEL org.llamaforge.test=fresh-{os.getpid()}-{time.time_ns()}\n"
    docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=fresh, rm=True)
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    command = [
        os.sys.executable,
        "-m",
        "invoke",
        "build",
        "--recipe",
        str(recipe),
        "--base-image",
        fresh,
        "--json",
    ]  # type: ignore[attr-defined]
    repo = Path(__file__).resolve().parents[1]
    builder = None
    try:
        processes = [
            subprocess.Popen(
                command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outputs = [process.communicate(timeout=900) for process in processes]
        for process, (_, err) in zip(processes, outputs, strict=True):
            assert process.returncode == 0, err
        results = [json.loads(out)["build"] for out, _ in outputs]
        assert results[0]["key"] == results[1]["key"]
        assert sorted(result["cached"] for result in results) == [False, True]
        built = [err for _, err in outputs if "building builder image" in err]
        assert len(built) == 1, [err[-1500:] for _, err in outputs]
        manifest = json.loads((Path(results[0]["path"]) / "manifest.json").read_text(encoding="utf-8"))
        builder = manifest["image"]["builder_tag"]
        assert manifest["image"]["base_tag"] == fresh
    finally:
        for tag in (builder, fresh):
            if tag is not None:
                with contextlib.suppress(Exception):
                    docker_engine.images.remove(tag)


@pytest.mark.docker
def test_docker_build_of_mini_project_and_cli_views(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    built = invoke_json("build", "--recipe", str(recipe), env=env)["build"]
    binary = Path(built["path"]) / "bin" / "llama-cli"
    assert "commit 0c1e570" in subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    listed = invoke_json("builds.list", env=env)["builds"]
    assert [item["key"] for item in listed] == [built["key"]]
    shown = invoke_json("builds.show", built["key"][:8], env=env)
    assert shown["manifest"]["image"]["builder_tag"].startswith("llamaforge-builder:cpu-")
    assert shown["manifest"]["image"]["base_tag"] == base_image
    assert "cc" in shown["manifest"]["toolchain"]
    again = invoke_json("build", "--recipe", str(recipe), env=env)["build"]
    assert again["cached"] and again["key"] == built["key"]
    repeated = invoke_json("build", "--from-manifest", str(Path(built["path"]) / "manifest.json"), env=env)[
        "build"
    ]
    assert repeated["cached"] and repeated["key"] == built["key"], "a manifest must reproduce its build key"


def test_docker_unreachable_is_a_clear_error(tmp_path: Path, lf_home: Path) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    result = invoke("build", "--recipe", str(recipe), env=env)
    assert result.returncode == 5
    assert "cannot reach the Docker engine" in result.stderr and "invoke doctor" in result.stderr
    assert "Traceback" not in result.stderr
    doctor = invoke("doctor", "--json", env=env)
    assert doctor.returncode == 1 and '"status": "fail"' in doctor.stdout


@pytest.mark.docker
def test_doctor_reports_a_working_engine(docker_engine: object, base_image: str) -> None:
    checks = {check["name"]: check for check in invoke_json("doctor")["checks"]}
    assert checks["docker"]["status"] == "ok"
    assert checks["base image"]["status"] == "ok"


@pytest.mark.docker
def test_ca_bundle_reaches_the_builder_image(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    ca = Path(__file__).parent / "data" / "test-ca.crt"
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    built = invoke_json("build", "--recipe", str(recipe), "--ca-bundle", str(ca), env=env)["build"]
    tag = invoke_json("builds.show", built["key"], env=env)["manifest"]["image"]["builder_tag"]
    bundle = docker_engine.containers.run(  # type: ignore[attr-defined]
        tag, ["cat", "/etc/ssl/certs/ca-certificates.crt"], remove=True, network_mode="none"
    ).decode()
    body = "".join(ca.read_text().split("-----")[2].split())
    assert body in "".join(bundle.split()), "the extra CA must be in the image's trust store"
    assert _leftovers(docker_engine, owned_before) == []
