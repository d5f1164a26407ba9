"""Execute a BuildPlan: reuse the cached build, or fetch, patch, build, verify and publish it."""

from __future__ import annotations

import datetime
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge import __version__
from llamaforge.build.patches import apply_series
from llamaforge.build.plan import BuildOptions, BuildPlan
from llamaforge.build.recipes import BuildRecipe
from llamaforge.build.source import fetch_source, make_workspace, sha256_file
from llamaforge.build.store import build_dir, build_lock, load_manifest, publish, staging_dir
from llamaforge.core.errors import BuildFailed, CacheError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import home
from llamaforge.runners import Executor, LogSink, RunRequest, get_executor


@dataclass(frozen=True)
class BuildResult:
    """A published build."""

    key: str
    path: Path
    manifest: dict[str, Any]
    cached: bool
    seconds: float

    def artifact(self, name: str) -> Path:
        """Path of an artifact, e.g. ``artifact("llama-cli")``."""
        relative = name if "/" in name else f"bin/{name}"
        return self.path / relative

    def to_json(self) -> dict[str, Any]:
        """Summary for ``--json`` and tool results."""
        return {
            "key": self.key,
            "path": str(self.path),
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
            "artifacts": self.manifest.get("artifacts", {}),
        }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _options_json(options: BuildOptions) -> dict[str, Any]:
    return {
        "backend": options.backend,
        "cuda_architectures": list(options.cuda_architectures),
        "base_image": options.base_image,
        "patches": options.patches,
        "no_patches": options.no_patches,
        "ca_bundle": str(options.ca_bundle) if options.ca_bundle else None,
        "cmake": [list(pair) for pair in options.cmake],
    }


def options_from_json(data: dict[str, Any]) -> BuildOptions:
    """Inverse of the ``options`` block of a manifest."""
    return BuildOptions(
        backend=data.get("backend"),
        cuda_architectures=tuple(data.get("cuda_architectures") or ()),
        base_image=data.get("base_image"),
        patches=data.get("patches"),
        no_patches=bool(data.get("no_patches")),
        ca_bundle=Path(data["ca_bundle"]) if data.get("ca_bundle") else None,
        cmake=tuple((str(k), str(v)) for k, v in data.get("cmake") or ()),
    )


def recipe_from_manifest(manifest: dict[str, Any]) -> tuple[BuildRecipe, BuildOptions]:
    """The recipe and options recorded in a manifest, to repeat that build."""
    return BuildRecipe.model_validate(manifest["recipe"]), options_from_json(manifest["options"])


def _image_info(executor: Executor, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
    info: dict[str, Any] = {"executor": executor.name, "environment_id": environment_id}
    if executor.name == "docker":
        from llamaforge.runners.engine import docker_client

        client = docker_client()
        base = client.images.get(plan.base_image.tag)
        info.update(
            base_tag=plan.base_image.tag,
            base_id=base.id,
            base_digest=plan.base_image.digest or next(iter(base.attrs.get("RepoDigests") or []), None),
            builder_tag=plan.builder_tag,
            builder_id=environment_id,
        )
    return info


def _collect_artifacts(plan: BuildPlan, out: Path) -> dict[str, dict[str, Any]]:
    artifacts: dict[str, dict[str, Any]] = {}
    for relative in plan.artifacts:
        path = out / relative
        if not path.is_file():
            raise BuildFailed(
                f"the build finished but {relative} is missing",
                command=["build.sh"], returncode=0, tail=[],
                hint="check that every recipe target is an executable that lands in build/bin",
            )  # fmt: skip
        artifacts[relative] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return artifacts


def run_build(
    plan: BuildPlan,
    options: BuildOptions,
    *,
    executor: str = "docker",
    force: bool = False,
    jobs: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> BuildResult:
    """Build ``plan`` (or return the cached build with the same key without starting a container)."""
    cancel = cancel or CancelToken()
    started = time.monotonic()
    runner = get_executor(executor)
    environment_id = runner.environment_id(plan, reporter)
    key = plan.cache_key(environment_id)
    if not force and (manifest := load_manifest(key)) is not None:
        reporter(Event("info", f"cache hit: build {key}", stage="cache"))
        return BuildResult(key, build_dir(key), manifest, cached=True, seconds=time.monotonic() - started)
    lock = build_lock(key)
    if lock.is_locked:
        reporter(Event("info", f"build {key} is in progress elsewhere; waiting for it", stage="cache"))
    with lock:
        if not force and (manifest := load_manifest(key)) is not None:
            reporter(Event("info", f"build {key} was finished by another process", stage="cache"))
            return BuildResult(key, build_dir(key), manifest, cached=True, seconds=time.monotonic() - started)
        return _build_locked(plan, options, runner, environment_id, key, jobs, reporter, cancel, started)


def _build_locked(
    plan: BuildPlan,
    options: BuildOptions,
    runner: Executor,
    environment_id: str,
    key: str,
    jobs: int | None,
    reporter: Reporter,
    cancel: CancelToken,
    started: float,
) -> BuildResult:
    started_at = _now()
    reporter(Event("stage", "fetching source", stage="source"))
    tree = fetch_source(plan.recipe.source, reporter=reporter, cancel=cancel)
    log_path = home() / "logs" / f"{key}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}.log"
    staging = staging_dir(key)
    try:
        with make_workspace(tree) as workspace:
            if plan.patches:
                reporter(Event("stage", f"applying {len(plan.patches)} patch(es)", stage="patch"))
            apply_series(list(plan.patches), workspace)
            cancel.raise_if_cancelled()
            out = staging / "out"
            out.mkdir()
            sink = LogSink(log_path, reporter)
            try:
                runner.run(RunRequest(plan, workspace, out, sink, cancel, use_ccache=True, jobs=jobs))
            finally:
                sink.close()
        artifacts = _collect_artifacts(plan, out)
        for relative in plan.artifacts:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            (out / relative).replace(target)
        toolchain_file = out / "toolchain.json"
        toolchain = json.loads(toolchain_file.read_text(encoding="utf-8")) if toolchain_file.is_file() else {}
        shutil.rmtree(out)
        (staging / "Dockerfile").write_text(plan.dockerfile, encoding="utf-8")
        (staging / "build.sh").write_text(plan.build_script, encoding="utf-8")
        shutil.copyfile(log_path, staging / "build.log")
        manifest = {
            "schema": 1,
            "key": key,
            "plan_digest": plan.plan_digest,
            "recipe": plan.recipe.model_dump(mode="json"),
            "options": _options_json(options),
            "backend": plan.backend,
            "cuda_architectures": list(plan.cuda_architectures),
            "source": plan.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in plan.patches],
            "cmake_args": list(plan.cmake_args),
            "targets": list(plan.targets),
            "image": _image_info(runner, plan, environment_id),
            "toolchain": toolchain,
            "artifacts": artifacts,
            "source_date_epoch": plan.source_date_epoch,
            "started_at": started_at,
            "finished_at": _now(),
            "duration_s": round(time.monotonic() - started, 1),
            "llamaforge_version": __version__,
        }
        path = publish(staging, key, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    reporter(Event("info", f"published build {key} at {path}", stage="publish"))
    return BuildResult(key, path, manifest, cached=False, seconds=time.monotonic() - started)


def require_build(key: str) -> BuildResult:
    """The published build ``key``, or a CacheError."""
    manifest = load_manifest(key)
    if manifest is None:
        raise CacheError(f"no published build {key}", hint="`invoke builds.list` shows the builds")
    return BuildResult(key, build_dir(key), manifest, cached=True, seconds=0.0)
