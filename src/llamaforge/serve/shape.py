"""A model as the planners see it: hyper-parameters from the GGUF header, weights summed per layer and kind.

Shared by the fit planner (:mod:`llamaforge.serve.fit`) and the bytes-per-token definition
(:mod:`llamaforge.serve.bandwidth`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from llamaforge.core.errors import InvalidOption
from llamaforge.gguf.header import GGML_TYPES, GGUFHeader, TensorInfo

__all__ = [
    "HYBRID_ARCHS",
    "MLA_ARCHS",
    "SHARED_KV_ARCHS",
    "SWA_ARCHS",
    "ModelShape",
    "WeightLayout",
    "block_of",
    "gpu_layers",
    "is_expert_tensor",
    "model_shape",
    "row_bytes",
    "weight_layout",
]

#: Hybrid (recurrent + attention) archs whose layer kinds follow ``full_attention_interval``.
HYBRID_ARCHS: Final = frozenset({"qwen3next", "qwen35", "qwen35moe"})
#: Archs with sliding-window attention layers in llama.cpp b11312 (``src/models/<arch>.cpp``): the default
#: per-layer pattern ``(n_pattern, dense_first)`` of ``load_swa_pattern`` and the window used when the header
#: has no ``{arch}.attention.sliding_window`` (None: no window key, no SWA). A layer slides when
#: ``il % n_pattern < n_pattern - 1`` (``dense_first``: when ``il % n_pattern != 0``); a
#: ``{arch}.attention.sliding_window_pattern`` key overrides the pattern (a number) or lists the layers (bools).
SWA_ARCHS: Final[dict[str, tuple[int, bool, int | None]]] = {
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, None),
    "cohere2": (4, False, None),
    "olmo2": (4, False, None),
    "gpt-oss": (2, False, None),
    "gemma3n": (5, False, None),
    "gemma4": (0, False, None),  # the pattern is a required per-layer list (sliding_window_pattern)
}
#: Archs whose last layers reuse the KV cache of an earlier one (``n_layer_kv_from_start`` in
#: ``llama_hparams::has_kv``): gemma3n's first 20 layers hold a cache; gemma4's all but the last
#: ``{arch}.attention.shared_kv_layers``. A layer past them attends the cache of the last layer of its own kind.
SHARED_KV_ARCHS: Final = frozenset({"gemma3n", "gemma4"})
#: Archs with MLA (compressed) attention when the header has ``attention.key_length_mla``: the cache holds one
#: K row of ``key_length`` (kv_lora_rank + the RoPE dims) per cell and no V (V is a view of K), with and
#: without flash attention (``llama_kv_cache``: ``has_v = !is_mla``). Other archs of that release read the MLA keys too
#: (deepseek32 and glm-dsa add an indexer cache, kimi-linear is hybrid, bailingmoe3, dots3note, glm5-next, hy_v4,
#: kimi-k3): not modelled, their KV is planned as for full attention.
MLA_ARCHS: Final = frozenset({"deepseek2"})
_EXPERT_RE: Final = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_BLOCK_RE: Final = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters the planner needs, read from the header."""

    arch: str
    n_layer_all: int  # block_count, MTP layers included (llama.cpp places layers over all of them)
    n_layer: int  # trunk layers
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    recurrent: tuple[bool, ...]  # per trunk layer
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0
    ssm_group_count: int = 0
    ssm_inner_size: int = 0
    swa: tuple[bool, ...] = ()  # per trunk layer: sliding-window attention (empty: none)
    n_swa: int = 0  # the window, in tokens
    head_dim_k_swa: int = 0  # head sizes of the sliding-window layers (0: as the full layers)
    head_dim_v_swa: int = 0
    kv_heads: tuple[int, ...] = ()  # per-layer KV heads when the header lists them (empty: n_head_kv)
    n_layer_kv: int = -1  # layers 0..n_layer_kv-1 hold a KV cache, the others reuse one (-1: all hold one)
    mla: bool = False  # compressed (MLA) attention: K rows only
    head_dim_k_mla: int = 0  # MLA per-head sizes: qk_nope + RoPE dims, and the value head
    head_dim_v_mla: int = 0

    def has_kv(self, il: int) -> bool:
        """True when trunk layer ``il`` holds a KV cache of its own (``llama_hparams::has_kv``)."""
        return self.n_layer_kv < 0 or il < self.n_layer_kv

    def kv_widths(self, il: int) -> tuple[int, int]:
        """Values per cell of layer ``il``'s K and V rows (V is 0 with MLA)."""
        heads = self.kv_heads[il] if il < len(self.kv_heads) else self.n_head_kv
        swa = self.is_swa(il)
        k = (self.head_dim_k_swa if swa and self.head_dim_k_swa else self.head_dim_k) * heads
        v = (self.head_dim_v_swa if swa and self.head_dim_v_swa else self.head_dim_v) * heads
        return k, 0 if self.mla else v

    def is_swa(self, il: int) -> bool:
        """True when trunk layer ``il`` attends through a sliding window (its KV cache is window-sized)."""
        return il < len(self.swa) and self.swa[il]

    @property
    def attention_layers(self) -> list[int]:
        """Trunk layers with a KV cache."""
        return [il for il in range(self.n_layer) if not self.recurrent[il]]

    @property
    def recurrent_layers(self) -> list[int]:
        """Trunk layers with a recurrent (DeltaNet) state."""
        return [il for il in range(self.n_layer) if self.recurrent[il]]

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.n_expert > 0

    @property
    def conv_state_values(self) -> int:
        """F32 values of one recurrent layer's conv state per sequence (``n_embd_r``)."""
        return max(self.ssm_conv_kernel - 1, 0) * (
            self.ssm_inner_size + 2 * self.ssm_group_count * self.ssm_state_size
        )

    @property
    def ssm_state_values(self) -> int:
        """F32 values of one recurrent layer's DeltaNet state per sequence (``n_embd_s``)."""
        return self.ssm_state_size * self.ssm_inner_size


