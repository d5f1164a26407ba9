"""What a GGUF holds, read from its header only: ``models.inspect`` and the facts ``models.verify`` judges.

A local file is read directly; a remote one (``https://``, ``http://``, ``hf://``) through HTTP range requests
that fetch a growing prefix of the file until the header parses (:mod:`llamaforge.models.remote`), so users can
plan before downloading gigabytes. Everything goes through the hardened :mod:`llamaforge.gguf.header` parser.
"""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Any, Final, Literal

from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.gguf.header import ArraySummary, GGUFHeader, LongString, TensorInfo, read_header
from llamaforge.models.file_types import GUESSED_FILE_TYPE
from llamaforge.models.remote import HttpRangeSource, resolve_remote_url

LayerKind = Literal["attention", "recurrent", "mtp"]

# Hybrid archs (Gated DeltaNet + full attention); llama.cpp's default interval when the key is absent.
HYBRID_ARCHS: Final = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_DEFAULT_FULL_ATTENTION_INTERVAL: Final = 4


# ------------------------------------------------------------------------------------------------- facts


def file_type_name(value: object) -> str | None:
    """``general.file_type`` as a name (``Q4_K_M``, ``F16``), or None when absent or unknown."""
    import gguf

    if isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        name = str(gguf.LlamaFileType(value).name)
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def quant_histogram(tensors: list[TensorInfo]) -> dict[str, dict[str, int]]:
    """Tensors per ggml type: count, bytes and elements, largest share first."""
    histogram: dict[str, dict[str, int]] = {}
    for tensor in tensors:
        entry = histogram.setdefault(tensor.ggml_type.name, {"count": 0, "bytes": 0, "elements": 0})
        entry["count"] += 1
        entry["bytes"] += tensor.nbytes
        entry["elements"] += tensor.n_elements
    return dict(sorted(histogram.items(), key=lambda item: (-item[1]["bytes"], item[0])))


def dominant_type(tensors: list[TensorInfo]) -> str | None:
    """The tensor type that holds the most bytes (ties: the first name in order); None without tensors.

    This is what the file mostly is: a Q4_K file keeps many small F32 norms, which outnumber its weights."""
    histogram = quant_histogram(tensors)
    return next(iter(histogram), None)


def _most_tensors_type(tensors: list[TensorInfo]) -> str | None:
    """The most common tensor type, counted as llama.cpp does when a file has no general.file_type (by tensor,
    in name order; first max wins)."""
    counts: dict[str, int] = {}
    best, best_count = None, 0
    for tensor in sorted(tensors, key=lambda t: t.name):
        counts[tensor.ggml_type.name] = counts.get(tensor.ggml_type.name, 0) + 1
        if counts[tensor.ggml_type.name] > best_count:
            best, best_count = tensor.ggml_type.name, counts[tensor.ggml_type.name]
    return best


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_LISTED_BLOCKS: Final = 4096  # attention blocks listed in a report: far more than any model has


def layer_kinds(header: GGUFHeader) -> list[LayerKind]:
    """Kind of every block: ``attention`` (holds a KV cache), ``recurrent`` (Gated DeltaNet state) or ``mtp``
    (multi-token-prediction blocks at the end, counted in ``block_count``)."""
    arch = header.architecture or ""
    md = header.metadata
    n_layer = _int(md.get(f"{arch}.block_count")) or 0
    n_layer = min(n_layer, 1 << 16)  # a corrupt count must not make a huge list
    n_mtp = min(_int(md.get(f"{arch}.nextn_predict_layers")) or 0, n_layer)
    n_trunk = n_layer - n_mtp
    kinds: list[LayerKind] = []
    explicit = md.get(f"{arch}.attention.recurrent_layers")
    interval = _int(md.get(f"{arch}.full_attention_interval"))
    hybrid = arch in HYBRID_ARCHS or interval is not None or isinstance(explicit, list)
    if interval is None or interval <= 0:
        interval = _DEFAULT_FULL_ATTENTION_INTERVAL
    for index in range(n_layer):
        if index >= n_trunk:
            kinds.append("mtp")
        elif isinstance(explicit, list) and index < len(explicit):
            kinds.append("recurrent" if explicit[index] else "attention")
        elif hybrid and (index + 1) % interval != 0:
            kinds.append("recurrent")
        else:
            kinds.append("attention")
    return kinds


