"""Writing a tiny model's GGUF file: the tokenizer copied from a tokenizer-only GGUF, deterministic noise
weights, and an atomic write (temporary file, fsync, rename); shared by every tiny-model writer
(:mod:`~llamaforge.gguf.tiny.model`, :mod:`~llamaforge.gguf.tiny.mla`, :mod:`~llamaforge.gguf.tiny.shared_kv`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import gguf
import numpy as np
import numpy.typing as npt

from llamaforge.gguf.tiny.kquants import QK_K, quantize_k
from llamaforge.gguf.tiny.names import NameStyle

#: How the matrices are stored. ``q8_0`` and ``q4_0`` quantize (with the ``gguf`` package's numpy quantizer)
#: every matrix whose rows are whole 32-value blocks, as llama-quantize would; the others stay F16. ``q4_k_m`` is
#: llama-quantize's Q4_K_M mix (with :mod:`~llamaforge.gguf.tiny.kquants`): Q6_K for ``output``, ``attn_v`` and
#: ``ffn_down`` (every layer of a model of up to 8 layers gets the extra bits there), Q4_K for the other
#: matrices, and Q5_0 for a matrix whose rows are not whole 256-value super-blocks, llama-quantize's fallback.
#: 1-D tensors are F32 in every case. Quantized files reach the CPU's repack, AMX and quantized dot-product
#: kernels, which an F16 file never does; ``q4_k_m`` reaches the K-quant ones, those of most published GGUFs.
DType = Literal["f16", "f32", "q8_0", "q4_0", "q4_k_m"]

_QUANT_TYPES: Final[dict[str, gguf.GGMLQuantizationType]] = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_k_m": gguf.GGMLQuantizationType.Q4_K,
}
_FILE_TYPES: Final[dict[str, gguf.LlamaFileType]] = {
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "f32": gguf.LlamaFileType.ALL_F32,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}
#: The layer matrices Q4_K_M gives more bits (by their canonical names' endings), besides ``output.weight``.
_Q6_K_LAYER_MATRICES: Final[tuple[str, ...]] = ("attn_v.weight", "ffn_down.weight")

#: Standard deviation of the random matrices (keeps activations small and finite).
WEIGHT_SCALE: Final[float] = 0.02

_HASH_CHUNK: Final[int] = 1 << 20


@dataclass(frozen=True)
class TinyModelInfo:
    """What :func:`write_tiny_model` wrote."""

    path: Path
    sha256: str
    size: int
    tensor_count: int
    arch: str
    name_style: NameStyle
    n_vocab: int
    tensor_names: tuple[str, ...] = field(default=(), repr=False)


def noise_array(
    seed: int, canonical: str, shape: tuple[int, ...], dtype: np.dtype[Any], *, negative: bool = False
) -> npt.NDArray[Any]:
    """``noise`` (``1 + noise`` for 1-D tensors, negated with ``negative``) from an RNG seeded by ``seed`` and
    the tensor's canonical name: the weights of every tiny-model writer."""
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()
    seq = np.random.SeedSequence([seed, int.from_bytes(digest[:8], "little")])
    rng = np.random.default_rng(seq)
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(WEIGHT_SCALE)
    if len(shape) == 1:
        values += np.float32(1.0)
    if negative:
        values = -values
    return np.ascontiguousarray(values.astype(dtype))


def matrix_dtype(dtype: DType) -> np.dtype[Any]:
    """The numpy dtype the noise of a matrix is drawn in: F32 for ``f32``, F16 otherwise (the quantized types
    quantize the F16 matrices when written; tensors llama.cpp wants in F32 are drawn in F32 and stay so)."""
    return np.dtype(np.float32 if dtype == "f32" else np.float16)