class MissingHyperParameters(InvalidOption):
    """The planner's basic keys (blocks, width, attention heads) are absent or 0: no model it can plan, though
    an architecture without attention heads (mamba, rwkv) is none llama.cpp refuses for that."""


#: The largest count llama.cpp reads: it reads these keys into 32-bit fields.
MAX_COUNT: Final = 2**31 - 1


def _int(value: Any, default: int = 0, name: str = "") -> int:
    """A count from metadata (the largest of an array: per-layer values); a value that is no whole, finite,
    non-negative number llama.cpp could read is refused naming ``name``."""
    if value is None:
        return default
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items:
        return default
    for item in items:
        whole = isinstance(item, int | float) and math.isfinite(item) and item == int(item)
        if not whole or not 0 <= item <= MAX_COUNT:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise InvalidOption(
                f"{name} is {shown}, not a count llama.cpp can read",
                hint="the file's metadata is damaged or was not written for llama.cpp; `invoke models.verify "
                "FILE` checks it",
            )
    return max(int(item) for item in items)


def model_shape(header: GGUFHeader) -> ModelShape:
    """Read the planner's hyper-parameters from ``header`` (raises InvalidOption when they are missing)."""
    meta = header.metadata
    arch = header.architecture
    if not arch:
        raise InvalidOption(f"{header.source}: no general.architecture; is it a model GGUF?")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    def count(name: str, default: int = 0) -> int:
        return _int(key(name), default, f"{header.source}: {arch}.{name}")

    n_layer_all = count("block_count")
    n_embd = count("embedding_length")
    n_head = count("attention.head_count")
    needed = {"block_count": n_layer_all, "embedding_length": n_embd, "attention.head_count": n_head}
    if absent := [f"{arch}.{name}" for name, value in needed.items() if not value]:
        raise MissingHyperParameters(f"{header.source}: {', '.join(absent)} missing or 0")
    blocks = [block for tensor in header.tensors if (block := block_of(tensor.name)) is not None]
    if header.tensors and n_layer_all > max(blocks, default=-1) + 1:  # before any per-layer list is sized
        raise InvalidOption(
            f"{header.source}: {arch}.block_count is {n_layer_all}, but the file's tensors stop at "
            + (f"blk.{max(blocks)}" if blocks else "no block"),
            hint="the file's metadata is damaged or does not belong to its tensors; `invoke models.verify FILE` "
            "checks it",
        )
    _check_loader_limits(header, arch, n_layer_all, key)
    nextn = count("nextn_predict_layers")
    if nextn >= n_layer_all:
        raise InvalidOption(
            f"{header.source}: {arch}.nextn_predict_layers ({nextn}) leaves none of its {n_layer_all} blocks",
            hint="the file's metadata is damaged; `invoke models.verify FILE` checks it",
        )
    n_layer = n_layer_all - nextn
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    n_vocab = embd.shape[1] if embd is not None and len(embd.shape) > 1 else count("vocab_size")
    recurrent = [False] * n_layer
    if arch in HYBRID_ARCHS:
        listed = key("attention.recurrent_layers")
        if isinstance(listed, list | tuple) and len(listed) >= n_layer:
            recurrent = [bool(v) for v in listed[:n_layer]]
        else:
            interval = count("full_attention_interval", 4) or 4
            recurrent = [(il + 1) % interval != 0 for il in range(n_layer)]
    head_dim_k = count("attention.key_length", n_embd // n_head)
    swa, n_swa = _sliding_window(arch, n_layer, key)
    # llama.cpp's head_count_kv defaults to head_count, layer by layer
    kv_name = "attention.head_count" if key("attention.head_count_kv") is None else "attention.head_count_kv"
    heads_kv = key(kv_name)
    where = f"{header.source}: {arch}.{kv_name}"
    kv_heads = (
        tuple(_int(v, 0, where) for v in heads_kv[:n_layer]) if isinstance(heads_kv, list | tuple) else ()
    )
    n_layer_kv = -1
    if arch == "gemma3n":
        n_layer_kv = 20
    elif arch == "gemma4":
        n_layer_kv = n_layer_all - count("attention.shared_kv_layers")
    return ModelShape(
        arch=arch,
        n_layer_all=n_layer_all,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=count("attention.head_count_kv", n_head),
        head_dim_k=head_dim_k,
        head_dim_v=count("attention.value_length", head_dim_k),
        n_ff=count("feed_forward_length"),
        n_vocab=n_vocab,
        n_ctx_train=count("context_length"),
        n_expert=count("expert_count"),
        n_expert_used=count("expert_used_count"),
        n_ff_exp=count("expert_feed_forward_length"),
        n_ff_shexp=count("expert_shared_feed_forward_length"),
        recurrent=tuple(recurrent),
        ssm_conv_kernel=count("ssm.conv_kernel"),
        ssm_state_size=count("ssm.state_size"),
        ssm_group_count=count("ssm.group_count"),
        ssm_inner_size=count("ssm.inner_size"),
        swa=swa,
        n_swa=n_swa,
        head_dim_k_swa=count("attention.key_length_swa"),
        head_dim_v_swa=count("attention.value_length_swa"),
        kv_heads=kv_heads,
        n_layer_kv=n_layer_kv,
        mla=arch in MLA_ARCHS and count("attention.key_length_mla") > 0,
        head_dim_k_mla=count("attention.key_length_mla"),
        head_dim_v_mla=count("attention.value_length_mla"),
    )


# What llama.cpp's loader asserts or throws on while it reads the hyper-parameters (llama-model.cpp
# load_hparams, llama-model-loader.cpp get_key_or_arr; llama-hparams.h): the process aborts or the load fails.
MAX_LAYERS: Final = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS: Final = 1024  # LLAMA_MAX_EXPERTS
# The keys read per layer (one value, or an array of exactly block_count values).
PER_LAYER_KEYS: Final = (
    "expert_used_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
)
_DAMAGED = (
    "the file's metadata is damaged or was not written for llama.cpp; `invoke models.verify FILE` checks it"
)


def _check_loader_limits(header: GGUFHeader, arch: str, n_layer_all: int, key: Callable[..., Any]) -> None:
    """Refuse (InvalidOption) what llama.cpp's loader refuses in the counts it reads first: more blocks than it
    holds, a per-layer array of another length than block_count, more experts than it holds, or experts used
    that the expert count does not allow."""
    where = f"{header.source}: {arch}"
    if n_layer_all > MAX_LAYERS:
        raise InvalidOption(
            f"{where}.block_count is {n_layer_all}: llama.cpp loads at most {MAX_LAYERS} blocks (LLAMA_MAX_LAYERS)",
            hint=_DAMAGED,
        )
    for name in PER_LAYER_KEYS:
        value = key(name)
        if isinstance(value, list | tuple) and len(value) != n_layer_all:
            raise InvalidOption(
                f"{where}.{name} has {len(value)} values, one per layer, but block_count is {n_layer_all}: "
                "llama.cpp refuses the file (wrong array length)",
                hint=_DAMAGED,
            )
    n_expert = _int(key("expert_count"), 0, f"{where}.expert_count")
    used = _int(key("expert_used_count"), 0, f"{where}.expert_used_count")  # the largest of a per-layer array
    if n_expert > MAX_EXPERTS:
        raise InvalidOption(
            f"{where}.expert_count is {n_expert}: llama.cpp holds at most {MAX_EXPERTS} (LLAMA_MAX_EXPERTS)",
            hint=_DAMAGED,
        )
    if used > n_expert or (n_expert > 1 and not used):  # hunyuan reads one expert as none
        problem = (
            f"uses {used} of {n_expert} experts"
            if n_expert
            else f"uses {used} experts but has none (no expert_count)"
        )
        raise InvalidOption(
            f"{where}.expert_used_count: the model {problem}; llama.cpp's loader aborts on it",
            hint=_DAMAGED,
        )


def _sliding_window(arch: str, n_layer: int, key: Callable[..., Any]) -> tuple[tuple[bool, ...], int]:
    """The sliding-window layers and the window, as llama.cpp's ``load_swa_pattern`` reads them (see
    :data:`SWA_ARCHS`)."""
    if arch not in SWA_ARCHS:
        return (), 0
    n_pattern, dense_first, default_window = SWA_ARCHS[arch]
    window = key("attention.sliding_window")
    n_swa = _int(window, default_window or 0, f"{arch}.attention.sliding_window")
    if n_swa <= 0:
        return (), 0
    pattern = key("attention.sliding_window_pattern")
    if isinstance(pattern, list | tuple) and len(pattern) >= n_layer:
        return tuple(bool(v) for v in pattern[:n_layer]), n_swa
    if pattern is not None:
        n_pattern = _int(pattern, n_pattern, f"{arch}.attention.sliding_window_pattern")
    if dense_first:
        swa = [n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer)]
    else:
        swa = [n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer)]
    return tuple(swa), n_swa


