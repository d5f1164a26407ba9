"""Where llama.cpp b11312 keeps a CPU-resident weight, and how many bytes it reports for it there.

A CPU module offers extra buffer types before the plain CPU buffer (``ggml_backend_cpu_get_extra_buffer_types``:
AMX first, then CPU_REPACK). ``llama_model`` puts each weight in the first one whose ``supports_op`` accepts the
op that weight is used by (``weight_buft_supported`` builds that op with an F32 batch), unless
``--no-repack`` / ``use_extra_bufts = false``:

* **AMX** (the ``sapphirerapids`` module on a CPU with AMX; ``ggml-cpu/amx/amx.cpp``): ``MUL_MAT`` weights of
  Q4_0, Q4_1, Q8_0 (rows a multiple of 32 values), Q4_K, Q5_K, Q6_K, IQ4_XS (of 256) and F16 (of 16) with a
  multiple of 32 output rows. Quantized weights are packed to VNNI tiles (``ggml_backend_amx_get_alloc_size``):
  a Q8_0 block takes 4 bytes more (its compensation), a Q4_K/Q5_K block 4, an IQ4_XS block 2.
* **CPU_REPACK** (``ggml-cpu/repack.cpp``, x86): ``MUL_MAT`` and ``MUL_MAT_ID`` (experts) weights of Q4_0,
  Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with AVX-512, with a multiple of 8 output rows; same size as in the
  file. Q8_0 and the other K-quants have no x86 repack.

What llama.cpp prints for a memory-mapped file is the mapped *range* of the tensors left in the plain CPU
buffer (``CPU_Mapped``: from the first one's offset to the last one's end, whatever lies between), plus each
extra buffer. A weight moved out of the middle of the file is thus counted twice: once in the mapped range
(pages read once while repacking, then reclaimable) and once in its extra buffer (allocated). The planner
follows llama.cpp's report, so its totals compare with the load log line for line.

:data:`CpuBuffers` names what a host's CPU module offers; :func:`host_cpu_buffers` reads it off this machine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

from llamaforge.gguf.header import TensorInfo

#: ``plain``: no extra buffer type (``--no-repack``, or a module below AVX2); ``avx2`` / ``avx512``: CPU_REPACK
#: with those kernels; ``amx``: the AMX buffer type first, then CPU_REPACK (AVX-512).
CpuBuffers = Literal["plain", "avx2", "avx512", "amx"]
CPU_BUFFERS: Final[tuple[str, ...]] = get_args(CpuBuffers)

_AMX_ROWS: Final[dict[str, int]] = {
    "Q4_0": 32,
    "Q4_1": 32,
    "Q8_0": 32,
    "Q4_K": 256,
    "Q5_K": 256,
    "Q6_K": 256,
    "IQ4_XS": 256,
    "F16": 16,
}
# Extra bytes per block of a VNNI-packed AMX weight (get_row_size in ggml-cpu/amx/mmq.cpp).
_AMX_BLOCK_EXTRA: Final[dict[str, int]] = {"Q8_0": 4, "Q4_K": 4, "Q5_K": 4, "IQ4_XS": 2}
_REPACK_AVX2: Final = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
_REPACK_AVX512: Final = _REPACK_AVX2 | {"Q2_K"}
# Matrices no matmul reads: looked up (token_embd), convolved (ssm_conv1d) or multiplied element-wise.
_NOT_MATMUL: Final = re.compile(
    r"(^token_embd|^token_types|^position_embd|ssm_conv1d|_norm|ssm_a$|ssm_d$|ssm_dt)"
)


@dataclass(frozen=True)
class Placement:
    """A CPU-resident weight's buffer type (``CPU`` = the plain, mapped buffer) and the bytes reported there."""

    buffer: str
    nbytes: int


def _matmul_op(tensor: TensorInfo) -> str | None:
    """``MUL_MAT``, ``MUL_MAT_ID`` (stacked experts) or None for a weight no matmul reads."""
    base = tensor.name.removesuffix(".weight")
    if len(tensor.shape) < 2 or not tensor.name.endswith(".weight") or _NOT_MATMUL.search(base):
        return None
    return "MUL_MAT_ID" if "_exps" in base else "MUL_MAT"


def _amx_bytes(tensor: TensorInfo) -> int | None:
    """Bytes of ``tensor`` in the AMX buffer, or None where AMX does not take it."""
    kind = tensor.ggml_type.name
    rows = _AMX_ROWS.get(kind)
    if rows is None or tensor.shape[0] % rows or tensor.shape[1] % 32:
        return None
    if kind == "F16":
        return tensor.nbytes
    blocks = tensor.n_elements // tensor.ggml_type.block_size
    return tensor.nbytes + blocks * _AMX_BLOCK_EXTRA.get(kind, 0)


def place(tensor: TensorInfo, buffers: CpuBuffers) -> Placement:
    """Where ``tensor``, kept on the CPU, lives under ``buffers``."""
    op = _matmul_op(tensor)
    if op is None or buffers == "plain":
        return Placement("CPU", tensor.nbytes)
    if buffers == "amx" and op == "MUL_MAT":
        amx = _amx_bytes(tensor)
        if amx is not None:
            return Placement("AMX", amx)
    repack = _REPACK_AVX2 if buffers == "avx2" else _REPACK_AVX512
    if tensor.ggml_type.name in repack and tensor.shape[1] % 8 == 0:
        return Placement("CPU_REPACK", tensor.nbytes)
    return Placement("CPU", tensor.nbytes)


def host_weight_buffers(tensors: Sequence[TensorInfo], buffers: CpuBuffers) -> dict[str, int]:
    """The weight buffers llama.cpp reports for ``tensors`` kept on the CPU of a memory-mapped file: the bytes
    of those left in the plain buffer plus those of moved weights lying between them in the file
    (``CPU_Mapped``), and each extra buffer type's sum. A tied output (``token_embd`` used again as the output
    matrix, listed twice) maps the same bytes in the plain buffer and takes its own in an extra one."""
    sizes: dict[str, int] = {}
    plain: list[TensorInfo] = []
    moved: list[TensorInfo] = []
    seen: set[str] = set()
    for tensor in tensors:
        placement = place(tensor, buffers)
        if placement.buffer == "CPU":
            if tensor.name not in seen:
                plain.append(tensor)
        else:
            sizes[placement.buffer] = sizes.get(placement.buffer, 0) + placement.nbytes
            moved.append(tensor)
        seen.add(tensor.name)
    if plain:
        first, last = min(t.offset for t in plain), max(t.offset + t.nbytes for t in plain)
        inside = sum(t.nbytes for t in {t.name: t for t in moved}.values() if first <= t.offset < last)
        sizes["CPU_Mapped"] = sum(t.nbytes for t in plain) + inside
    return sizes


def host_cpu_buffers(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuBuffers:
    """What this machine's best CPU module offers, read off the CPU's flags (AMX needs ``amx_int8`` with
    AVX-512 VNNI, as the sapphirerapids module does)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "plain"
    line = next((entry for entry in text.splitlines() if entry.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    if {"amx_tile", "amx_int8", "avx512_vnni", "avx512f"} <= flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "plain"
