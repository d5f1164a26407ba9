"""The tiny models any ``--model`` argument may name: random-weight qwen3 GGUFs written here once, with the default
recipe's tokenizer, so smoke, deploy, fit, verify and inspect work without a hub (``tiny``: Q4_0, the default
smoke and probe model; ``tiny-q4_k_m``: llama-quantize's K-quant mix)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Final

from llamaforge.core.errors import CacheError, FetchError, InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import refuse_if_read_only
from llamaforge.core.paths import home

if TYPE_CHECKING:
    from llamaforge.gguf.tiny import TinyModelSpec
    from llamaforge.gguf.tiny.file import DType
    from llamaforge.models.fetch import FetchResult

#: The name of the default tiny model (``--model tiny``).
TINY_MODEL: Final = "tiny"
#: How the default smoke model stores its matrices: quantized, so a smoke reaches the quantized CPU kernels.
SMOKE_MODEL_DTYPE: DType = "q4_0"
#: The tiny models ``--model`` names: ``tiny`` (Q4_0, the default) and ``tiny-q4_k_m`` (llama-quantize's Q4_K_M
#: mix, 256 wide so that its rows are whole K-quant super-blocks: the K-quant kernels most published GGUFs reach).
TINY_SMOKE_MODELS: Final[dict[str, DType]] = {TINY_MODEL: SMOKE_MODEL_DTYPE, f"{TINY_MODEL}-q4_k_m": "q4_k_m"}


def tiny_smoke_model(
    reporter: Reporter = null_reporter, cancel: CancelToken | None = None, *, dtype: DType = SMOKE_MODEL_DTYPE
) -> Path:
    """The default smoke model: a tiny random-weight qwen3 GGUF, written once under ``home()/models/tiny/``.

    Its matrices are Q4_0 by default, so llama-bench and llama-server reach the CPU's quantized kernels (repacked
    Q4_0, AMX, quantized dot products), which an F16 file never does; ``dtype="q4_k_m"`` writes the K-quant one
    (:func:`tiny_smoke_spec`), ``dtype="f16"`` the float one. Its
    tokenizer comes from the default recipe's llama.cpp source (models/ggml-vocab-qwen2.gguf), so no hub is
    needed; the file name carries a digest of the spec, so a changed spec gets a new file.
    """
    return tiny_model_file(tiny_smoke_spec(dtype), tiny_smoke_label(dtype), reporter, cancel)


def named_tiny_model(
    name: str, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> tuple[Path, str] | None:
    """The file and label of the tiny smoke model ``name`` names, or None when ``name`` names some other model."""
    dtype = TINY_SMOKE_MODELS.get(name)
    if dtype is None:
        return None
    return tiny_smoke_model(reporter, cancel, dtype=dtype), tiny_smoke_label(dtype)


def tiny_smoke_spec(dtype: DType = SMOKE_MODEL_DTYPE) -> TinyModelSpec:
    """The tiny qwen3 of the smoke in ``dtype``: 64 wide, or 256 wide for ``q4_k_m`` (a K-quant's rows are whole
    256-value super-blocks; narrower rows would fall back to Q5_0 and never reach a K-quant kernel)."""
    from llamaforge.gguf.tiny import TinyModelSpec

    if dtype == "q4_k_m":
        return TinyModelSpec(arch="qwen3", dtype=dtype, n_embd=256, head_dim=64, n_ff=512)
    return TinyModelSpec(arch="qwen3", dtype=dtype)


def tiny_model_file(
    spec: TinyModelSpec, label: str, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> Path:
    """The tiny model ``spec`` describes, written once under ``home()/models/tiny/`` as ``LABEL-DIGEST.gguf`` (the
    digest of the spec: a changed spec gets a new file), with the default recipe's qwen2 tokenizer."""
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source
    from llamaforge.gguf.tiny import write_tiny_model
    from llamaforge.models.model_file import check_model_file

    path = _tiny_path(spec, label)
    if path.is_file():
        try:
            check_model_file(path)
            return path
        except ModelError as error:
            # Truncated or emptied since (a full disk, an edit): a file made here is made again, never served.
            reporter(Event("warning", f"{error.message}: writing {path.name} again", stage="model"))
    # Writing needs the pinned source (maybe fetched: a program run) and writes the store: say so before either.
    refuse_if_read_only(f"write the tiny model {path.name} (it is written on first use)")
    reporter(Event("stage", f"writing the tiny {spec.arch} model {path.name}", stage="model"))
    tree = fetch_source(load_recipe("default").source, reporter=reporter, cancel=cancel)
    vocab = tree / "models" / "ggml-vocab-qwen2.gguf"
    if not vocab.is_file():  # the kept tree lost a file since it was extracted whole
        raise CacheError(
            f"the kept llama.cpp source {tree} has no models/{vocab.name} to write the tiny model with",
            hint=f"remove {tree.parent} and run again: the source is extracted again",
        )
    write_tiny_model(path, spec, vocab)
    return path


def _tiny_path(spec: TinyModelSpec, label: str) -> Path:
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    return home() / "models" / "tiny" / f"{label}-{digest}.gguf"


def fetch_tiny_model(
    name: str,
    *,
    offline: bool = False,
    revision: str | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> FetchResult | None:
    """``models.fetch`` of a tiny model's name: its file, written here on first use (never downloaded), or None
    when ``name`` names some other model. Offline, only a file written before is served: writing one needs the
    default recipe's llama.cpp source, which may have to be fetched."""
    from llamaforge.models.download import hash_file
    from llamaforge.models.fetch import FetchResult

    dtype = TINY_SMOKE_MODELS.get(name)
    if dtype is None:
        return None
    if revision is not None:
        raise InvalidOption(
            f"--revision applies to hub sources; {name!r} is a tiny model written here",
            hint=f"drop --revision (`invoke models.fetch {name}`)",
        )
    spec, label = tiny_smoke_spec(dtype), tiny_smoke_label(dtype)
    cached = _tiny_path(spec, label).is_file()
    if offline and not cached:
        raise FetchError(
            f"--offline: the tiny model {name!r} is not written yet, and writing it needs the default recipe's "
            "llama.cpp source",
            hint=f"run `invoke models.fetch {name}` once without --offline",
        )
    path = tiny_model_file(spec, label, reporter, cancel)
    digest, size = hash_file(path, f"hashing {path.name}", null_reporter, cancel or CancelToken())
    return FetchResult(
        path=path,
        sha256=digest.hexdigest(),
        size=size,
        cached=cached,
        source=f"{name}: written here (random weights, the qwen2 tokenizer)",
    )


def tiny_smoke_label(dtype: DType = SMOKE_MODEL_DTYPE) -> str:
    """The label of the tiny smoke model in reports: ``tiny-qwen3-q4_0`` (``tiny-qwen3`` for F16)."""
    return "tiny-qwen3" if dtype == "f16" else f"tiny-qwen3-{dtype}"