def block_of(name: str) -> int | None:
    """The block (layer) number of a ``blk.N.…`` tensor, or None for a global tensor."""
    match = _BLOCK_RE.match(name)
    return int(match.group(1)) if match else None


def is_expert_tensor(name: str) -> bool:
    """True for the stacked routed-expert tensors ``--n-cpu-moe`` moves (``blk.N.ffn_up_exps.weight`` ...)."""
    return _EXPERT_RE.search(name) is not None


@dataclass(frozen=True)
class WeightLayout:
    """Per-layer byte sums of a model, precomputed once so the search is cheap."""

    dense: list[int]  # non-expert weights per block
    experts: list[int]  # expert weights per block
    largest_dense: list[int]
    largest_expert: list[int]
    token_embd: int
    output: int  # output + output_norm
    other: int  # other global tensors (rope_freqs ...), placed with the output
    tied: bool  # no output.weight: llama.cpp duplicates token_embd for the output layer


def weight_layout(shape: ModelShape, tensors: Sequence[TensorInfo]) -> WeightLayout:
    """Sum ``tensors`` per layer and kind (MTP layers left out: llama.cpp runs them only for MTP)."""
    n = shape.n_layer_all
    dense, experts, largest_dense, largest_expert = [0] * n, [0] * n, [0] * n, [0] * n
    token_embd = output = other = 0
    has_output = any(t.name == "output.weight" for t in tensors)
    for tensor in tensors:
        il = block_of(tensor.name)
        if il is not None and il < n:
            if il >= shape.n_layer:
                continue  # MTP (nextn) layers: llama.cpp skips them unless MTP is loaded
            if is_expert_tensor(tensor.name):
                experts[il] += tensor.nbytes
                largest_expert[il] = max(largest_expert[il], tensor.nbytes)
            else:
                dense[il] += tensor.nbytes
                largest_dense[il] = max(largest_dense[il], tensor.nbytes)
        elif tensor.name == "token_embd.weight":
            token_embd = tensor.nbytes
        elif tensor.name.startswith(("output.", "output_norm.")):
            output += tensor.nbytes
        else:
            other += tensor.nbytes
    return WeightLayout(
        dense, experts, largest_dense, largest_expert, token_embd, output, other, not has_output
    )


def gpu_layers(shape: ModelShape, ngl: int) -> tuple[set[int], bool]:
    """The layers ``-ngl ngl`` puts on the GPU (the last ``ngl - 1`` of all blocks), and whether the output
    layer is there too (``ngl >= 1``); ``i_gpu_start = n_layer + 1 - ngl`` in llama.cpp's load_tensors."""
    start = max(shape.n_layer_all + 1 - ngl, 0)
    return {il for il in range(shape.n_layer_all) if il >= start}, ngl >= 1


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of ``n`` values of ggml type ``type_name`` (``"f16"``, ``"q8_0"`` …)."""
    ggml_type = next(t for t in GGML_TYPES.values() if t.name.lower() == type_name.lower())
    return n // ggml_type.block_size * ggml_type.type_size
