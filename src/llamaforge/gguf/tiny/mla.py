"""Tiny random-weight DeepSeek-V2-style models with MLA (multi-head latent attention) for llama.cpp b11312.

MLA compresses the keys and values of a token into one latent row of ``kv_lora_rank`` values plus the
``rope_dim`` RoPE part of the key; llama.cpp caches that row only (K: ``head_count_kv = 1`` x ``key_length =
kv_lora_rank + rope_dim`` values per cell, no V, with and without flash attention). The file is written the way
``convert_hf_to_gguf.py`` writes DeepSeek-V2 with MLA: ``key_length``/``value_length`` are the latent sizes, the
per-head sizes are ``key_length_mla = qk_nope + rope_dim`` and ``value_length_mla``, and the decompression is split
into ``attn_k_b`` / ``attn_v_b`` (``src/models/deepseek2.cpp``: ``is_mla``). Every layer is dense
(``leading_dense_block_count = n_layer``), the query unprojected (``q_lora_rank = 0``), so no expert is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

from llamaforge.gguf.tiny.file import DType, TinyModelInfo, write_noise_model

__all__ = ["TinyMLASpec", "write_tiny_mla_model"]

_ARCH = "deepseek2"


@dataclass(frozen=True)
class TinyMLASpec:
    """Shape of a tiny DeepSeek-V2 (MLA) model; equal specs give byte-identical files."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    kv_lora_rank: int = 64
    qk_nope_dim: int = 32
    rope_dim: int = 16
    v_head_dim: int = 32
    context_length: int = 4096
    seed: int = 0
    dtype: DType = "f16"

    def __post_init__(self) -> None:
        for name in (
            "n_layer",
            "n_embd",
            "n_head",
            "n_ff",
            "kv_lora_rank",
            "qk_nope_dim",
            "rope_dim",
            "v_head_dim",
            "context_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if self.rope_dim % 2:
            raise ValueError(f"rope_dim must be even, not {self.rope_dim}")

    @property
    def arch(self) -> str:
        """The GGUF architecture."""
        return _ARCH

    @property
    def key_length(self) -> int:
        """Values per cached K row: the latent plus the RoPE part (what llama.cpp caches per cell and layer)."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def default_name(self) -> str:
        """The ``general.name`` written into the file."""
        return f"tiny-{_ARCH}-mla-{self.n_layer}L-{self.n_embd}d-seed{self.seed}"


def _hparams(w: gguf.GGUFWriter, s: TinyMLASpec) -> None:
    w.add_context_length(s.context_length)
    w.add_block_count(s.n_layer)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(1)
    w.add_key_length(s.key_length)
    w.add_value_length(s.kv_lora_rank)
    w.add_key_length_mla(s.qk_nope_dim + s.rope_dim)
    w.add_value_length_mla(s.v_head_dim)
    w.add_rope_dimension_count(s.rope_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_leading_dense_block_count(s.n_layer)
    w.add_q_lora_rank(0)
    w.add_kv_lora_rank(s.kv_lora_rank)
    w.add_expert_feed_forward_length(s.n_ff)
    w.add_expert_shared_count(0)


def _shapes(s: TinyMLASpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in file order; numpy shapes are ggml's ``ne`` reversed."""
    k_mla = s.qk_nope_dim + s.rope_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, s.n_embd))]
    for il in range(s.n_layer):
        p = f"blk.{il}."
        shapes += [
            (p + "attn_norm.weight", (s.n_embd,)),
            (p + "attn_q.weight", (s.n_head * k_mla, s.n_embd)),
            (p + "attn_kv_a_mqa.weight", (s.key_length, s.n_embd)),
            (p + "attn_kv_a_norm.weight", (s.kv_lora_rank,)),
            (p + "attn_k_b.weight", (s.n_head, s.kv_lora_rank, s.qk_nope_dim)),
            (p + "attn_v_b.weight", (s.n_head, s.v_head_dim, s.kv_lora_rank)),
            (p + "attn_output.weight", (s.n_embd, s.n_head * s.v_head_dim)),
            (p + "ffn_norm.weight", (s.n_embd,)),
            (p + "ffn_gate.weight", (s.n_ff, s.n_embd)),
            (p + "ffn_up.weight", (s.n_ff, s.n_embd)),
            (p + "ffn_down.weight", (s.n_embd, s.n_ff)),
        ]
    shapes += [("output_norm.weight", (s.n_embd,)), ("output.weight", (n_vocab, s.n_embd))]
    return shapes


def write_tiny_mla_model(path: Path, spec: TinyMLASpec, vocab_gguf: Path) -> TinyModelInfo:
    """Write the tiny MLA model ``spec`` to ``path`` with the tokenizer of ``vocab_gguf`` (atomically)."""
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
