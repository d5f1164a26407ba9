"""Q4_K and Q6_K encoders in numpy, for tiny models in llama-quantize's Q4_K_M mix (the ``gguf`` package decodes
these types but cannot encode them).

The byte layouts are ggml's ``block_q4_K`` and ``block_q6_K`` (ggml-common.h), read back by the ``gguf`` package's
decoders in the tests. The rounding is the plain min/max one, not llama-quantize's search for the best scales:
the weights are noise, and what matters is that llama.cpp runs its K-quant kernels (repack, AMX, dot products)
on them.
"""

from __future__ import annotations

from typing import Any, Final

import gguf
import numpy as np
import numpy.typing as npt

#: Values per super-block of every K-quant type.
QK_K: Final[int] = 256


def quantize_k(data: npt.NDArray[Any], qtype: gguf.GGMLQuantizationType) -> npt.NDArray[np.uint8]:
    """``data`` (rows whose length is a multiple of 256) as Q4_K or Q6_K blocks, in the shape
    ``gguf.quants.quantize`` returns: the rows' bytes along the last axis."""
    values = np.asarray(data, dtype=np.float32)
    if values.shape[-1] % QK_K:
        raise ValueError(f"rows of {values.shape[-1]} values are not whole {QK_K}-value blocks")
    blocks = values.reshape(-1, QK_K)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        encoded = _q4_k(blocks)
    elif qtype == gguf.GGMLQuantizationType.Q6_K:
        encoded = _q6_k(blocks)
    else:
        raise ValueError(f"no K-quant encoder for {qtype.name}")
    return encoded.reshape(*values.shape[:-1], -1)


def _f16(values: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """``values`` as the fp16 bytes a block stores, and the float32 value each one reads back as."""
    half = values.astype(np.float16)
    return half.view(np.uint8).reshape(-1, 2), half.astype(np.float32)


def _divide(
    numerator: npt.NDArray[np.float32], denominator: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """``numerator / denominator``, 0 where the denominator is 0 (an all-zero block)."""
    out = np.zeros(np.broadcast_shapes(numerator.shape, denominator.shape), dtype=np.float32)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def _q4_k(blocks: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """``block_q4_K``: d, dmin (fp16), 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of
    4-bit values; a value reads back as ``d * scale * q - dmin * min``."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 8, 32)
    lowest = np.minimum(sub.min(axis=-1), 0.0)  # a sub-block's offset is never positive
    scales = (sub.max(axis=-1) - lowest) / 15.0
    mins = -lowest
    d_bytes, d = _f16(scales.max(axis=-1) / 63.0)
    dmin_bytes, dmin = _f16(mins.max(axis=-1) / 63.0)
    sc = np.clip(np.rint(_divide(scales, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_divide(mins, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    offset = dmin[:, None] * mn
    q = np.clip(np.rint(_divide(sub + offset[..., None], step[..., None])), 0, 15).astype(np.uint8)
    packed = np.concatenate(
        [
            (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4),
        ],
        axis=1,
    )
    pairs = q.reshape(n, 4, 2, 32)  # sub-blocks 2c and 2c+1 share the bytes of chunk c
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(n, 128)
    return np.concatenate([d_bytes, dmin_bytes, packed, qs], axis=1)


def _q6_k(blocks: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """``block_q6_K``: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales for sub-blocks of 16, d
    (fp16); a value reads back as ``d * scale * (q - 32)``."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    scales = np.abs(sub).max(axis=-1) / 31.0
    d_bytes, d = _f16(scales.max(axis=-1) / 127.0)
    sc = np.clip(np.rint(_divide(scales, d[:, None])), 0, 127).astype(np.int8)
    step = d[:, None] * sc
    q = (np.clip(np.rint(_divide(sub, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(n, QK_K)
    low = (q & 0x0F).reshape(n, 2, 2, 64)  # per half of 128: values 0-63 in the low nibbles, 64-127 high
    ql = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)  # per half: four runs of 32 in bit pairs 0, 2, 4, 6
    qh = (
        high[:, :, 0, :] | (high[:, :, 1, :] << 2) | (high[:, :, 2, :] << 4) | (high[:, :, 3, :] << 6)
    ).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d_bytes], axis=1)