def array_length(value: object) -> int | None:
    """Length of a metadata array (kept or summarised); None for anything else."""
    if isinstance(value, ArraySummary):
        return value.count
    if isinstance(value, list):
        return len(value)
    return None


def _short(value: object) -> object:
    """A metadata value fit for a report: long strings and arrays summarised."""
    if isinstance(value, LongString):
        return {"length": value.length}
    if isinstance(value, ArraySummary):
        return {"type": value.item_type, "count": value.count}
    if isinstance(value, list) and len(value) > 16:
        return {"count": len(value)}
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "…"
    return value


def human_count(n: int) -> str:
    """12345678 -> '12.35 M' (the way llama.cpp prints ``model params``)."""
    for factor, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return str(n)


def describe(header: GGUFHeader) -> dict[str, Any]:
    """The facts of a model, from its header: JSON-able, shared by ``models.inspect`` and ``models.verify``."""
    arch = header.architecture
    md = header.metadata

    def arch_key(name: str) -> object:
        return _short(md.get(f"{arch}.{name}")) if arch else None

    kinds = layer_kinds(header)
    params = sum(tensor.n_elements for tensor in header.tensors)
    data_bytes = sum(tensor.nbytes for tensor in header.tensors)
    guessed = _most_tensors_type(header.tensors)
    template = md.get("tokenizer.chat_template")
    template_bytes = (
        template.length
        if isinstance(template, LongString)
        else len(template.encode("utf-8"))
        if isinstance(template, str)
        else None
    )
    return {
        "architecture": arch,
        "name": _short(md.get("general.name")),
        "size_label": _short(md.get("general.size_label")),
        "gguf_version": header.version,
        "file_size": header.file_size,
        "header_bytes": header.data_offset,
        "tensor_count": len(header.tensors),
        "vocab_only": not header.tensors,  # a vocabulary file (llama.cpp's ggml-vocab-*.gguf): nothing to serve
        "kv_count": len(md),
        "alignment": header.alignment,
        "parameters": params,
        "parameters_human": human_count(params),
        "bits_per_weight": round(data_bytes * 8 / params, 2) if params else None,
        "file_type": file_type_name(md.get("general.file_type")),
        "file_type_id": _int(md.get("general.file_type")),
        "dominant_type": dominant_type(header.tensors),
        "guessed_file_type": GUESSED_FILE_TYPE.get(guessed or "", guessed),
        "quant_histogram": quant_histogram(header.tensors),
        "context_length": arch_key("context_length"),
        "embedding_length": arch_key("embedding_length"),
        "feed_forward_length": arch_key("feed_forward_length"),
        "head_count": arch_key("attention.head_count"),
        "head_count_kv": arch_key("attention.head_count_kv"),
        "key_length": arch_key("attention.key_length"),
        "value_length": arch_key("attention.value_length"),
        "rope_freq_base": arch_key("rope.freq_base"),
        "expert_count": arch_key("expert_count"),
        "expert_used_count": arch_key("expert_used_count"),
        "layers": {
            "block_count": _int(md.get(f"{arch}.block_count")),
            "attention": kinds.count("attention"),
            "recurrent": kinds.count("recurrent"),
            "mtp": kinds.count("mtp"),
            "full_attention_interval": arch_key("full_attention_interval"),
            # the first blocks only of a count no model has (a corrupt header must not make a huge report)
            "attention_layers": [
                index for index, kind in enumerate(kinds[:_LISTED_BLOCKS]) if kind == "attention"
            ],
        },
        "tokenizer": {
            "model": _short(md.get("tokenizer.ggml.model")),
            "pre": _short(md.get("tokenizer.ggml.pre")),
            "vocab_size": array_length(md.get("tokenizer.ggml.tokens")),
            "merges": array_length(md.get("tokenizer.ggml.merges")),
            "bos_token_id": _short(md.get("tokenizer.ggml.bos_token_id")),
            "eos_token_id": _short(md.get("tokenizer.ggml.eos_token_id")),
        },
        "chat_template": {
            "present": template is not None,
            "bytes": template_bytes,
            "variants": sorted(
                key.removeprefix("tokenizer.chat_template.")
                for key in md
                if key.startswith("tokenizer.chat_template.")
            ),
        },
        "data_bytes": data_bytes,
    }


