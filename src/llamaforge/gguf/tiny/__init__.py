"""Tiny, deterministic, random-weight GGUF models of real llama.cpp architectures, one module per family.

:mod:`~llamaforge.gguf.tiny.model` writes the transformer families (qwen2, qwen3, qwen3moe, qwen35, qwen35moe,
qwen3next, gemma2, gemma3), :mod:`~llamaforge.gguf.tiny.mla` DeepSeek-V2 with MLA and
:mod:`~llamaforge.gguf.tiny.shared_kv` Gemma 4 with KV-sharing layers; all three write through
:mod:`~llamaforge.gguf.tiny.file` and name tensors through :mod:`~llamaforge.gguf.tiny.names`. This package is
the one entry point: the transformer writer's API, and :func:`write_any_tiny_model`, which picks the writer of
a spec's family.
"""

from __future__ import annotations

from pathlib import Path

from llamaforge.gguf.tiny.mla import TinyMLASpec, write_tiny_mla_model
from llamaforge.gguf.tiny.model import (
    SUPPORTED_ARCHS,
    DType,
    NameStyle,
    TensorPlanEntry,
    TinyModelInfo,
    TinyModelSpec,
    canonical_to_styled,
    noise_array,
    omitted_tensors,
    tensor_data,
    tensor_plan,
    write_gguf_file,
    write_noise_model,
    write_tiny_model,
)
from llamaforge.gguf.tiny.shared_kv import TinySharedKVSpec, write_tiny_shared_kv_model

__all__ = [
    "SUPPORTED_ARCHS",
    "AnyTinySpec",
    "DType",
    "NameStyle",
    "TensorPlanEntry",
    "TinyMLASpec",
    "TinyModelInfo",
    "TinyModelSpec",
    "TinySharedKVSpec",
    "canonical_to_styled",
    "noise_array",
    "omitted_tensors",
    "tensor_data",
    "tensor_plan",
    "write_any_tiny_model",
    "write_gguf_file",
    "write_noise_model",
    "write_tiny_model",
]

AnyTinySpec = TinyModelSpec | TinyMLASpec | TinySharedKVSpec


def write_any_tiny_model(path: Path, spec: AnyTinySpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write ``spec`` to ``path`` with the writer of its family (see each writer)."""
    if isinstance(spec, TinyMLASpec):
        return write_tiny_mla_model(path, spec, vocab_gguf)
    if isinstance(spec, TinySharedKVSpec):
        return write_tiny_shared_kv_model(path, spec, vocab_gguf)
    return write_tiny_model(path, spec, vocab_gguf)
