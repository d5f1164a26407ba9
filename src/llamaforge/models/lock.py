"""``models.lock``: resolve moving inputs to pins and write them to one lock file, ``recipes/lock.toml``.

Model recipes name a hub revision (often a branch such as ``main``) and leave sha256/size empty: never
invented. Locking asks the hub what that revision is now (the commit, and the sha256/size the hub's LFS
metadata publishes) and records it; ``models.fetch`` then uses the locked commit and verifies the locked sha256.
Base images of the build recipes get their registry digest the same way (through the Docker engine).

One file for all pins, so a review sees every upstream change in one diff. Entries are keyed by recipe name and
only apply while the recipe still names the same source and revision. ``--frozen`` resolves nothing: it fails,
naming every input that is not pinned (by its recipe or by the lock).
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamaforge.core.errors import (
    DockerUnavailable,
    FetchError,
    ImageError,
    InvalidOption,
    LockError,
    RecipeError,
)
from llamaforge.core.events import Event, Reporter, null_reporter
from llamaforge.core.paths import data_dir, write_text_atomic
from llamaforge.core.validation import describe_errors
from llamaforge.models import store as modelstore
from llamaforge.models.hubs import default_revision, is_commit, parse_hub_source, resolve
from llamaforge.models.recipes import ModelRecipe, list_model_recipes, load_model_recipe

LOCAL_IMAGE_PREFIX = "llamaforge/"  # images made by `images.bootstrap`: no registry, nothing to lock


class ModelLock(BaseModel):
    """The pins of one model recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    requested_revision: str | None = Field(None, description="The revision the recipe asked for")
    revision: str | None = Field(None, description="What it resolved to: a commit on Hugging Face")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=1)
    resolved_at: str = ""


class ImageLock(BaseModel):
    """The registry digest of one base image tag."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    resolved_at: str = ""


class LockFile(BaseModel):
    """All pins."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    models: dict[str, ModelLock] = Field(default_factory=dict)
    images: dict[str, ImageLock] = Field(default_factory=dict)


@dataclass
class LockReport:
    """What a lock run did."""

    path: Path
    locked: list[dict[str, Any]] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    unresolved: list[dict[str, str]] = field(default_factory=list)
    written: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON-able form; ``exit_code`` is non-zero when anything stayed unresolved."""
        return {
            "lock_file": str(self.path),
            "written": self.written,
            "locked": self.locked,
            "pinned": self.pinned,
            "skipped": self.skipped,
            "unresolved": self.unresolved,
            "exit_code": LockError.exit_code if self.unresolved else 0,
        }


def lock_path() -> Path:
    """The lock file: ``LLAMAFORGE_LOCK_FILE``, else ``recipes/lock.toml``."""
    explicit = os.environ.get("LLAMAFORGE_LOCK_FILE")
    return Path(explicit) if explicit else data_dir("recipes") / "lock.toml"


def read_lock(path: Path | None = None) -> LockFile:
    """The lock file's content (empty when there is none)."""
    path = path or lock_path()
    if not path.is_file():
        return LockFile()
    # `models.lock` reads the file too, so the way out of a damaged one is to repair or remove it first.
    hint = f"fix {path}, or restore or remove it (then run `invoke models.lock` to pin again)"
    try:
        return LockFile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except ValidationError as error:
        raise RecipeError(f"lock file {path} is invalid: {describe_errors(error)}", hint=hint) from None
    except (tomllib.TOMLDecodeError, ValueError) as error:
        raise RecipeError(f"lock file {path} is invalid: {error}", hint=hint) from None


def _toml_value(value: str | int) -> str:
    return str(value) if isinstance(value, int) else json.dumps(value)


