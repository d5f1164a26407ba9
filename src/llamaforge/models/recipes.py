"""Model recipes: where a GGUF comes from, how it is pinned, and what it must look like.

``recipes/models/*.toml``; the same error conventions as build recipes (file and field named, "did you mean").
Revision and sha256 stay empty until ``models.lock`` resolves them against a reachable hub: never invented.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llamaforge.build.recipes import SmokeTable, resolve_named_file
from llamaforge.core.errors import RecipeError
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import recipe_error

SOURCE_SCHEMES = ("hf://", "ms://", "https://", "http://", "file://")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelExpectations(_Strict):
    """What a verified file must show (checked by ``models.verify``)."""

    architecture: str | None = Field(None, description="general.architecture, e.g. qwen3, qwen35moe")
    min_context_length: int | None = Field(None, ge=1, description="Lower bound for {arch}.context_length")
    file_type: str | None = Field(None, description="Quantisation of most weights, e.g. Q4_K_M, Q8_0, F16")
    block_count: int | None = Field(None, ge=1, description="{arch}.block_count")
    expert_count: int | None = Field(None, ge=0, description="{arch}.expert_count (MoE)")
    expert_used_count: int | None = Field(None, ge=0, description="{arch}.expert_used_count (MoE)")
    chat_template: bool | None = Field(None, description="tokenizer.chat_template must be present")


class ModelRecipe(_Strict):
    """One model file: source URL, pins, expectations."""

    name: str = Field(default="", description="Recipe name (the file name without .toml)")
    description: str = ""
    source: str = Field(
        description="hf://owner/repo/path.gguf, ms://owner/repo/path.gguf, https://…, file://…"
    )
    revision: str | None = Field(None, description="Hub revision (branch/tag, or a commit once locked)")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 of the file once locked")
    size: int | None = Field(None, ge=1, description="Size in bytes once locked")
    smoke: SmokeTable = Field(
        default=None, description="Smoke thresholds with this model: min_tg_tps, max_ttft_ms, must_answer"
    )
    expect: ModelExpectations = Field(default_factory=ModelExpectations)

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(SOURCE_SCHEMES):
            raise ValueError(f"source must start with one of {', '.join(SOURCE_SCHEMES)}")
        if value.startswith(("hf://", "ms://")) and not re.fullmatch(r"(hf|ms)://[^/]+/[^/]+/.+", value):
            raise ValueError("hub sources look like hf://owner/repo/path/in/repo.gguf")
        return value

    @property
    def pinned(self) -> bool:
        """True when the file is fully pinned (sha256, and a revision for hub sources)."""
        hub = self.source.startswith(("hf://", "ms://"))
        return self.sha256 is not None and (not hub or self.revision is not None)


def model_recipe_dir() -> Path:
    """Directory of the shipped model recipes."""
    return data_dir("recipes") / "models"


def list_model_recipes() -> list[str]:
    """Names of the shipped model recipes."""
    return sorted(path.stem for path in model_recipe_dir().glob("*.toml"))


def load_model_recipe(name_or_path: str) -> ModelRecipe:
    """Load a model recipe by name (``recipes/models/NAME.toml``) or path."""
    path = resolve_named_file(name_or_path, model_recipe_dir(), "model recipe")
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"model recipe {path} is not valid TOML: {error}") from None
    try:
        return ModelRecipe.model_validate({**data, "name": path.stem})
    except ValidationError as error:
        raise recipe_error(error, what=f"model recipe {path}", root=ModelRecipe) from None