# --------------------------------------------------------------------------------------------- operation


def _is_url(target: str) -> bool:
    return target.startswith(("https://", "http://", "hf://", "ms://"))


def resolve_local_model(target: str) -> tuple[Path | None, Any]:
    """``(path, recipe)`` for a FILE or RECIPE argument.

    The recipe is None for a plain file and a tiny model's name (``tiny``: its file, written on first use). For a
    recipe, the path is its ``file://`` source, else the copy ``models.fetch`` left in the model store (found
    offline), else None.
    """
    from llamaforge.models.model_file import local_model_path
    from llamaforge.models.recipes import load_model_recipe
    from llamaforge.models.tiny import named_tiny_model

    tiny = named_tiny_model(target)
    if tiny is not None:
        return tiny[0], None

    path = local_model_path(target)  # a directory, or a missing .gguf, is refused here
    if path is not None:
        return path, None
    if _is_url(target):
        return None, None
    recipe = load_model_recipe(target)
    try:
        from llamaforge.models.lock import apply_lock

        recipe = apply_lock(recipe)
    except ImportError:  # pragma: no cover - the lock module ships with the fetch feature
        pass
    if recipe.source.startswith("file://"):
        return Path(urllib.parse.urlsplit(recipe.source).path), recipe
    from llamaforge.core.errors import LlamaforgeError
    from llamaforge.models.fetch import fetch_model

    try:
        return fetch_model(recipe, offline=True).path, recipe
    except LlamaforgeError:  # not fetched yet
        return None, recipe


def inspect_model(
    target: str,
    *,
    remote: bool = False,
    revision: str | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> dict[str, Any]:
    """Inspect a model FILE, RECIPE or URL from its header; with ``remote`` (implied for URLs) only the header
    is fetched, through HTTP range requests."""
    cancel = cancel or CancelToken()
    path, recipe = (None, None) if _is_url(target) else resolve_local_model(target)
    source_url = target if _is_url(target) else recipe.source if recipe is not None else None
    if path is not None:
        if not path.is_file():
            raise ModelError(
                f"model file {path} does not exist", hint="check the path, or fetch the model first"
            )
        reporter(Event("stage", f"reading the header of {path}", stage="inspect"))
        header = read_header(path)
        return {"source": str(path), "remote": False, "model": describe(header)}
    if source_url is None:
        raise InvalidOption(f"nothing to inspect at {target!r}")
    if not (remote or _is_url(target)):
        raise InvalidOption(
            f"recipe {target!r} points at {source_url}, not a local file",
            hint="pass --remote to read only its header over HTTP, or fetch it first (`invoke models.fetch`)",
        )
    url, headers = resolve_remote_url(source_url, revision or (recipe.revision if recipe else None))
    started = time.monotonic()
    http = HttpRangeSource(url, headers=headers, reporter=reporter, cancel=cancel)
    reporter(Event("stage", f"reading the header of {http.name} through range requests", stage="inspect"))
    header = read_header(http)
    return {
        "source": http.name,
        "remote": True,
        "bytes_fetched": http.bytes_fetched,
        "requests": http.requests,
        "fraction_fetched": round(http.bytes_fetched / http.size, 6) if http.size else None,
        "seconds": round(time.monotonic() - started, 3),
        "model": describe(header),
    }
