"""Tiny random-weight Gemma-4-style models whose last layers reuse earlier layers' KV cache, for llama.cpp b11312.

Gemma 4 (``src/models/gemma4.cpp``) gives every layer a sliding-window or a full-attention kind from the per-layer
``attention.sliding_window_pattern`` list, different head sizes to the two kinds (``key_length`` /
``key_length_swa``), and lets its last ``attention.shared_kv_layers`` layers attend the cache of the last
earlier layer of their kind instead of keeping one (``n_layer_kv_from_start``; ``llama_model::create_memory``'s
``reuse``: a sliding layer reuses layer ``n_layer_kv_from_start - 2``, a full one ``n_layer_kv_from_start - 1``,
so those two must be one sliding and one full layer). Shared layers have no K/V projections or K norm. The
output is tied to ``token_embd``; no per-layer embeddings (``embedding_length_per_layer_input = 0``), no experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf

from llamaforge.gguf.tiny.file import DType, TinyModelInfo, write_noise_model

__all__ = ["TinySharedKVSpec", "write_tiny_shared_kv_model"]

_ARCH = "gemma4"


@dataclass(frozen=True)
class TinySharedKVSpec:
    """Shape of a tiny Gemma 4 model; ``swa_pattern[i]`` says whether layer ``i`` slides."""

    swa_pattern: tuple[bool, ...] = field(default=(True, True, True, False, True, False))
    shared_kv_layers: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    head_dim_swa: int = 16
    n_ff: int = 128
    sliding_window: int = 256
    context_length: int = 8192
    seed: int = 0
    dtype: DType = "f16"

    def __post_init__(self) -> None:
        for name in (
            "n_embd",
            "n_head",
            "n_head_kv",
            "head_dim",
            "head_dim_swa",
            "n_ff",
            "sliding_window",
            "context_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        first = self.n_layer_kv
        if not 2 <= first <= self.n_layer:
            raise ValueError(
                f"shared_kv_layers ({self.shared_kv_layers}) must leave at least 2 layers with a cache"
            )
        if self.shared_kv_layers and not (self.swa_pattern[first - 2] and not self.swa_pattern[first - 1]):
            raise ValueError(
                f"layers {first - 2} and {first - 1} (the ones shared layers reuse) must be sliding and full"
            )

    @property
    def arch(self) -> str:
        """The GGUF architecture."""
        return _ARCH

    @property
    def n_layer(self) -> int:
        """Layers (the length of the pattern)."""
        return len(self.swa_pattern)

    @property
    def n_layer_kv(self) -> int:
        """Layers with a cache of their own (the first ones)."""
        return self.n_layer - self.shared_kv_layers

    @property
    def default_name(self) -> str:
        """The ``general.name`` written into the file."""
        return f"tiny-{_ARCH}-{self.n_layer}L-{self.shared_kv_layers}shared-{self.n_embd}d-seed{self.seed}"


def _hparams(w: gguf.GGUFWriter, s: TinySharedKVSpec) -> None:
    w.add_context_length(s.context_length)
    w.add_block_count(s.n_layer)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_key_length_swa(s.head_dim_swa)
    w.add_value_length_swa(s.head_dim_swa)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_dimension_count_swa(s.head_dim_swa)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(s.sliding_window)
    w.add_sliding_window_pattern(list(s.swa_pattern))
    w.add_shared_kv_layers(s.shared_kv_layers)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(30.0)


def _shapes(s: TinySharedKVSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in file order; numpy shapes are ggml's ``ne`` reversed."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, s.n_embd))]
    shapes.append(("rope_freqs.weight", (s.head_dim // 2,)))  # proportional RoPE of the full layers
    for il, sliding in enumerate(s.swa_pattern):
        p, hd = f"blk.{il}.", s.head_dim_swa if sliding else s.head_dim
        own_kv = il < s.n_layer_kv
        shapes += [(p + "attn_norm.weight", (s.n_embd,)), (p + "attn_q.weight", (s.n_head * hd, s.n_embd))]
        if own_kv:
            shapes += [
                (p + "attn_k.weight", (s.n_head_kv * hd, s.n_embd)),
                (p + "attn_v.weight", (s.n_head_kv * hd, s.n_embd)),
            ]
        shapes += [(p + "attn_output.weight", (s.n_embd, s.n_head * hd)), (p + "attn_q_norm.weight", (hd,))]
        if own_kv:
            shapes.append((p + "attn_k_norm.weight", (hd,)))
        shapes += [
            (p + "post_attention_norm.weight", (s.n_embd,)),
            (p + "ffn_norm.weight", (s.n_embd,)),
            (p + "ffn_gate.weight", (s.n_ff, s.n_embd)),
            (p + "ffn_up.weight", (s.n_ff, s.n_embd)),
            (p + "ffn_down.weight", (s.n_embd, s.n_ff)),
            (p + "post_ffw_norm.weight", (s.n_embd,)),
        ]
    shapes.append(("output_norm.weight", (s.n_embd,)))
    return shapes


def write_tiny_shared_kv_model(path: Path, spec: TinySharedKVSpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write the tiny Gemma 4 model ``spec`` to ``path`` with the tokenizer of ``vocab_gguf`` (atomically)."""
    return write_noise_model(
        Path(path),
        _ARCH,
        spec.default_name,
        spec.dtype,
        spec.seed,
        lambda w: _hparams(w, spec),
        lambda n_vocab: _shapes(spec, n_vocab),
        vocab_gguf,
    )
