"""Header-only models: a :class:`~llamaforge.gguf.header.GGUFHeader` shaped like a tiny-model spec, with no
file behind it, to plan a model from its published hyper-parameters before downloading it (and for benchmarks)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from llamaforge.gguf.header import GGML_TYPES, GGUFHeader, TensorInfo
from llamaforge.serve.memory import pad
from llamaforge.serve.shape import HYBRID_ARCHS, SWA_ARCHS

if TYPE_CHECKING:
    from llamaforge.gguf.tiny import TinyModelSpec


def synthetic_header(
    spec: TinyModelSpec,
    *,
    n_vocab: int,
    weight_type: str = "Q4_K",
    output_type: str = "Q6_K",
    name: str | None = None,
) -> GGUFHeader:
    """A header-only description of a model shaped like ``spec`` (no file): to plan a model from its published
    hyper-parameters before downloading it, and for benchmarks. Matrices whose rows fit ``weight_type``'s block
    get that type (``output.weight``: ``output_type``), the rest F16; 1-D and always-F32 tensors F32."""
    from llamaforge.gguf.tiny import tensor_plan

    types = {t.name.lower(): t for t in GGML_TYPES.values()}
    arch = spec.arch
    meta: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": name or spec.default_name,
        f"{arch}.block_count": spec.n_layer,
        f"{arch}.context_length": spec.context_length,
        f"{arch}.embedding_length": spec.n_embd,
        f"{arch}.feed_forward_length": spec.n_ff,
        f"{arch}.attention.head_count": spec.n_head,
        f"{arch}.attention.head_count_kv": spec.n_head_kv,
        f"{arch}.attention.key_length": spec.head_dim,
        f"{arch}.attention.value_length": spec.head_dim,
    }
    if "moe" in arch:
        meta.update(
            {
                f"{arch}.expert_count": spec.n_expert,
                f"{arch}.expert_used_count": spec.n_expert_used,
                f"{arch}.expert_feed_forward_length": spec.n_ff_exp,
            }
        )
        if arch in HYBRID_ARCHS:
            meta[f"{arch}.expert_shared_feed_forward_length"] = spec.n_ff_shexp
    if arch in SWA_ARCHS:
        meta[f"{arch}.attention.sliding_window"] = spec.sliding_window
    if arch in HYBRID_ARCHS:
        meta.update(
            {
                f"{arch}.ssm.conv_kernel": spec.ssm_conv_kernel,
                f"{arch}.ssm.state_size": spec.ssm_state_size,
                f"{arch}.ssm.group_count": spec.ssm_group_count,
                f"{arch}.ssm.time_step_rank": spec.ssm_time_step_rank,
                f"{arch}.ssm.inner_size": spec.ssm_inner_size,
                f"{arch}.full_attention_interval": spec.full_attention_interval,
            }
        )
    tensors: list[TensorInfo] = []
    offset = 0
    for entry in tensor_plan(spec, n_vocab):
        ne = entry.shape[::-1]
        wanted = types[(output_type if entry.canonical == "output.weight" else weight_type).lower()]
        if len(ne) == 1 or entry.dtype.itemsize == 4:
            ggml_type = types["f32"]
        elif ne[0] % wanted.block_size == 0:
            ggml_type = wanted
        else:
            ggml_type = types["f16"]
        count = math.prod(ne)
        nbytes = count // ggml_type.block_size * ggml_type.type_size
        tensors.append(TensorInfo(entry.canonical, tuple(ne), ggml_type, offset, nbytes))
        offset += pad(nbytes, 32)
    return GGUFHeader(
        source=name or spec.default_name,
        file_size=offset,
        version=3,
        metadata=meta,
        value_types={},
        tensors=tensors,
        alignment=32,
        header_end=0,
        data_offset=0,
    )
