"""The models an upgrade smokes on both builds: the quantized tiny models (written here, no hub) and every model
recipe whose file is already in the store; never a download."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.events import CancelToken, Reporter
from llamaforge.gguf.tiny import TinyModelSpec
from llamaforge.models.argument import resolve_model_file
from llamaforge.models.recipes import list_model_recipes
from llamaforge.models.tiny import TINY_SMOKE_MODELS, named_tiny_model, tiny_model_file

# A second quantized tiny model, of another architecture: experts reach the MoE kernels (mul_mat_id).
TINY_MOE = TinyModelSpec(arch="qwen3moe", dtype="q4_0")
TINY_MOE_LABEL = "tiny-qwen3moe-q4_0"


@dataclass(frozen=True)
class UpgradeModel:
    """One model both builds are smoked with: what ``smoke --model`` is given, the file, and a label."""

    argument: str
    path: Path
    label: str


def stored_recipe_models() -> list[str]:
    """The model recipes whose files are already in the store (nothing is fetched)."""
    found = []
    for name in list_model_recipes():
        try:
            resolve_model_file(name)
        except LlamaforgeError:
            continue
        found.append(name)
    return found


def upgrade_models(requested: Sequence[str], reporter: Reporter, cancel: CancelToken) -> list[UpgradeModel]:
    """``requested`` (model recipes, GGUF files, ``tiny``, ``tiny-q4_k_m``) or, when empty, the quantized tiny
    models (Q4_0 and Q4_K_M qwen3, Q4_0 qwen3moe) and every model recipe already in the store. A requested
    recipe that is not fetched is refused, not fetched."""
    names = list(requested) or [*TINY_SMOKE_MODELS, TINY_MOE_LABEL, *stored_recipe_models()]
    models = []
    for name in names:
        tiny = named_tiny_model(name, reporter, cancel)
        if tiny is not None:
            models.append(UpgradeModel(str(tiny[0]), *tiny))
        elif name == TINY_MOE_LABEL:
            path = tiny_model_file(TINY_MOE, TINY_MOE_LABEL, reporter, cancel)
            models.append(UpgradeModel(str(path), path, TINY_MOE_LABEL))
        else:
            path = resolve_model_file(name)
            models.append(UpgradeModel(name, path, Path(name).stem))
    return models