def write_lock(lock: LockFile, path: Path | None = None) -> Path:
    """Write ``lock`` atomically, sorted, so diffs show only real changes."""
    path = path or lock_path()
    lines = [
        "# Written by `invoke models.lock`: what each recipe's moving inputs resolved to. Do not edit by hand.",
        "# models.<recipe>: Hugging Face commit (revision), sha256 and size; images.<tag>: registry digest.",
        f"version = {lock.version}",
    ]
    for name, model in sorted(lock.models.items()):
        lines += ["", f"[models.{json.dumps(name)}]"]
        lines += [
            f"{key} = {_toml_value(value)}" for key, value in model.model_dump(exclude_none=True).items()
        ]
    for tag, image in sorted(lock.images.items()):
        lines += ["", f"[images.{json.dumps(tag)}]"]
        lines += [
            f"{key} = {_toml_value(value)}" for key, value in image.model_dump(exclude_none=True).items()
        ]
    try:
        write_text_atomic(path, "\n".join(lines) + "\n")
    except OSError as error:
        raise InvalidOption(
            f"cannot write the lock file {path}: {error.strerror or error}",
            hint="LLAMAFORGE_LOCK_FILE (default recipes/lock.toml) must name a regular file in a writable "
            "directory",
        ) from None
    return path


def _requested(recipe: ModelRecipe) -> str | None:
    if recipe.source.startswith(("hf://", "ms://")):
        return recipe.revision or default_revision(recipe.source[:2])
    return None


def _entry_applies(recipe: ModelRecipe, entry: ModelLock | None) -> bool:
    return (
        entry is not None and entry.source == recipe.source and entry.requested_revision == _requested(recipe)
    )


def apply_lock(recipe: ModelRecipe, lock: LockFile | None = None) -> ModelRecipe:
    """``recipe`` with the lock's commit, sha256 and size filled in, when the lock has a matching entry."""
    if recipe.pinned or not recipe.name:
        return recipe
    lock = lock if lock is not None else read_lock()
    entry = lock.models.get(recipe.name)
    if entry is None or not _entry_applies(recipe, entry):
        return recipe
    if recipe.sha256 and recipe.sha256 != entry.sha256:
        return recipe  # the recipe's own pin wins; fetch verifies against it
    return recipe.model_copy(update={"revision": entry.revision, "sha256": entry.sha256, "size": entry.size})


def locked_image_digest(tag: str, lock: LockFile | None = None) -> str | None:
    """The locked registry digest of base image ``tag`` (for builds that want ``tag@digest``)."""
    lock = lock if lock is not None else read_lock()
    entry = lock.images.get(tag)
    return entry.digest if entry else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _model_is_pinned(recipe: ModelRecipe, lock: LockFile) -> bool:
    effective = apply_lock(recipe, lock)
    if effective.sha256 is None:
        return False
    # Hugging Face revisions must be commits; ModelScope names no commits, so there the sha256 is the pin.
    return not effective.source.startswith("hf://") or is_commit(effective.revision)


def _resolve_model(recipe: ModelRecipe, reporter: Reporter) -> ModelLock:
    """Resolve one recipe against its hub (or, for URLs, the local store); raises LockError with the reason."""
    requested = _requested(recipe)
    if recipe.source.startswith(("hf://", "ms://")):
        reporter(Event("info", f"resolving {recipe.source}@{requested}", stage="lock"))
        try:
            hub_file = resolve(parse_hub_source(recipe.source), requested)
        except FetchError as error:
            raise LockError(error.message, hint=error.hint) from None
        if recipe.source.startswith("hf://") and hub_file.commit is None:
            raise LockError("the hub reported no commit for this revision")
        sha256, size = hub_file.sha256, hub_file.size
        if sha256 is None:
            # Not an LFS file: the hub publishes no sha256. A copy fetched at this commit still knows it.
            known = modelstore.find_source(f"{recipe.source}@{hub_file.commit or requested}")
            sha256, size = (known["sha256"], known["size"]) if known else (None, size)
        if sha256 is None or not size:
            raise LockError(
                "the hub publishes no sha256 for this file",
                hint="fetch it once (`invoke models.fetch`) and lock again: the lock then uses the verified copy",
            )
        revision = hub_file.commit or requested
        return ModelLock(
            source=recipe.source,
            requested_revision=requested,
            revision=revision,
            sha256=sha256,
            size=size,
            resolved_at=_now(),
        )
    # https:// and file://: nothing to ask; a fetched copy pins it (lock never downloads gigabytes).
    known = modelstore.find_source(f"{recipe.source}@")
    if known is None:
        raise LockError(
            "a URL source publishes no sha256",
            hint="fetch it once (`invoke models.fetch`) and lock again, or pin sha256 in the recipe",
        )
    return ModelLock(source=recipe.source, sha256=known["sha256"], size=known["size"], resolved_at=_now())


