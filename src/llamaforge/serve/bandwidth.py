"""Bytes read per generated token: the one definition behind the fit planner's tg ceiling and the smoke roofline.

Token generation is memory-bound, so ``tokens/s <= bandwidth / bytes read per token``. One token reads:

* every non-expert weight of the trunk layers and the output layer once (MTP layers are not run; a tied
  ``token_embd`` is read whole by the output projection);
* one row of ``token_embd`` (the lookup) when the output layer has its own matrix;
* ``expert_used_count / expert_count`` of each expert tensor (uniform routing);
* the K and V cache of every attention layer **at a stated depth** ``kv_depth`` (the tokens already in the
  sequence; the cache types as configured), at most the window for a sliding-window layer; K rows only with
  MLA (V is a view of them); a layer that reuses another layer's cache reads that cache again;
* the state of every recurrent (DeltaNet) layer, read and written.

The depth is the caller's: the fit planner uses the slot's full context (``--ctx``: the ceiling at the end of
a full slot, the slowest point), the smoke roofline the mean depth of llama-bench's tg test
(``n_depth + n_gen / 2``). Both say which in their notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamaforge.gguf.header import GGUFHeader
from llamaforge.serve.shape import gpu_layers, model_shape, row_bytes, weight_layout

__all__ = ["Placement", "TokenBytes", "bytes_per_token"]


@dataclass(frozen=True)
class Placement:
    """Where llama.cpp puts the layers: ``-ngl n_gpu_layers --n-cpu-moe n_cpu_moe``."""

    n_gpu_layers: int
    n_cpu_moe: int = 0


@dataclass(frozen=True)
class TokenBytes:
    """Bytes one generated token reads, by part; ``gpu`` is the share in GPU memory under a placement."""

    dense: int
    experts_active: int
    embedding_row: int
    kv_cache: int
    recurrent_state: int
    kv_depth: float
    gpu: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def weights(self) -> int:
        """Weight bytes: dense, the active experts' share and the embedding row."""
        return self.dense + self.experts_active + self.embedding_row

    @property
    def total(self) -> int:
        """Everything one token reads."""
        return self.weights + self.kv_cache + self.recurrent_state

    @property
    def host(self) -> int:
        """The share in host memory (everything without a placement)."""
        return self.total - self.gpu

    def to_json(self) -> dict[str, Any]:
        """The parts, with the weights and the total."""
        return {
            "dense": self.dense,
            "experts_active": self.experts_active,
            "embedding_row": self.embedding_row,
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "recurrent_state": self.recurrent_state,
            "total": self.total,
            "kv_depth": self.kv_depth,
            "gpu": self.gpu,
            "host": self.host,
        }


def bytes_per_token(
    header: GGUFHeader,
    *,
    kv_depth: float,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    placement: Placement | None = None,
) -> TokenBytes:
    """Bytes one generated token reads with ``kv_depth`` tokens in its KV cache (see the module docstring);
    with a ``placement``, how many of them are in GPU memory. Raises InvalidOption when ``header`` lacks the
    hyper-parameters (see :func:`~llamaforge.serve.shape.model_shape`)."""
    shape = model_shape(header)
    layout = weight_layout(shape, header.tensors)
    on_gpu, output_on_gpu = gpu_layers(shape, placement.n_gpu_layers) if placement else (set(), False)
    n_cpu_moe = placement.n_cpu_moe if placement else 0
    share = shape.n_expert_used / shape.n_expert if shape.n_expert else 1.0

    def kv_read(il: int) -> float:  # K and V rows this layer attends (MLA: K only; a window at most)
        k_width, v_width = shape.kv_widths(il)
        cell = row_bytes(cache_type_k, k_width) + (row_bytes(cache_type_v, v_width) if v_width else 0)
        return (min(kv_depth, shape.n_swa) if shape.is_swa(il) else kv_depth) * cell

    state_layer = (shape.conv_state_values + shape.ssm_state_values) * 4 * 2  # F32, read and written
    parts = {"dense": 0.0, "experts": 0.0, "kv": 0.0, "state": 0.0}
    gpu = 0.0
    for il in range(shape.n_layer):
        experts = layout.experts[il] * share
        memory = state_layer if shape.recurrent[il] else kv_read(il)
        parts["dense"] += layout.dense[il]
        parts["experts"] += experts
        parts["state" if shape.recurrent[il] else "kv"] += memory
        if il in on_gpu:
            gpu += layout.dense[il] + memory + (experts if il >= n_cpu_moe else 0)
    output = layout.output + layout.other + (layout.token_embd if layout.tied else 0)
    parts["dense"] += output
    if output_on_gpu:
        gpu += output
    embedding_row = (
        0 if layout.tied else layout.token_embd // max(1, shape.n_vocab)
    )  # token_embd stays on the CPU
    notes = [f"KV cache read at depth {kv_depth:g} tokens ({cache_type_k}/{cache_type_v})"]
    if shape.swa and kv_depth > shape.n_swa:
        notes.append(f"sliding-window layers read their window of {shape.n_swa} tokens only")
    if layout.tied:
        notes.append("tied embeddings: the output projection reads the whole token_embd table")
    if shape.n_expert and parts["experts"]:
        notes.append(
            f"MoE: {shape.n_expert_used} of {shape.n_expert} experts per token, assuming uniform routing"
        )
    if parts["state"]:
        notes.append("recurrent layers: their state is read and written once per token")
    return TokenBytes(
        dense=int(parts["dense"]),
        experts_active=int(parts["experts"]),
        embedding_row=embedding_row,
        kv_cache=int(parts["kv"]),
        recurrent_state=int(parts["state"]),
        kv_depth=kv_depth,
        gpu=int(gpu),
        notes=tuple(notes),
    )
