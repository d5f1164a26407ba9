"""The ``upgrade`` operation (registered with the operation registry on import): its parameters, and the
failure channel of its verdicts; the pipeline is :mod:`llamaforge.upgrade.run`."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llamaforge.build.executors import ExecutorName
from llamaforge.build.recipes import Backend
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.registry import Int32, OperationContext, Params, empty_list, operation, path_field
from llamaforge.upgrade.results import UpgradeResult


class UpgradeParams(Params):
    """Parameters of ``upgrade``."""

    to: str | None = path_field(
        None,
        description="The release to move to: llama-cpp-python==X.Y.Z (a PyPI sdist that vendors llama.cpp), "
        "a git URL@FULL-COMMIT, or an archive (path, file:// or https://) with --sha256",
    )
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="sha256 of the archive --to names (archives only)"
    )
    build_number: Int32 | None = Field(
        None, ge=1, description="llama.cpp build number (bNNNN) of the new source, when its tree cannot say"
    )
    recipe: str = path_field(
        "default", description="Build recipe to upgrade (recipes/builds/NAME.toml or a path)"
    )
    resume: str | None = path_field(
        None,
        description="Go on with an earlier upgrade (its directory or id): after a dry run, after resolving "
        "the conflicts its rebase left in the workspace, or to --apply what it measured; it keeps the options it "
        "started with (CPU level, archs, models, smoke settings, tolerance)",
    )
    dry_run: bool = Field(
        False, description="Resolve, rebase and check the recipe against the new tree; build nothing"
    )
    apply: bool = Field(
        False,
        description="Write the new pin and the rebased series into the recipe when the verdict is ok "
        "(without it nothing under recipes/ or patches/ changes)",
    )
    models: list[str] = path_field(
        default_factory=empty_list,
        description="Models to smoke both builds with: recipe names, GGUF files, tiny (default: the quantized "
        "tiny models and every model recipe already fetched; nothing is downloaded)",
    )
    cpu: str | None = Field(None, description="CPU level of both builds (default: the recipe's)")
    arch: str | None = Field(None, description="CUDA archs of both builds, e.g. 86 or 86,89")
    backend: Backend | None = Field(None, description="Backend of both builds (default: the recipe's)")
    executor: ExecutorName = Field("docker", description="Where both builds run: docker, local or ssh")
    jobs: Int32 | None = Field(None, ge=1, description="Parallel compile jobs (default: the CPU count)")
    repetitions: int = Field(3, ge=1, le=50, description="llama-bench repetitions per test in each smoke")
    threads: Int32 | None = Field(None, ge=1, description="CPU threads of llama-bench and llama-server")
    tolerance: float = Field(
        0.10,
        gt=0,
        lt=1,
        description="pp/tg slowdown (fraction) the verdict accepts before it says regression",
    )

    @field_validator("build_number", mode="before")
    @classmethod
    def _tag_form(cls, value: object) -> object:
        # the help and the release tags write it bNNNN: take the tag as the number it names
        if isinstance(value, str) and value[:1] in ("b", "B") and value[1:].isdigit():
            return value[1:]
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> UpgradeParams:
        if self.dry_run and self.apply:
            raise ValueError("--dry-run builds nothing and --apply needs a built, smoked candidate: pick one")
        if not self.to and not self.resume:
            raise ValueError(
                "name the release with --to SOURCE, or go on with an earlier one with --resume DIR"
            )
        if self.to and self.resume:
            raise ValueError("--resume goes on with the release the run started with: drop --to")
        return self


@operation(
    "upgrade",
    UpgradeParams,
    read_only=False,
    destructive_when="apply",
    long_running=True,
    cli="llamaforge.upgrade.render:upgrade_cli",
    html="llamaforge.upgrade.render:upgrade_html",
)
def upgrade_op(params: UpgradeParams, ctx: OperationContext) -> UpgradeResult:
    """Move a recipe to another llama.cpp release: rebase the patches, check options and targets, build and smoke
    old and new side by side, re-measure the fit, one report; the recipe changes only with --apply."""
    # The pipeline loads gguf, numpy and matplotlib: only when an upgrade runs, never when the CLI starts.
    from llamaforge.upgrade.run import UpgradeRequest, run_upgrade
    from llamaforge.upgrade.stages import BuildChoice

    if params.sha256 and params.to and "==" in params.to:
        raise InvalidOption("--sha256 is for archives: a PyPI sdist's sha256 is computed from the download")
    request = UpgradeRequest(
        recipe=params.recipe,
        to=params.to,
        sha256=params.sha256,
        build_number=params.build_number,
        resume=params.resume,
        mode="dry-run" if params.dry_run else "apply" if params.apply else "run",
        models=tuple(params.models),
        choice=BuildChoice(
            cpu=params.cpu,
            arch=params.arch,
            backend=params.backend,
            executor=params.executor,
            jobs=params.jobs,
        ),
        smoke={
            "repetitions": params.repetitions,
            "threads": params.threads,
            "concurrency": [1],
            "skip_cpu_modules": True,
            "executor": params.executor,
        },
        tolerance=params.tolerance,
    )
    result = run_upgrade(request, ctx)
    if result.exit_code == 0:
        return result
    raise OperationFailed(
        f"upgrade of {result.recipe} to {result.new.label}: {result.verdict}: {result.reasons[0]}",
        result=result,
        exit_code=result.exit_code,
        hint=result.next_step,
    )
