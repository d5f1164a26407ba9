"""Execute a BuildPlan: reuse the cached build, or fetch, patch, build, verify and publish it."""

from __future__ import annotations

import datetime
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from llamaforge.backends import get_backend
from llamaforge.build.ccache import CCACHE_RECORD
from llamaforge.build.download import sha256_file
from llamaforge.build.executors.base import Executor, LogSink, RunRequest
from llamaforge.build.patches import apply_series, series_dir
from llamaforge.build.plan import BuildOptions, BuildPlan
from llamaforge.build.recipes import BuildRecipe, check_recipe_paths
from llamaforge.build.source import fetch_source, make_workspace
from llamaforge.build.store import build_dir, build_lock, load_manifest, publish, staging_dir
from llamaforge.core.errors import BuildFailed, CacheError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import home
from llamaforge.core.version import __version__


@dataclass(frozen=True)
class BuildResult:
    """A published build."""

    key: str
    path: Path
    manifest: dict[str, Any]
    cached: bool
    seconds: float

    def artifact(self, name: str) -> Path:
        """Path of an artifact by its path in the build (``bin/llama-cli``) or its target (``llama-cli``, which
        also finds ``bin/llama-cli.exe``)."""
        if "/" in name:
            return self.path / name
        for relative in self.manifest.get("artifacts", {}):
            if PurePosixPath(relative).stem == name:
                return self.path / str(relative)
        raise CacheError(
            f"build {self.key} has no artifact {name!r}", hint="`invoke builds.show KEY` lists them"
        )

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
        "cpu": options.cpu,
        "platform": options.platform,
        "cuda_toolkit": options.cuda_toolkit,
        "toolchain": options.toolchain,
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
        cpu=data.get("cpu"),
        platform=data.get("platform"),
        cuda_toolkit=data.get("cuda_toolkit"),
        toolchain=data.get("toolchain"),
    )


def recipe_from_manifest(
    manifest: dict[str, Any], origin: str = "manifest"
) -> tuple[BuildRecipe, BuildOptions]:
    """The recipe and options recorded in a manifest, to repeat that build; the paths they name (the recipe's,
    ``options.patches``, ``options.ca_bundle``) pass the front's path policy, ``origin`` naming the file."""
    if not isinstance(manifest, dict):
        raise ValueError(f"it holds {json.dumps(manifest)[:40]}, not an object")
    for table in ("recipe", "options"):  # what a build writes in every manifest: the rest is its record
        if table not in manifest:
            raise ValueError(f"it has no {table!r} table, which every build records in its manifest")
        if not isinstance(manifest[table], dict):
            raise ValueError(f"its {table!r} is {json.dumps(manifest[table])[:40]}, not a table")
    recipe, options = BuildRecipe.model_validate(manifest["recipe"]), options_from_json(manifest["options"])
    check_recipe_paths(recipe, f"{origin}: recipe")
    if options.patches is not None:
        check_file_path(f"{origin}: options.patches", series_dir(options.patches).absolute())
    if options.ca_bundle is not None:
        check_file_path(f"{origin}: options.ca_bundle", options.ca_bundle.expanduser().absolute())
    return recipe, options


# The file the build script writes beside the artifacts for the manifest (a backend may add its own records).
TOOLCHAIN_RECORD = "toolchain.json"


def _collect_artifacts(plan: BuildPlan, out: Path) -> dict[str, dict[str, Any]]:
    """Every file the build left in ``out`` (the targets' binaries, and the shared libraries and backend modules
    beside them) with its sha256 and size; each target's binary must be among them. Symlinks are refused: a
    build script copies each library once, under the name the loader asks for."""
    for relative in plan.artifacts:
        if not (out / relative).is_file():
            raise BuildFailed(
                f"the build finished but {relative} is missing",
                command=[plan.script.name],
                returncode=0,
                tail=[],
                hint="check that every recipe target is an executable that lands in build/bin",
            )
    records = (TOOLCHAIN_RECORD, CCACHE_RECORD, *get_backend(plan.backend).records())
    artifacts: dict[str, dict[str, Any]] = {}
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out).as_posix()
        if path.is_symlink():
            raise BuildFailed(
                f"the build left a symlink, {relative}, among its artifacts",
                command=[plan.script.name],
                returncode=0,
                tail=[],
                hint="the build script must copy the file the link points to under the link's name",
            )
        if path.is_file() and relative not in records:
            artifacts[relative] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return artifacts


