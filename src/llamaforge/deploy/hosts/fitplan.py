"""llama-server's flags for one host's GPU, from the fit planner (:func:`~llamaforge.serve.fit.plan_fit`).

A host whose inventory entry names its GPU gets the placement the planner finds for that card (``-ngl``,
``--n-cpu-moe``) at the context and slots asked for (``-c`` is the total; without one, the model's trained
context, which is what llama-server takes by default); flags the user gave win (a given ``-ngl`` is evaluated,
not searched). A model that does not fit is refused with the plan's numbers unless ``force``. A host without a
GPU (a CPU host, or ``--hosts`` without an inventory) runs the flags as given.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from llamaforge.core.errors import DoesNotFit
from llamaforge.serve.launcher import LlamaFlags


@dataclasses.dataclass(frozen=True)
class HostFit:
    """The flags a host gets and the lines that explain them (empty without a GPU)."""

    flags: LlamaFlags
    summary: tuple[str, ...] = ()


def _flash_attn(flags: LlamaFlags) -> bool | Literal["auto"]:
    return "auto" if flags.flash_attn == "auto" else flags.flash_attn != "off"


def fit_for_gpu(
    model: Path, gpu: str | None, given: LlamaFlags, *, host: str, force: bool = False
) -> HostFit:
    """The flags for ``host`` with ``gpu`` (see the module docstring); DoesNotFit names the host and the
    plan's numbers unless ``force``."""
    if gpu is None:
        return HostFit(given)
    from llamaforge.gguf.header import read_header
    from llamaforge.serve.fit import GiB, plan_fit, summarize
    from llamaforge.serve.shape import model_shape

    header = read_header(model)
    parallel = given.parallel or 1
    total = given.ctx or model_shape(header).n_ctx_train or 4096
    per_slot = max(total // parallel, 1)
    try:
        plan = plan_fit(
            header,
            gpu=gpu,
            ctx=per_slot,
            parallel=parallel,
            cache_type_k=given.cache_type_k or "f16",
            cache_type_v=given.cache_type_v or "f16",
            flash_attn=_flash_attn(given),
            n_gpu_layers=given.n_gpu_layers,
            n_cpu_moe=given.n_cpu_moe,
            kv_unified=bool(given.kv_unified),
            swa_full=given.swa_full,
        )
    except DoesNotFit as error:
        if force:
            return HostFit(given, (f"does not fit ({error.message}); --force: flags as given",))
        hint = f"{error.hint}; or --force to deploy anyway"
        raise DoesNotFit(f"{host} ({gpu}): {error.message}", hint=hint) from None
    lines = tuple(summarize(plan))
    if not plan.fits:
        needed = (plan.gpu_memory.total + plan.margin_bytes) / GiB
        message = (
            f"{host} ({plan.gpu}): -ngl {plan.n_gpu_layers} needs {needed:.2f} GiB with the margin, the "
            f"GPU has {plan.vram_bytes / GiB:.1f} GiB"
        )
        if not force:
            raise DoesNotFit(
                message,
                hint="leave --n-gpu-layers out to let the fit plan place the layers, lower "
                "--ctx, or --force to deploy anyway",
            )
        lines = (*lines, f"does not fit ({message}); --force: deployed anyway")
    flags = dataclasses.replace(
        given,
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe or None,
        ctx=per_slot * parallel,
        parallel=parallel,
        flash_attn=given.flash_attn or "on",
    )
    return HostFit(flags, lines)