def _encoded(
    name: str, data: npt.NDArray[Any], dtype: DType
) -> tuple[npt.NDArray[Any], gguf.GGMLQuantizationType | None]:
    """Tensor ``name``'s ``data`` as written for a file of ``dtype``: quantized bytes and their type, or the array
    as it is."""
    qtype = _QUANT_TYPES.get(dtype)
    if qtype is None or data.ndim < 2 or data.dtype != np.float16:
        return data, None
    if dtype == "q4_k_m" and data.shape[-1] % QK_K == 0:
        if name == "output.weight" or name.endswith(_Q6_K_LAYER_MATRICES):
            qtype = gguf.GGMLQuantizationType.Q6_K
        return quantize_k(data, qtype), qtype
    if dtype == "q4_k_m":
        qtype = gguf.GGMLQuantizationType.Q5_0
    if data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        return data, None
    return gguf.quants.quantize(data.astype(np.float32), qtype), qtype


# ----------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class _KV:
    key: str
    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None


def load_tokenizer(vocab_gguf: Path) -> tuple[tuple[_KV, ...], int]:
    st = vocab_gguf.stat()
    return _load_tokenizer_cached(str(vocab_gguf.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _load_tokenizer_cached(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[_KV, ...], int]:
    reader = gguf.GGUFReader(path)
    kvs: list[_KV] = []
    n_vocab = 0
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = fld.types[0]
        sub_type: gguf.GGUFValueType | None = None
        value: Any = fld.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub_type = fld.types[-1]
            if len(fld.types) != 2:
                raise ValueError(f"{path}: nested array {key!r} is not supported")
            value = tuple(value)
        kvs.append(_KV(key=key, value=value, vtype=vtype, sub_type=sub_type))
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if n_vocab == 0:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens array; not a tokenizer GGUF?")
    return tuple(kvs), n_vocab


# -------------------------------------------------------------------------- writer


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_gguf_file(
    path: Path,
    arch: str,
    name: str,
    dtype: DType,
    write_hparams: Callable[[gguf.GGUFWriter], None],
    tokenizer_kvs: Iterable[_KV],
    tensors: Iterable[tuple[str, npt.NDArray[Any]]],
) -> TinyModelInfo:
    """Write a tiny model's GGUF (general keys, the arch's keys, the tokenizer, the tensors) to a temporary file
    beside ``path`` and rename it over ``path`` atomically; shared by every tiny-model writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    names: list[str] = []
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            writer.add_type(gguf.GGUFType.MODEL)
            writer.add_name(name)
            writer.add_description(
                "tiny random-weight test model written by llamaforge.gguf.tiny; not trained"
            )
            writer.add_file_type(_FILE_TYPES[dtype])
            write_hparams(writer)
            for kv in tokenizer_kvs:
                writer.add_key_value(kv.key, kv.value, kv.vtype, sub_type=kv.sub_type)
            for tensor_name, data in tensors:
                encoded, qtype = _encoded(tensor_name, data, dtype)
                writer.add_tensor(tensor_name, encoded, raw_dtype=qtype)
                names.append(tensor_name)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        tmp.chmod(0o644)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return TinyModelInfo(
        path=path,
        sha256=_file_sha256(path),
        size=path.stat().st_size,
        tensor_count=len(names),
        arch=arch,
        name_style="canonical",
        n_vocab=0,
        tensor_names=tuple(names),
    )


Shapes = Callable[[int], Iterable[tuple[str, tuple[int, ...]]]]


def write_noise_model(
    path: Path,
    arch: str,
    name: str,
    dtype: DType,
    seed: int,
    write_hparams: Callable[[gguf.GGUFWriter], None],
    shapes: Shapes,
    vocab_gguf: Path,
) -> TinyModelInfo:
    """Write a model whose tensors are ``shapes(n_vocab)`` (name and numpy shape, in file order) filled with
    :func:`noise_array` (F32 for 1-D tensors, ``dtype`` for the rest), with the tokenizer of ``vocab_gguf``:
    the writers of the families laid out by hand (``mla``, ``shared_kv``)."""
    tokenizer_kvs, n_vocab = load_tokenizer(Path(vocab_gguf))
    matrix = matrix_dtype(dtype)
    vector: np.dtype[Any] = np.dtype(np.float32)
    tensors = (
        (tensor, noise_array(seed, tensor, shape, vector if len(shape) == 1 else matrix))
        for tensor, shape in shapes(n_vocab)
    )
    info = write_gguf_file(Path(path), arch, name, dtype, write_hparams, tokenizer_kvs, tensors)
    return dataclasses.replace(info, n_vocab=n_vocab)
