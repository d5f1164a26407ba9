"""Model recipes: where a GGUF comes from, how it is pinned, and what it must look like.

``recipes/models/*.toml``; the same error conventions as build recipes (file and field named, "did you mean").
Revision and sha256 stay empty until ``models.lock`` resolves them against a reachable hub: never invented.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llamaforge.build.recipes import SmokeTable, resolve_named_file
from llamaforge.core.paths import data_dir
from llamaforge.core.validation import read_toml, recipe_error
from llamaforge.models.urls import file_url_host

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

    @field_validator("file_type")
    @classmethod
    def _a_file_type(cls, value: str | None) -> str | None:
        # A name no GGUF states (Q9_X, Unsloth's UD-Q4_K_XL label) fails every file, however good.
        from llamaforge.models.file_types import known_file_types, normal_file_type

        if value is not None and normal_file_type(value) not in (known := known_file_types()):
            raise ValueError(f"{value!r} is no GGUF file type; one of {', '.join(sorted(known))}")
        return value


class AnswerCheck(_Strict):
    """A prompt and the answer a working build must give with this model (``[[answers]]`` in a model recipe).

    Checked by smoke and by deploy's health gate (:func:`llamaforge.smoke.answers.check_answers`): the reply of
    a greedy chat completion must match ``regex`` (``re.search``) or contain one of ``choices`` as a whole
    word, case-insensitive. Exactly one of the two is given.
    """

    prompt: str = Field(min_length=1, description="The user message sent to the chat completion")
    regex: str | None = Field(None, description="Python regex searched in the reply; (?i) for any case")
    choices: list[str] | None = Field(
        None,
        min_length=1,
        description="Accepted answers: the reply must contain one as a whole word (any case)",
    )
    max_tokens: int = Field(32, ge=1, le=4096, description="Tokens the reply may take")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"regex {value!r} does not compile: {error}") from None
        return value

    @field_validator("choices")
    @classmethod
    def _non_blank(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not choice.strip() for choice in value):
            raise ValueError("choices must not be blank")
        return value

    @model_validator(mode="after")
    def _one_expectation(self) -> AnswerCheck:
        if (self.regex is None) == (self.choices is None):
            raise ValueError("give exactly one of regex or choices")
        return self

    @property
    def expectation(self) -> str:
        """The expected answer in words: ``regex /…/`` or ``one of 'a', 'b'``."""
        if self.regex is not None:
            return f"regex /{self.regex}/"
        return "one of " + ", ".join(repr(choice) for choice in self.choices or [])

    def matches(self, reply: str) -> bool:
        """Whether ``reply`` gives the expected answer."""
        if self.regex is not None:
            return re.search(self.regex, reply) is not None
        return any(
            re.search(rf"(?<!\w){re.escape(choice.strip())}(?!\w)", reply, re.IGNORECASE)
            for choice in self.choices or []
        )


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
        default=None,
        description="Smoke thresholds with this model: min_tg_tps, max_ttft_ms, non_empty_answer",
    )
    answers: list[AnswerCheck] = Field(
        default_factory=list, description="Prompts with expected answers, checked by smoke and deploy"
    )
    expect: ModelExpectations = Field(default_factory=ModelExpectations)

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(SOURCE_SCHEMES):
            raise ValueError(f"source must start with one of {', '.join(SOURCE_SCHEMES)}")
        if value.startswith(("hf://", "ms://")) and not re.fullmatch(r"(hf|ms)://[^/]+/[^/]+/.+", value):
            raise ValueError("hub sources look like hf://owner/repo/path/in/repo.gguf")
        if value.startswith(("hf://", "ms://")) and {"", ".", ".."} & set(value[5:].split("/")):
            # The hub URL would be normalized to another repository's file, or to none.
            raise ValueError("a hub source's owner, repo and path hold no empty, '.' or '..' part")
        if value.startswith("file://") and file_url_host(value):
            raise ValueError("file sources name an absolute path: file:///abs/path.gguf (three slashes)")
        return value

    @field_validator("revision")
    @classmethod
    def _revision_of_a_hub(cls, value: str | None, info: ValidationInfo) -> str | None:
        source = info.data.get("source", "")  # absent when the source itself was refused
        if value is not None and source and not source.startswith(("hf://", "ms://")):
            raise ValueError("revision applies to hf:// and ms:// sources only (pin others with sha256)")
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
    data = read_toml(path, "model recipe")
    try:
        return ModelRecipe.model_validate({**data, "name": path.stem})
    except ValidationError as error:
        raise recipe_error(error, what=f"model recipe {path}", root=ModelRecipe) from None
