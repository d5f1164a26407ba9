"""The executor seam: the registry makes executors from a name and settings, and a build takes any Executor
instance. A fake executor (the only fake here) is injected into the real build path: real plan, real source
fetch and patch series, real store publish and manifest, and the reproducibility check on top of it."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import mini_recipe
from llamaforge.build.execute import run_build
from llamaforge.build.executors import EXECUTORS, make_executor
from llamaforge.build.executors.base import Executor, RunRequest
from llamaforge.build.executors.docker import DockerExecutor
from llamaforge.build.executors.local import LocalExecutor
from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.build.reproducible import check_reproducible
from llamaforge.build.store import list_builds, load_manifest
from llamaforge.core.errors import DockerUnavailable, InvalidOption
from llamaforge.core.events import Event, Reporter

pytestmark = pytest.mark.quick

BANNER = "patched by the seam test"
PATCH = f"""--- a/main.c
+++ b/main.c
@@ -1,6 +1,7 @@
 #include <stdio.h>

 int main(void) {{
+    puts("{BANNER}");
     printf("version: mini (build %d, commit %s) file %s\\n", BUILD_NUMBER, BUILD_COMMIT, __FILE__);
     return 0;
 }}
"""


@dataclass
class RecordingExecutor:
    """Records every request and writes the artifacts the plan expects, made from the patched main.c."""

    salt: bool = False
    name: str = "fake"
    prepared: int = 0
    requests: list[RunRequest] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        return "fake:env" if self.prepared else None

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        self.prepared += 1
        return "fake:env"

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        return {"executor": self.name, "environment_id": environment_id}

    def location(self) -> str:
        return "fake engine"

    def run(self, request: RunRequest) -> None:
        self.requests.append(request)
        source = (request.source_tree / "main.c").read_text(encoding="utf-8")
        self.sources.append(source)
        request.log(f"[1/1] {' '.join(request.plan.script.command('/fake/' + request.plan.script.name))}")
        for relative in request.plan.artifacts:
            path = request.out_dir / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            salt = f"{len(self.requests)}" if self.salt else ""
            path.write_bytes(f"{relative}\n{source}{salt}".encode())
        (request.out_dir / "toolchain.json").write_text('{"cc": "fake"}', encoding="utf-8")


def _series(tmp_path: Path) -> Path:
    series = tmp_path / "series"
    series.mkdir()
    (series / "0001-banner.patch").write_text(PATCH, encoding="utf-8")
    (series / "series").write_text("0001-banner.patch\n", encoding="utf-8")
    return series


def _plan(tmp_path: Path, targets: list[str]) -> tuple[BuildPlan, BuildOptions]:
    options = BuildOptions(patches=str(_series(tmp_path)))
    return plan_build(load_recipe(str(mini_recipe(tmp_path, targets))), options), options


def test_a_fake_executor_runs_inside_the_real_build_path(tmp_path: Path, lf_home: Path) -> None:
    plan, options = _plan(tmp_path, ["llama-cli", "llama-bench"])
    fake = RecordingExecutor()
    events: list[Event] = []
    executor: Executor = fake
    result = run_build(plan, options, executor=executor, jobs=3, reporter=events.append)

    (request,) = fake.requests
    assert request.plan is plan and request.jobs == 3 and request.use_ccache
    assert BANNER in fake.sources[0], "the executor must see the source with the patch series applied"
    assert result.key == plan.cache_key("fake:env") and not result.cached
    manifest = load_manifest(result.key)
    assert manifest is not None and manifest == result.manifest
    assert manifest["image"] == {"executor": "fake", "environment_id": "fake:env"}
    assert manifest["toolchain"] == {"cc": "fake"}
    assert manifest["patches"] == [
        {"name": "0001-banner.patch", "sha256": hashlib.sha256(PATCH.encode()).hexdigest()}
    ]
    assert set(manifest["artifacts"]) == {"bin/llama-cli", "bin/llama-bench"}
    for relative, info in manifest["artifacts"].items():
        data = (result.path / relative).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"] and len(data) == info["size"]
    assert result.artifact("llama-cli") == result.path / "bin" / "llama-cli"
    assert (result.path / "build.sh").read_text(encoding="utf-8") == plan.script.text
    assert plan.environment.image is not None
    assert (result.path / "Dockerfile").read_text(encoding="utf-8") == plan.environment.image.dockerfile
    assert "[1/1] bash /fake/build.sh" in (result.path / "build.log").read_text(encoding="utf-8")
    assert any(event.kind == "progress" and event.total == 1 for event in events)
    assert [item["key"] for item in list_builds()] == [result.key]

    again = run_build(plan, options, executor=executor)
    assert again.cached and again.key == result.key
    assert len(fake.requests) == 1, "a cache hit must not run the executor"
    assert not any((lf_home / "tmp").iterdir()), "staging directories must not be left behind"


def test_reproducibility_check_reuses_the_build_pipeline(tmp_path: Path, lf_home: Path) -> None:
    plan, options = _plan(tmp_path, ["llama-cli"])
    fake = RecordingExecutor()
    result = run_build(plan, options, executor=fake)
    report = check_reproducible(result, plan, executor=fake)
    assert report.reproducible and report.identical == ("bin/llama-cli",)
    first, rebuild = fake.requests
    assert first.use_ccache and not rebuild.use_ccache, "the rebuild runs with ccache off"
    assert rebuild.source_tree != first.source_tree, "the rebuild gets a fresh workspace"
    assert BANNER in fake.sources[1], "the rebuild applies the patch series too"

    salted = RecordingExecutor(salt=True)
    result = run_build(plan, options, executor=salted, force=True)
    report = check_reproducible(result, plan, executor=salted)
    (diff,) = report.different
    assert diff.path == "bin/llama-cli" and diff.kept and Path(diff.kept).is_file()


def test_registry_names_every_executor_and_refuses_unknown_ones() -> None:
    assert sorted(EXECUTORS) == ["docker", "local", "ssh"]
    assert isinstance(make_executor("local"), LocalExecutor)
    with pytest.raises(InvalidOption) as info:
        make_executor("kubernetes")
    assert "'kubernetes'" in info.value.message
    assert "--executor docker" in (info.value.hint or "") and "--executor local" in (info.value.hint or "")
    with pytest.raises(InvalidOption):
        make_executor("local", {"url": "tcp://x:2376"})


def test_docker_settings_reach_the_engine_connection(tmp_path: Path) -> None:
    executor = make_executor("docker", {"url": "ssh://builder@buildhost", "tls_verify": "0"})
    assert isinstance(executor, DockerExecutor)
    assert executor.engine.url == "ssh://builder@buildhost"
    assert executor.engine.environment()["DOCKER_HOST"] == "ssh://builder@buildhost"
    assert "DOCKER_TLS_VERIFY" not in executor.engine.environment()
    tls = make_executor(
        "docker", {"url": "tcp://buildhost:2376", "tls_verify": "1", "cert_path": str(tmp_path)}
    )
    assert isinstance(tls, DockerExecutor)
    assert tls.engine.environment() | {"DOCKER_HOST": "tcp://buildhost:2376"} == tls.engine.environment()
    assert tls.engine.environment()["DOCKER_TLS_VERIFY"] == "1"
    assert tls.engine.environment()["DOCKER_CERT_PATH"] == str(tmp_path)
    with pytest.raises(InvalidOption) as info:
        make_executor("docker", {"host": "tcp://x:2376"})
    assert "host" in info.value.message and "url" in (info.value.hint or "")
    with pytest.raises(InvalidOption):
        make_executor("docker", {"tls_verify": "maybe"})


def test_an_unreachable_engine_url_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/no-docker.sock"
    executor = make_executor("docker", {"url": url})
    plan = plan_build(load_recipe(str(mini_recipe(tmp_path, ["llama-cli"]))), BuildOptions())
    with pytest.raises(DockerUnavailable) as info:
        executor.peek_environment_id(plan)
    assert url in info.value.message and "cannot reach the Docker engine" in info.value.message


def test_ccache_runs_in_depend_mode_and_still_sees_a_changed_header(tmp_path: Path) -> None:
    """Every executor passes `RunRequest.script_environment()` to the build script. With it, a real ccache
    caches without a second preprocessor run (depend mode: the `-MD` list is the dependency record), serves an
    unchanged unit from the cache, and recompiles when a header the unit includes changes; the reproducibility
    rebuild's environment turns ccache off."""
    import shutil
    import subprocess

    from conftest import require

    require(bool(shutil.which("ccache") and shutil.which("cc")), "ccache and cc are needed")
    plan, _options = _plan(tmp_path, ["llama-cli"])
    request = RunRequest(plan, tmp_path, tmp_path / "out", None, None, jobs=2)  # type: ignore[arg-type]
    assert request.script_environment() == {"LLAMAFORGE_JOBS": "2", "CCACHE_DEPEND": "1"}
    rebuild = RunRequest(plan, tmp_path, tmp_path / "out", None, None, use_ccache=False)  # type: ignore[arg-type]
    assert rebuild.script_environment() == {"CCACHE_DISABLE": "1"}

    unit = tmp_path / "unit"
    unit.mkdir()
    (unit / "a.c").write_text('#include "value.h"\nint value(void) { return VALUE; }\n', encoding="utf-8")
    env = {**os.environ, **request.script_environment(), "CCACHE_DIR": str(tmp_path / "ccache")}
    env.pop("CCACHE_DISABLE", None)

    def compile_with(value: int) -> str:
        (unit / "value.h").write_text(f"#define VALUE {value}\n", encoding="utf-8")
        command = ["ccache", "cc", "-O1", "-c", "a.c", "-MD", "-MF", "a.d", "-o", "a.o"]
        subprocess.run(command, cwd=unit, env=env, check=True)
        return subprocess.run(
            ["objdump", "-d", "a.o"], cwd=unit, capture_output=True, text=True, check=True
        ).stdout

    def stats() -> dict[str, int]:
        shown = subprocess.run(
            ["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True
        )
        return {key: int(count) for key, count in (line.split("\t") for line in shown.stdout.splitlines())}

    first = compile_with(41)
    assert stats()["cache_miss"] == 1 and stats()["preprocessed_cache_miss"] == 0, "depend mode: no cpp run"
    assert compile_with(41) == first and stats()["direct_cache_hit"] == 1
    changed = compile_with(42)
    assert "$0x2a" in changed and "$0x29" in first, "a changed header must recompile, not hit"
    assert stats()["cache_miss"] == 2
