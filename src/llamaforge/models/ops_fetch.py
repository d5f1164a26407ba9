"""Operations ``models.fetch`` and ``models.lock`` (registered with the operation registry on import)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llamaforge.core.errors import LockError, OperationFailed
from llamaforge.core.registry import OperationContext, Params, operation


class ModelFetchParams(Params):
    """Parameters of ``models.fetch``."""

    model: str = Field(
        description="Model recipe (name or .toml path) or URL: hf://owner/repo/file.gguf, ms://owner/repo/file.gguf, "
        "https://…, file://…"
    )
    offline: bool = Field(False, description="Serve only the local model cache; never touch the network")
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit) instead of the recipe's or the lock's"
    )


@operation("models.fetch", ModelFetchParams, read_only=False, long_running=True, positional=("model",))
def models_fetch_op(params: ModelFetchParams, ctx: OperationContext) -> dict[str, Any]:
    """Download a model into the verified, content-addressed cache (resumable; sha256-checked; --offline)."""
    from llamaforge.models.fetch import fetch_model

    result = fetch_model(
        params.model,
        offline=params.offline,
        revision=params.revision,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    return result.to_json()


class ModelLockParams(Params):
    """Parameters of ``models.lock``."""

    recipe: str | None = Field(
        None, description="Lock only this model recipe (default: every model recipe and the base images)"
    )
    frozen: bool = Field(False, description="Resolve nothing; fail naming every input that is not pinned")


@operation("models.lock", ModelLockParams, read_only=False)
def models_lock_op(params: ModelLockParams, ctx: OperationContext) -> dict[str, Any]:
    """Resolve model revisions to commits + sha256 and base images to digests; write recipes/lock.toml."""
    from llamaforge.models.lock import lock_models

    report = lock_models(
        [params.recipe] if params.recipe else None, frozen=params.frozen, reporter=ctx.reporter
    )
    data = report.to_json()
    if report.unresolved:
        raise OperationFailed(
            "could not lock " + ", ".join(f"{item['kind']} {item['name']}" for item in report.unresolved),
            result=data,
            exit_code=LockError.exit_code,
            hint="each unresolved input says why and what to do; the others were locked",
        )
    return data
