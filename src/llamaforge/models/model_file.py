"""What a model argument names on this machine, and whether a file is a GGUF model at all.

Every command that takes a model (``models.fetch``, ``models.inspect``, ``models.verify``, and the resolver
deploy and smoke use) reads its argument the same way: an existing file (not ``.toml``) is a model file, a
directory is refused, a missing ``*.gguf`` path is named as missing, anything else is a recipe or a URL. And no
file reaches the model store, a deployment or a smoke run unless its header parses as GGUF
(:mod:`llamaforge.gguf.header`) and it holds tensors, or at least a vocabulary (llama.cpp's vocab-only files).
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from pathlib import Path

from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import Event, Reporter, null_reporter
from llamaforge.gguf.header import GGUFFormatError, GGUFHeader, read_header
from llamaforge.gguf.sources import FileSource
from llamaforge.models.urls import file_url_host

_NOT_GGUF_HINT = (
    "name a GGUF model file (llama.cpp's format, starting with the bytes 'GGUF'), a model recipe or a URL of "
    "a .gguf file; `invoke models.inspect FILE` shows what a file holds"
)


def local_model_path(argument: str) -> Path | None:
    """The local file ``argument`` names (a path, or a ``file://`` URL), or None for a recipe or a remote URL.

    An existing file that is not a ``.toml`` recipe is a model file; a directory and a missing ``*.gguf`` are
    refused here, so they never reach the recipe loader (which would read a GGUF as TOML, or call a
    directory missing)."""
    if argument.startswith("file://"):
        if host := file_url_host(argument):
            raise InvalidOption(
                f"{argument} names the host {host!r}: file URLs hold an absolute path",
                hint="write file:///abs/path.gguf (three slashes), or give the path itself",
            )
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(argument).path))
    elif "://" in argument:
        return None
    else:
        path = Path(argument).expanduser()
    if path.is_dir():
        raise InvalidOption(
            f"{argument} is a directory: name a .gguf file or a recipe",
            hint="e.g. DIR/model.gguf, a recipe name (`invoke recipes.list`) or a .toml model recipe",
        )
    if path.is_file() and (path.suffix != ".toml" or argument.startswith("file://")):
        return path
    if path.suffix == ".gguf" or argument.startswith("file://"):
        raise ModelError(f"model file {path} does not exist", hint="check the path, or fetch the model first")
    return None


def read_model_header(path: Path, *, name: str | None = None) -> GGUFHeader:
    """The GGUF header of ``path``; a :class:`ModelError` naming the file (as ``name``, e.g. the source it came
    from) when it is empty, not a GGUF or malformed."""
    shown = name or str(path)
    with FileSource(path) as source:
        if source.size == 0:
            raise ModelError(f"{shown} is empty (0 bytes): not a GGUF model", hint=_NOT_GGUF_HINT)
        source.name = shown
        try:
            return read_header(source)
        except GGUFFormatError as error:
            if error.field == "magic":
                raise ModelError(
                    f"{shown} is not a GGUF model: it does not start with the bytes 'GGUF'",
                    hint=_NOT_GGUF_HINT,
                ) from None
            reason = error.message.removeprefix(f"{shown}: ")
            raise ModelError(f"{shown} is not a well-formed GGUF model: {reason}", hint=error.hint) from None


def is_vocab_only(header: GGUFHeader) -> bool:
    """True for a GGUF with no tensors (a vocabulary file, as llama.cpp's ``models/ggml-vocab-*.gguf``)."""
    return not header.tensors


def check_model_file(
    path: Path, *, name: str | None = None, reporter: Reporter = null_reporter
) -> GGUFHeader:
    """The header of ``path`` when it is a GGUF that holds tensors, or a vocabulary (then a warning says it is
    vocab-only); a :class:`ModelError` naming the file otherwise."""
    shown = name or str(path)
    header = read_model_header(path, name=shown)
    if is_vocab_only(header):
        if "tokenizer.ggml.tokens" not in header.metadata:
            raise ModelError(
                f"{shown} is a GGUF with no tensors and no vocabulary: there is no model in it",
                hint=_NOT_GGUF_HINT,
            )
        reporter(Event("warning", f"{shown} is vocab-only: no tensors (it cannot be served)", stage="model"))
    return header


def require_servable(path: Path, *, name: str | None = None) -> GGUFHeader:
    """The header of ``path`` when it is a GGUF with tensors, which llama.cpp can load and serve; an error
    naming the file otherwise (not a GGUF: :class:`ModelError`; vocab-only: :class:`InvalidOption`)."""
    shown = name or str(path)
    header = read_model_header(path, name=shown)
    if is_vocab_only(header):
        raise InvalidOption(
            f"{shown} has no tensors: a vocab-only file cannot be served",
            hint="give the model's GGUF with its weights (`invoke models.inspect FILE` shows what a file holds)",
        )
    return header
