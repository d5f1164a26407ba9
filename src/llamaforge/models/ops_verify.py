"""Operations ``models.verify`` and ``models.inspect`` (registered with the operation registry on import), with
their result models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from llamaforge.core.errors import InvalidOption, ModelError, OperationFailed
from llamaforge.core.registry import OperationContext, Params, Result, absent, operation, path_field
from llamaforge.models.findings import Status


class ModelVerifyParams(Params):
    """Parameters of ``models.verify``."""

    target: str = path_field(
        description="GGUF file, a model recipe (name or .toml) whose file is local or fetched, or `tiny` / "
        "`tiny-q4_k_m` (the tiny smoke models)"
    )
    recipe: str | None = path_field(
        None, description="Check FILE against this model recipe's pins and expectations"
    )
    load_check: str | None = path_field(
        None, description="Also load the model with this llama.cpp build (build key, or its directory)"
    )
    no_cache: bool = Field(False, description="Ignore the cached verdict: re-parse and re-hash the file")


def _build_dir(value: str) -> Path:
    from llamaforge.build.store import build_dir, build_path, find_build

    return build_path(value, "--load-check") or build_dir(str(find_build(value)["key"]))


class VerifyFinding(Result):
    """One result of a check; ``subject`` names the tensor, key or field concerned."""

    check: str
    status: Status
    subject: str
    message: str


class ModelVerifyResult(Result):
    """The verdict on one model file (``models.verify`` fails when a check failed)."""

    path: str
    ok: bool
    exit_code: int
    recipe: str | None
    size: int
    sha256: str
    cached: bool = Field(description="The verdict came from the cache (same file, same size and mtime)")
    seconds: float
    checks: dict[str, Status] = Field(description="The worst status per check (skipped: it did not run)")
    findings: list[VerifyFinding]
    model: dict[str, Any] = Field(description="What the header says: architecture, layers, tokenizer, …")
    load_check: dict[str, Any] | None = Field(description="Loading with a llama.cpp build (--load-check)")


@operation(
    "models.verify",
    ModelVerifyParams,
    read_only=True,
    long_running=True,
    positional=("target",),
    cli="llamaforge.models.render:models_verify_cli",
    html="llamaforge.models.render:models_verify_html",
)
def models_verify_op(params: ModelVerifyParams, ctx: OperationContext) -> ModelVerifyResult:
    """Verify a GGUF: hardened header parse, sha256, structure, recipe expectations, tensors, chat template."""
    from llamaforge.models.inspect import resolve_local_model
    from llamaforge.models.tiny import TINY_SMOKE_MODELS
    from llamaforge.models.verify import verify_model

    # the build first: a mistyped --load-check was named only after the tiny model had been written
    build = _build_dir(params.load_check) if params.load_check else None
    expected = None
    if params.recipe:  # before the target, which may be written first (the tiny model)
        expected = None if params.recipe in TINY_SMOKE_MODELS else resolve_local_model(params.recipe)[1]
        if expected is None:
            raise InvalidOption(f"--recipe {params.recipe!r} is not a model recipe")
    path, recipe = resolve_local_model(params.target)
    if expected is not None:
        if recipe is not None:
            raise InvalidOption("give either a recipe as TARGET or --recipe with a file, not both")
        recipe = expected
    if path is None:
        raise InvalidOption(
            f"no local file for {params.target!r}",
            hint="fetch it first (`invoke models.fetch RECIPE`), or pass the path of the GGUF",
        )
    report = verify_model(
        path,
        recipe,
        load_check_build=build,
        use_cache=not params.no_cache,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    data = ModelVerifyResult.model_validate(report.to_json())
    if not report.ok:
        failed = sorted(name for name, status in report.checks().items() if status == "fail")
        load = report.load_check or {}
        crash = load.get("crash")
        raise OperationFailed(
            f"{path} FAILED verification: {', '.join(failed)}" + (f" ({crash})" if crash else ""),
            result=data,
            exit_code=ModelError.exit_code,
            # a crash is the build's or the CPU's doing, not the file's: its hint is the one that helps
            hint=load.get("hint") if crash else "the findings name each failing tensor, key or field",
        )
    return data


class ModelInspectParams(Params):
    """Parameters of ``models.inspect``."""

    target: str = path_field(
        description="GGUF file, model recipe, URL (https://, http://, hf://owner/repo/path), or `tiny` / "
        "`tiny-q4_k_m` (the tiny smoke models)"
    )
    remote: bool = Field(
        False, description="Read only the header through HTTP range requests (implied for URLs)"
    )
    revision: str | None = Field(None, description="Hub revision for hf:// (default: the recipe's, or main)")


class ModelInspectResult(Result):
    """A model's header, summarised; read remotely, the transfer it took."""

    source: str
    remote: bool
    model: dict[str, Any] = Field(
        description="Architecture, parameters, layers, context, quant mix, tokenizer, …"
    )
    bytes_fetched: int | None = absent("Bytes read through HTTP range requests (remote only)")
    requests: int | None = absent("HTTP range requests made (remote only)")
    fraction_fetched: float | None = absent("Share of the file that was read (remote only)")
    seconds: float | None = absent()


@operation(
    "models.inspect",
    ModelInspectParams,
    read_only=True,
    positional=("target",),
    cli="llamaforge.models.render:models_inspect_cli",
    html="llamaforge.models.render:models_inspect_html",
)
def models_inspect_op(params: ModelInspectParams, ctx: OperationContext) -> ModelInspectResult:
    """Show a model's architecture, parameters, layers, context, quant mix, tokenizer and template."""
    from llamaforge.models.inspect import inspect_model

    return ModelInspectResult.model_validate(
        inspect_model(
            params.target,
            remote=params.remote,
            revision=params.revision,
            reporter=ctx.reporter,
            cancel=ctx.cancel,
        )
    )
