"""Operations ``models.fetch`` and ``models.lock`` (registered with the operation registry on import), with
their result models."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llamaforge.core.errors import LockError, OperationFailed
from llamaforge.core.registry import OperationContext, Params, Result, operation, path_field


class ModelFetchParams(Params):
    """Parameters of ``models.fetch``."""

    model: str = path_field(
        description="Model recipe (name or .toml path) or URL: hf://owner/repo/file.gguf, ms://owner/repo/file.gguf, "
        "https://…, file://…; or a tiny model's name (tiny, tiny-q4_k_m), written here"
    )
    offline: bool = Field(False, description="Serve only the local model cache; never touch the network")
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit) instead of the recipe's or the lock's"
    )


class ModelFetchResult(Result):
    """A verified model file in the store (downloaded now, or found there)."""

    path: str
    sha256: str
    size: int
    cached: bool
    source: str = Field(description="Where it came from (user info and query removed)")
    revision: str | None
    commit: str | None


@operation(
    "models.fetch",
    ModelFetchParams,
    read_only=False,
    long_running=True,
    positional=("model",),
    cli="llamaforge.models.render:models_fetch_cli",
    html="llamaforge.models.render:models_fetch_html",
)
def models_fetch_op(params: ModelFetchParams, ctx: OperationContext) -> ModelFetchResult:
    """Download a model into the verified, content-addressed cache (resumable; sha256-checked; --offline)."""
    from llamaforge.models.fetch import fetch_model
    from llamaforge.models.tiny import fetch_tiny_model

    tiny = fetch_tiny_model(
        params.model,
        offline=params.offline,
        revision=params.revision,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    result = tiny or fetch_model(
        params.model,
        offline=params.offline,
        revision=params.revision,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    return ModelFetchResult.model_validate(result.to_json())


class ModelLockParams(Params):
    """Parameters of ``models.lock``."""

    recipe: str | None = path_field(
        None, description="Lock only this model recipe (default: every model recipe and the base images)"
    )
    frozen: bool = Field(False, description="Resolve nothing; fail naming every input that is not pinned")


class ModelLockResult(Result):
    """What a lock run resolved, found pinned, skipped and could not resolve (then ``models.lock`` fails)."""

    lock_file: str
    written: bool
    locked: list[dict[str, Any]] = Field(
        description="Each locked input: kind, name, revision/sha256 or digest"
    )
    pinned: list[str]
    skipped: list[dict[str, str]]
    unresolved: list[dict[str, str]] = Field(description="Each unresolved input: kind, name, reason, hint")
    exit_code: int


@operation("models.lock", ModelLockParams, read_only=False, cli="llamaforge.models.render:models_lock_cli")
def models_lock_op(params: ModelLockParams, ctx: OperationContext) -> ModelLockResult:
    """Resolve model revisions to commits + sha256 and base images to digests; write recipes/lock.toml."""
    from llamaforge.models.lock import lock_models

    report = lock_models(
        [params.recipe] if params.recipe else None, frozen=params.frozen, reporter=ctx.reporter
    )
    data = ModelLockResult.model_validate(report.to_json())
    if report.unresolved:
        raise OperationFailed(
            "could not lock " + ", ".join(f"{item['kind']} {item['name']}" for item in report.unresolved),
            result=data,
            exit_code=LockError.exit_code,
            hint="each unresolved input says why and what to do; the others were locked",
        )
    return data
