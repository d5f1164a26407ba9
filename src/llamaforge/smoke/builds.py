"""The build a smoke runs: a build the store holds, a build directory, or the default recipe's CPU build, built
first when the store lacks it (shared by ``smoke`` and ``smoke.cpu_modules``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.build.executors import make_executor
from llamaforge.core.errors import InvalidOption, LlamaforgeError
from llamaforge.core.events import Event
from llamaforge.core.registry import OperationContext

if TYPE_CHECKING:
    from llamaforge.build.executors.base import Executor
    from llamaforge.build.plan import BuildPlan


def resolve_build(
    build: str | None, executor: str, ctx: OperationContext
) -> tuple[str, Path, Mapping[str, Any]]:
    """The key, directory and manifest of ``build`` (a key, a unique key prefix or a build directory); None: the
    default recipe's CPU build, built with ``executor`` if it is missing."""
    from llamaforge.build.store import build_dir, find_build, read_build_manifest

    if build is None:
        from llamaforge.build.execute import run_build
        from llamaforge.build.ops import BuildParams, _plan_from_params

        plan, options = _plan_from_params(BuildParams())
        runner = default_build_executor(executor)
        if not is_built(plan, runner):
            ctx.reporter(Event("warning", cold_build_note(plan.recipe.name, plan.cpu), stage="build"))
        result = run_build(plan, options, executor=runner, reporter=ctx.reporter, cancel=ctx.cancel)
        return result.key, result.path, result.manifest
    path = check_build_argument(build)
    if path.is_dir():
        if (path / "manifest.json").is_file():
            manifest = read_build_manifest(path)
            return str(manifest["key"]), path, manifest
        return "external", path, {}  # e.g. a plain cmake build's bin/ directory, for comparisons
    manifest = find_build(build)
    return str(manifest["key"]), build_dir(manifest["key"]), manifest


def default_build_executor(executor: str) -> Executor:
    """The executor that builds the default build when no --build is given; smoke passes it no settings, so one
    that needs some (ssh: a build host) is refused with the way round it."""
    try:
        return make_executor(executor)
    except InvalidOption as error:
        raise InvalidOption(
            f"--executor {executor}: {error} (smoke takes no executor settings)",
            hint=f"build first (`invoke build --executor {executor} ...`), then smoke it with --build KEY "
            "(`invoke builds.list` shows the keys)",
        ) from None


def check_build_argument(build: str) -> Path:
    """``build`` as a path: a build directory (a llamaforge build or llama.cpp binaries), or a name for the store
    to look up; refused when it is a file, a directory of neither, or written as a path that names nothing
    (``build.store.build_path``). Checked before the model, which may take minutes to write or download."""
    from llamaforge.build.store import build_path, find_build

    path = build_path(build, "--build")
    if path is None:
        find_build(build)  # a build key or a prefix of one: the store says now whether it holds it
        return Path(build)
    hint = "give a build's directory or its key (`invoke builds.list` shows them)"
    if not path.is_dir():
        raise InvalidOption(f"--build {build} is a file, not a build directory", hint=hint)
    if not any((path / name).is_file() for name in ("manifest.json", "llama-server", "bin/llama-server")):
        raise InvalidOption(
            f"--build {build}: the directory holds neither a llamaforge build (manifest.json) nor llama.cpp "
            "binaries (llama-server, bin/llama-server)",
            hint=hint,
        )
    return path


def is_built(plan: BuildPlan, executor: Executor) -> bool:
    """True when the store holds the build of ``plan`` (its environment exists and its key is published)."""
    from llamaforge.build.store import load_manifest

    try:
        environment_id = executor.peek_environment_id(plan)
        return environment_id is not None and load_manifest(plan.cache_key(environment_id)) is not None
    except LlamaforgeError:  # no engine, a damaged entry: the build itself says so
        return False


def cold_build_note(recipe: str, cpu: str) -> str:
    """What a smoke without --build is about to start when the store lacks the default build."""
    # The figures are docs/benchmarks.md's: the cold build of the default recipe (all variants) and of one CPU level.
    cost = (
        "every CPU variant, 474 compile steps: 61 minutes on a loaded 2-core machine, minutes with a warm ccache"
        if cpu == "variants"
        else f"one CPU level, {cpu}: about 7 minutes on 2 cores"
    )
    return (
        f"no --build given and the store has no {recipe!r} build: building it now, cold ({cost}); "
        "Ctrl-C and pass --build KEY to smoke a build you have (`invoke builds.list`)"
    )