def _image_tags() -> list[str]:
    from llamaforge.build.recipes import list_recipes, load_recipe

    tags: dict[str, str | None] = {}
    for name in list_recipes():
        for image in load_recipe(name).images.values():
            if image.digest is None:
                tags.setdefault(image.tag, None)
    return sorted(tags)


def _resolve_image(tag: str) -> str:
    from llamaforge.runners.engine import registry_digest

    try:
        return registry_digest(tag)
    except DockerUnavailable as error:
        raise LockError(f"Docker engine not reachable: {error.message}", hint=error.hint) from None
    except ImageError as error:
        raise LockError(error.message, hint=error.hint) from None


def lock_models(
    names: list[str] | None = None,
    *,
    frozen: bool = False,
    images: bool | None = None,
    reporter: Reporter = null_reporter,
) -> LockReport:
    """Resolve the model recipes ``names`` (all when None) and, by default when locking all, the base images.

    Writes what resolved to the lock file, keeping other entries. With ``frozen`` nothing is resolved or written:
    a ``LockError`` names every input that is not pinned.
    """
    path = lock_path()
    lock = read_lock(path)
    recipes = [load_model_recipe(name) for name in (names or list_model_recipes())]
    with_images = images if images is not None else not names
    report = LockReport(path=path)
    if frozen:
        missing = [
            f"model {recipe.name} ({recipe.source})"
            for recipe in recipes
            if not _model_is_pinned(recipe, lock)
        ]
        if with_images:
            missing += [
                f"image {tag}"
                for tag in _image_tags()
                if not tag.startswith(LOCAL_IMAGE_PREFIX) and tag not in lock.images
            ]
        if missing:
            raise LockError(
                "--frozen: these inputs are not pinned:\n  " + "\n  ".join(missing),
                hint="run `invoke models.lock` where the hubs and registries are reachable, and commit lock.toml",
            )
        report.pinned = [recipe.name for recipe in recipes]
        return report
    for recipe in recipes:
        if recipe.pinned:
            report.pinned.append(recipe.name)
            continue
        try:
            entry = _resolve_model(recipe, reporter)
        except LockError as error:
            report.unresolved.append(
                {
                    "kind": "model",
                    "name": recipe.name,
                    "source": recipe.source,
                    "reason": error.message,
                    "hint": error.hint or "",
                }
            )
            continue
        lock.models[recipe.name] = entry
        report.locked.append({"kind": "model", "name": recipe.name, **entry.model_dump(exclude_none=True)})
    if with_images:
        for tag in _image_tags():
            if tag.startswith(LOCAL_IMAGE_PREFIX):
                report.skipped.append(
                    {
                        "kind": "image",
                        "name": tag,
                        "reason": "made locally by `invoke images.bootstrap`: no registry",
                    }
                )
                continue
            try:
                digest = _resolve_image(tag)
            except LockError as error:
                report.unresolved.append(
                    {
                        "kind": "image",
                        "name": tag,
                        "source": tag,
                        "reason": error.message,
                        "hint": error.hint or "",
                    }
                )
                continue
            lock.images[tag] = ImageLock(digest=digest, resolved_at=_now())
            report.locked.append({"kind": "image", "name": tag, "digest": digest})
    if report.locked:
        write_lock(lock, path)
        report.written = True
    for item in report.unresolved:
        reporter(
            Event("warning", f"could not lock {item['kind']} {item['name']}: {item['reason']}", stage="lock")
        )
    return report
