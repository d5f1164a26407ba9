"""One entry point for every tiny-model writer: the transformer families of :mod:`llamaforge.gguf.tiny`, MLA
(:mod:`llamaforge.gguf.tiny_mla`) and shared-KV Gemma 4 (:mod:`llamaforge.gguf.tiny_shared_kv`)."""

from __future__ import annotations

from pathlib import Path

from llamaforge.gguf.tiny import TinyModelInfo, TinyModelSpec, write_tiny_model
from llamaforge.gguf.tiny_mla import TinyMLASpec, write_tiny_mla_model
from llamaforge.gguf.tiny_shared_kv import TinySharedKVSpec, write_tiny_shared_kv_model

__all__ = ["AnyTinySpec", "write_any_tiny_model"]

AnyTinySpec = TinyModelSpec | TinyMLASpec | TinySharedKVSpec


def write_any_tiny_model(path: Path, spec: AnyTinySpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write ``spec`` to ``path`` with the writer of its family (see each writer)."""
    if isinstance(spec, TinyMLASpec):
        return write_tiny_mla_model(path, spec, vocab_gguf)
    if isinstance(spec, TinySharedKVSpec):
        return write_tiny_shared_kv_model(path, spec, vocab_gguf)
    return write_tiny_model(path, spec, vocab_gguf)
