"""Operation ``models.remap`` (registered on import): the front-facing side of :mod:`llamaforge.models.remap`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from llamaforge.core.registry import OperationContext, Params, Result, operation, path_field


class ModelRemapParams(Params):
    """Parameters of ``models.remap``."""

    src: str = path_field(description="Input GGUF file")
    dst: str = path_field(description="Output GGUF file (a new path; the input is never modified)")
    rules: str | None = path_field(
        None, description="Remap rules: a name under recipes/remaps/ (e.g. qwen3-hf-names) or a .toml path"
    )
    target_arch: str | None = Field(
        None, description="Relabel general.architecture (refused when the tensors do not fit that arch)"
    )
    overwrite: bool = Field(False, description="Replace an existing output file")


class ModelRemapResult(Result):
    """The verified copy: renamed tensors, metadata edits and the new file's size and sha256."""

    src: str
    dst: str
    rules: str | None
    arch: str
    target_arch: str
    tensor_count: int
    tensor_bytes: int
    renamed_count: int
    renamed: dict[str, str] = Field(description="Old tensor name -> new tensor name")
    metadata_changes: list[dict[str, Any]] = Field(description="Each edit: op, key, old, new (and a note)")
    warnings: list[str]
    size: int
    sha256: str
    verified: bool
    seconds: float


@operation("models.remap", ModelRemapParams, read_only=False, long_running=True, positional=("src", "dst"))
def models_remap_op(params: ModelRemapParams, ctx: OperationContext) -> ModelRemapResult:
    """Rewrite a GGUF with llama.cpp's tensor names and a rules file's metadata edits (verified copy)."""
    from llamaforge.models.remap import load_rules, remap_gguf

    rules = load_rules(params.rules) if params.rules else None
    result = remap_gguf(
        Path(params.src),
        Path(params.dst),
        rules,
        target_arch=params.target_arch,
        overwrite=params.overwrite,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    return ModelRemapResult.model_validate(result.to_json())
