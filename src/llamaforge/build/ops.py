"""The ``build`` operation (registered with the operation registry on import), with its parameter and result
models; the operations around it (``builds.*``, ``doctor``, ``images.bootstrap``, ``recipes.*``) are in
``build.ops_store``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from llamaforge.build.executors import ExecutorName, make_executor
from llamaforge.build.matrix import MatrixRow
from llamaforge.build.recipes import Backend, CudaToolkitKind, Platform, WindowsToolchain
from llamaforge.core.errors import Cancelled, InvalidOption, LlamaforgeError, NotReproducible, OperationFailed
from llamaforge.core.registry import (
    Int32,
    OperationContext,
    Params,
    Result,
    absent,
    empty_list,
    operation,
    path_field,
)
from llamaforge.core.validation import ImageReference, describe_errors

if TYPE_CHECKING:
    from llamaforge.build.executors.base import Executor
    from llamaforge.build.farm.builders import Builder
    from llamaforge.build.plan import BuildOptions, BuildPlan

# --- build -------------------------------------------------------------------------------------------------


class BuildParams(Params):
    """Parameters of ``build``."""

    recipe: str = path_field("default", description="Build recipe name (recipes/builds/NAME.toml) or path")
    arch: str | None = Field(
        None, description="CUDA archs, e.g. 86 (RTX 30xx), 89 (RTX 40xx), 86,89; implies CUDA"
    )
    backend: Backend | None = Field(
        None, description="cpu or cuda (default: the recipe's, or cuda with --arch)"
    )
    base_image: ImageReference | None = Field(
        None, description="Base image for the builder (overrides the recipe)"
    )
    cuda_toolkit: CudaToolkitKind | None = Field(
        None,
        description="CUDA toolkit: wheels (NVIDIA's PyPI wheels on the local base, no registry) or image "
        "(the recipe's nvidia/cuda image); default: the recipe's [cuda] toolkit",
    )
    patches: str | None = path_field(None, description="Patch series directory (default: the recipe's)")
    no_patches: bool = Field(False, description="Build stock llama.cpp without the patch series")
    ca_bundle: str | None = path_field(
        None,
        description="CA bundle for the builder image behind a TLS-intercepting proxy (default: the one PIP_CERT, "
        "SSL_CERT_FILE, REQUESTS_CA_BUNDLE or pip's global.cert names, for images that download over TLS)",
    )
    no_ca_bundle: bool = Field(
        False, description="Install no CA bundle, not even the one the host's settings name"
    )
    cmake: list[str] = Field(
        default_factory=empty_list, description="Extra CMake option KEY=VALUE (repeatable)"
    )
    cpu: str | None = Field(
        None,
        description="CPU level instead of the recipe's: variants, native, baseline, x86-64-v2/v3/v4, "
        "or an arm64 architecture such as armv8.2-a+dotprod",
    )
    platform: Platform | None = Field(
        None,
        description="linux, windows (mingw in Docker, or MSVC on a Windows host) or macos (Metal, on a Mac); "
        "default: the recipe's",
    )
    toolchain: WindowsToolchain | None = Field(
        None,
        description="Windows toolchain: mingw (cross build in Docker) or msvc (a Windows build host); "
        "default: mingw with --executor docker, msvc with ssh or local",
    )
    executor: ExecutorName = Field(
        "docker", description="Where to build: docker, local (this host, no Docker) or ssh (a build host)"
    )
    build_host: str | None = Field(None, description="Build host for --executor ssh: user@host:port")
    ssh_key: str | None = path_field(
        None, description="Private key for the build host (default: the SSH agent)"
    )
    known_hosts: str | None = path_field(
        None,
        description="known_hosts file for the build host (read with ~/.ssh/known_hosts; new keys go here)",
    )
    accept_new_host_keys: bool = Field(
        False,
        description="Record the build host's key if it was never seen (a changed key is always refused)",
    )
    ccache_remote: str | None = Field(
        None,
        description="Remote compiler cache shared by builders (ccache remote_storage): redis://HOST:PORT or "
        "http(s)://HOST/PATH, no password in it; the build container gets the engine host's network to reach it",
    )
    ccache_password_file: str | None = path_field(
        None,
        description="File holding the remote compiler cache's password (never in argv, logs or manifests)",
    )
    jobs: Int32 | None = Field(None, ge=1, description="Parallel compile jobs (default: all cores)")
    force: bool = Field(False, description="Rebuild even when a cached build with the same key exists")
    dry_run: bool = Field(False, description="Only print the plan: rendered files, cmake args, cache key")
    check_reproducible: bool = Field(
        False, description="Rebuild in a fresh container with ccache off and compare every artifact's sha256"
    )
    on_builder: str | None = Field(
        None,
        description="With --check-reproducible: rebuild on this builder of the --builders fleet instead of the "
        "engine that built, and compare every artifact",
    )
    matrix: str | None = path_field(
        None,
        description="Run every build of a matrix (recipes/matrices/NAME.toml or a path), one after another",
    )
    builders: str | None = path_field(
        None,
        description="With --matrix: fan the builds out in parallel over this builder fleet "
        "(recipes/builders/NAME.toml or a path; NAME:b1,b2 picks some of its builders); with --on-builder: the "
        "fleet of that builder",
    )
    from_manifest: str | None = path_field(
        None, description="Repeat the build recorded in this manifest.json"
    )


def _plan_from_params(params: BuildParams) -> tuple[BuildPlan, BuildOptions]:
    from llamaforge.backends.cuda.arch import parse_cuda_archs
    from llamaforge.build.ca_bundle import choose_bundle
    from llamaforge.build.execute import recipe_from_manifest
    from llamaforge.build.plan import BuildOptions, plan_build
    from llamaforge.build.recipes import load_recipe

    if params.from_manifest:
        import json

        path = Path(params.from_manifest)
        if not path.is_file():
            what = "is a directory, not a manifest file" if path.is_dir() else "does not exist"
            raise InvalidOption(
                f"manifest {path} {what}",
                hint="give a build's manifest.json (`invoke builds.show KEY` prints its path)",
            )
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidOption(
                f"--from-manifest {path} is not JSON: {error}",
                hint="a build's manifest.json (`invoke builds.show KEY` prints its path)",
            ) from None
        except OSError as error:
            raise InvalidOption(
                f"cannot read --from-manifest {path}: {error.strerror or error}",
                hint="a build's manifest.json (`invoke builds.show KEY` prints its path)",
            ) from None
        try:
            recipe, options = recipe_from_manifest(manifest, origin=f"manifest {path}")
        except ValidationError as error:
            raise InvalidOption(
                f"--from-manifest {path}: its recipe is not valid: {describe_errors(error)}",
                hint="a build's manifest.json (`invoke builds.show KEY` prints its path), unedited",
            ) from None
        except ValueError as error:
            raise InvalidOption(
                f"--from-manifest {path} is not a build manifest: {error}",
                hint="a build's manifest.json (`invoke builds.show KEY` prints its path)",
            ) from None
        except (KeyError, TypeError, AttributeError) as error:
            raise InvalidOption(
                f"--from-manifest {path} is not a build manifest ({type(error).__name__}: {error})",
                hint="a build's manifest.json (`invoke builds.show KEY` prints its path)",
            ) from None
        return plan_build(recipe, options), options
    if params.no_patches and params.patches:
        # --no-patches won, and the series named was left out in silence
        raise InvalidOption(
            f"--no-patches and --patches {params.patches} contradict each other",
            hint="drop --no-patches to build with that series, or --patches to build stock llama.cpp",
        )
    cmake: list[tuple[str, str]] = []
    for item in params.cmake:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOption(f"--cmake {item!r} is not KEY=VALUE", hint="e.g. --cmake GGML_VULKAN=OFF")
        cmake.append((key, value))
    ca_bundle, ca_from_host = choose_bundle(params.ca_bundle, none=params.no_ca_bundle)
    recipe = load_recipe(params.recipe)
    options = BuildOptions(
        backend=params.backend,
        # An empty --arch is refused, not read as "no arch" (which would plan a CPU build in silence).
        cuda_architectures=tuple(parse_cuda_archs(params.arch)) if params.arch is not None else (),
        base_image=params.base_image,
        patches=params.patches,
        no_patches=params.no_patches,
        ca_bundle=ca_bundle,
        ca_bundle_from_host=ca_from_host,
        cmake=tuple(cmake),
        cpu=params.cpu,
        platform=params.platform,
        cuda_toolkit=params.cuda_toolkit,
        toolchain=_toolchain(params, params.platform or recipe.platform),
    )
    plan = plan_build(recipe, options)
    image = plan.environment.image
    if options.ca_bundle and not (image and image.ca_bundle):
        # A host's bundle this build's image does not install: not recorded, so a repeat from the manifest
        # plans the same image.
        options = replace(options, ca_bundle=None, ca_bundle_from_host=None)
    return plan, options


def _toolchain(params: BuildParams, platform: str) -> WindowsToolchain | None:
    """The Windows toolchain: --toolchain, else the executor's (mingw in Docker, MSVC on a host), checked
    against the executor; other platforms have one toolchain and refuse the option."""
    if platform != "windows":
        if params.toolchain:
            raise InvalidOption(
                f"--toolchain is for Windows builds, not --platform {platform}",
                hint="add --platform windows, or drop --toolchain",
            )
        return None
    from llamaforge.platforms.windows import check_toolchain, default_toolchain

    toolchain = params.toolchain or default_toolchain(params.executor)
    if not params.dry_run:  # a dry run shows the plan of either toolchain without its build host
        check_toolchain(toolchain, params.executor)
    return toolchain


def _executor_settings(params: BuildParams) -> dict[str, str]:
    """The executor's settings: the build host options (--executor ssh), the remote compiler cache
    (--executor docker)."""
    given = {
        "host": params.build_host,
        "key": params.ssh_key,
        "known_hosts": params.known_hosts,
        "accept_new_host_keys": "true" if params.accept_new_host_keys else None,
    }
    settings = {name: value for name, value in given.items() if value}
    if settings and params.executor != "ssh":
        raise InvalidOption(
            f"--build-host, --ssh-key, --known-hosts and --accept-new-host-keys are for --executor ssh, not "
            f"--executor {params.executor}",
            hint="add --executor ssh, or drop them",
        )
    cache = {"ccache_remote": params.ccache_remote, "ccache_password_file": params.ccache_password_file}
    cache_settings = {name: value for name, value in cache.items() if value}
    if cache_settings and params.executor != "docker":
        raise InvalidOption(
            f"--ccache-remote and --ccache-password-file are for --executor docker, not --executor "
            f"{params.executor}",
            hint="build with --executor docker, or set CCACHE_REMOTE_STORAGE on the build host yourself",
        )
    return {**settings, **cache_settings}


def _rebuild_executor(params: BuildParams, executor: Executor) -> tuple[Executor, str | None]:
    """Where --check-reproducible rebuilds: the build's own executor, or --on-builder's builder of the
    --builders fleet (and its name for the report), checked before anything is built."""
    if params.on_builder is None:
        return executor, None
    if not params.check_reproducible:
        raise InvalidOption(
            f"--on-builder {params.on_builder} names where --check-reproducible rebuilds",
            hint="add --check-reproducible",
        )
    if not params.builders:
        raise InvalidOption(
            f"--on-builder {params.on_builder} names a builder of a fleet, and no fleet is given",
            hint="add --builders FLEET (recipes/builders/NAME.toml or a path)",
        )
    from llamaforge.build.farm.rebuild import rebuild_executor

    return rebuild_executor(params.builders.partition(":")[0], params.on_builder, executor)


class PublishedBuild(Result):
    """A build in the store: built now, or the cached one with the same key."""

    key: str
    path: str
    cached: bool
    seconds: float
    artifacts: dict[str, dict[str, Any]] = Field(description="Artifact path -> size, sha256, …")


class ReproducibilityCheck(Result):
    """A rebuild from scratch compared artifact by artifact with the published build."""

    key: str
    reproducible: bool
    identical: list[str]
    different: list[dict[str, Any]] = Field(description="Each differing artifact: sha256s, sizes, sections")
    seconds: float
    log: str
    built_on: str = Field("", description="Where the build was made (engine URL, build host, or builder)")
    rebuilt_on: str = Field(
        "", description="Where it was rebuilt: the same engine, or --on-builder's builder"
    )
    built_in: str = Field("", description="The build's environment id (its builder image id)")
    rebuilt_in: str = Field("", description="The rebuild's environment id")
    note: str | None = Field(None, description="Set when the rebuild ran in another builder image")


class BuildResult(Result):
    """The plan of a dry run, or the published build (and the reproducibility check when asked for)."""

    dry_run: bool
    plan: dict[str, Any] | None = absent("The build plan: rendered files, cmake arguments, cache key")
    build: PublishedBuild | None = absent()
    reproducibility: ReproducibilityCheck | None = absent()
    matrix: list[MatrixRow] | None = absent(
        "One row per build of the matrix: key, platform, backend, archs, time, result"
    )


@operation(
    "build",
    BuildParams,
    read_only=False,
    long_running=True,
    cli="llamaforge.build.render:build_cli",
    html="llamaforge.build.render:build_html",
)
def build_op(params: BuildParams, ctx: OperationContext) -> BuildResult:
    """Build llama.cpp from a pinned, patched source in Docker or on a build host (or reuse the cached build);
    with --matrix, every build of a matrix file, one after another."""
    if params.matrix:
        return _build_matrix(params, ctx)
    if params.ccache_password_file and not params.ccache_remote:
        raise InvalidOption(
            "--ccache-password-file is the password of a remote compiler cache",
            hint="add --ccache-remote redis://HOST:PORT, or drop --ccache-password-file",
        )
    if params.builders and not params.on_builder:
        raise InvalidOption(
            "--builders fans out the builds of a matrix, or names the fleet of --on-builder",
            hint="add --matrix NAME, or --check-reproducible --on-builder NAME",
        )
    return _build_one(params, ctx)


def _build_one(
    params: BuildParams,
    ctx: OperationContext,
    executor: Executor | None = None,
    builder: dict[str, Any] | None = None,
) -> BuildResult:
    from llamaforge.build.execute import run_build

    plan, options = _plan_from_params(params)
    executor = executor or make_executor(params.executor, _executor_settings(params))
    rebuild, rebuilt_on = _rebuild_executor(params, executor)
    if params.dry_run:
        data = plan.to_json()
        data["cache_key"] = None
        try:
            environment_id = executor.peek_environment_id(plan)
        except LlamaforgeError:  # a dry run must work without Docker
            environment_id = None
        if environment_id:
            data["cache_key"] = plan.cache_key(environment_id)
        data["cache_key_note"] = (
            "key of the build with the existing builder image"
            if environment_id
            else "the key also covers the builder image id, known once the image is built"
        )
        return BuildResult(dry_run=True, plan=data)
    result = run_build(
        plan,
        options,
        executor=executor,
        force=params.force,
        jobs=params.jobs,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
        builder=builder,
    )
    output = BuildResult(dry_run=False, build=PublishedBuild.model_validate(result.to_json()))
    if params.check_reproducible:
        from llamaforge.build.reproducible import check_reproducible

        report = check_reproducible(
            result,
            plan,
            executor=rebuild,
            jobs=params.jobs,
            reporter=ctx.reporter,
            cancel=ctx.cancel,
            rebuilt_on=rebuilt_on,
        )
        output.reproducibility = ReproducibilityCheck.model_validate(report.to_json())
        if not report.reproducible:
            differing = ", ".join(item.path for item in report.different)
            raise OperationFailed(
                f"build {result.key} is not reproducible: {differing} differ(s) when rebuilt from scratch",
                result=output,
                exit_code=NotReproducible.exit_code,
                hint="the result lists the differing ELF sections and keeps each rebuilt copy to compare",
            )
    return output


def _matrix_row(output: BuildResult) -> dict[str, Any]:
    """A matrix row's fields from one entry's result."""
    from llamaforge.build.matrix import row_fields

    if output.build is None:
        return row_fields(output.plan)
    return row_fields(None, output.build.key, output.build.cached)


def _build_matrix(params: BuildParams, ctx: OperationContext) -> BuildResult:
    from llamaforge.build.matrix import MatrixEntry, MatrixStopped, entry_arguments, load_matrix, run_matrix
    from llamaforge.core.events import Event

    if params.from_manifest or params.check_reproducible:
        raise InvalidOption(
            "--matrix runs the builds its file lists", hint="drop --from-manifest / --check-reproducible"
        )
    matrix = load_matrix(params.matrix or "")
    fleet_name = (params.builders or "").partition(":")[0]
    shared = {
        "jobs": params.jobs,
        "force": params.force,
        "dry_run": params.dry_run,
        "ccache_remote": params.ccache_remote,
        "ccache_password_file": params.ccache_password_file,
    }

    def build_one(entry: MatrixEntry) -> dict[str, Any]:
        output = _build_one(BuildParams.model_validate({**entry_arguments(matrix, entry), **shared}), ctx)
        return _matrix_row(output)

    def build_on(
        entry: MatrixEntry, executor: Executor, builder: Builder, sub: OperationContext
    ) -> dict[str, Any]:
        # The fleet placed it: its executor is the builder's, whatever the entry would run on by itself.
        kind = {"executor": "docker" if builder.engine else "ssh", "build_host": None, "ssh_key": None}
        arguments = {**entry_arguments(matrix, entry), **shared, **kind, "known_hosts": None}
        where = {"name": builder.name, "address": builder.where, "fleet": fleet_name}
        return _matrix_row(_build_one(BuildParams.model_validate(arguments), sub, executor, where))

    def progress(message: str) -> None:
        ctx.reporter(Event("stage", message, stage="matrix"))

    try:
        if params.builders:
            from llamaforge.build.ccache import RemoteCache
            from llamaforge.build.farm.fanout import fleet_matrix

            given = params.ccache_remote
            cache = RemoteCache.parse(given, params.ccache_password_file) if given else None
            rows = fleet_matrix(matrix, params.builders, build_on, ctx, remote_cache=cache)
        else:
            rows = run_matrix(matrix, build_one, progress=progress)
    except MatrixStopped as stopped:
        stopped_output = BuildResult(dry_run=params.dry_run, matrix=stopped.rows)
        raise OperationFailed(
            f"matrix {matrix.name} was cancelled",
            result=stopped_output,
            exit_code=Cancelled.exit_code,
            hint="the table says which builds ran",
        ) from None
    output = BuildResult(dry_run=params.dry_run, matrix=rows)
    failed = [row for row in rows if row.result == "failed"]
    if failed:
        raise OperationFailed(
            f"{len(failed)} of {len(rows)} builds of matrix {matrix.name} failed: "
            + ", ".join(row.name for row in failed),
            result=output,
            exit_code=failed[0].exit_code,
            hint="each failed row carries its error and next step; the other builds are published",
        )
    return output