def run_build(
    plan: BuildPlan,
    options: BuildOptions,
    *,
    executor: Executor,
    force: bool = False,
    jobs: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    builder: dict[str, Any] | None = None,
) -> BuildResult:
    """Build ``plan`` with ``executor`` (or return the cached build with the same key without starting a build).
    ``builder`` (a fleet builder's name and address) goes into the manifest as its ``builder``."""
    cancel = cancel or CancelToken()
    started = time.monotonic()
    environment_id = executor.prepare_environment(plan, reporter)
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
        return _build_locked(
            plan, options, executor, environment_id, key, jobs, reporter, cancel, started, builder
        )


def build_into(
    plan: BuildPlan,
    executor: Executor,
    out: Path,
    log_path: Path,
    *,
    use_ccache: bool = True,
    jobs: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken,
) -> None:
    """Fetch the plan's source, apply its patches in a fresh workspace and run its script with ``executor``:
    the artifacts land in ``out``, every output line in ``log_path``. The environment must be prepared."""
    reporter(Event("stage", "fetching source", stage="source"))
    tree = fetch_source(plan.recipe.source, reporter=reporter, cancel=cancel)
    with make_workspace(tree) as workspace:
        if plan.patches:
            reporter(Event("stage", f"applying {len(plan.patches)} patch(es)", stage="patch"))
        apply_series(list(plan.patches), workspace)
        cancel.raise_if_cancelled()
        sink = LogSink(log_path, reporter)
        try:
            executor.run(RunRequest(plan, workspace, out, sink, cancel, use_ccache=use_ccache, jobs=jobs))
        finally:
            sink.close()


def _build_locked(
    plan: BuildPlan,
    options: BuildOptions,
    executor: Executor,
    environment_id: str,
    key: str,
    jobs: int | None,
    reporter: Reporter,
    cancel: CancelToken,
    started: float,
    builder: dict[str, Any] | None = None,
) -> BuildResult:
    started_at = _now()
    log_path = home() / "logs" / f"{key}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}.log"
    staging = staging_dir(key)
    try:
        out = staging / "out"
        out.mkdir()
        build_into(plan, executor, out, log_path, jobs=jobs, reporter=reporter, cancel=cancel)
        artifacts = _collect_artifacts(plan, out)
        checked = get_backend(plan.backend).after_build(out, plan.cuda_architectures, str(log_path))
        for relative in artifacts:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            (out / relative).replace(target)
        toolchain_file = out / TOOLCHAIN_RECORD
        toolchain = json.loads(toolchain_file.read_text(encoding="utf-8")) if toolchain_file.is_file() else {}
        ccache_file = out / CCACHE_RECORD  # what ccache did (the docker executor's; no input of the key)
        ccache = json.loads(ccache_file.read_text(encoding="utf-8")) if ccache_file.is_file() else None
        shutil.rmtree(out)
        if plan.environment.image is not None:
            (staging / "Dockerfile").write_text(plan.environment.image.dockerfile, encoding="utf-8")
        (staging / plan.script.name).write_text(plan.script.text, encoding="utf-8")
        shutil.copyfile(log_path, staging / "build.log")
        manifest = {
            "schema": 1,
            "key": key,
            "plan_digest": plan.plan_digest,
            "recipe": plan.recipe.model_dump(mode="json"),
            "options": _options_json(options),
            "backend": plan.backend,
            **({"platform_toolchain": plan.toolchain} if plan.toolchain else {}),
            "cuda_architectures": list(plan.cuda_architectures),
            "cpu": plan.cpu,
            "source": plan.recipe.source.model_dump(mode="json"),
            "patches": [{"name": p.name, "sha256": p.sha256} for p in plan.patches],
            "cmake_args": list(plan.cmake_args),
            "targets": list(plan.targets),
            "image": executor.describe_environment(plan, environment_id),
            **({"builder": builder} if builder else {}),
            "toolchain": toolchain,
            **({"ccache": ccache} if ccache is not None else {}),
            "artifacts": artifacts,
            **checked,
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
