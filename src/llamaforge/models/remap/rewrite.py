"""Rewrite a GGUF file: canonical tensor names, declarative metadata edits, streamed data, verified output.

Third-party converters sometimes keep Hugging Face (``model.layers.0.self_attn.q_proj.weight``) or Meta
(``layers.0.attention.wq.weight``) tensor names in GGUF files; stock llama.cpp looks tensors up by its own
names (``blk.0.attn_q.weight``) and refuses them. :func:`remap_gguf` renames every tensor through
``gguf.TensorNameMap`` for the file's architecture and block count, applies the metadata edits of a rules file
(``recipes/remaps/*.toml``: set / rename / delete keys, an optional relabel of ``general.architecture``) and
copies the tensor bytes unchanged, a few MiB at a time. The output is written next to the destination,
re-read and compared with the input (every metadata key; tensor names, types, shapes and the sha256 of every
tensor's bytes), and only then renamed into place.

Tensor names come from :mod:`llamaforge.models.remap.names`, the metadata edits from
:mod:`llamaforge.models.remap.metadata`. The input is parsed by :func:`llamaforge.gguf.header.read_header` in
its byte-exact mode, which checks every length against the file size (a truncated or crafted file is an
error, never a hang) and keeps every value as the file holds it (strings as bytes, arrays whole); the output
is written by ``gguf.GGUFWriter``.

Tensors are renamed only for the architectures whose Hugging Face → GGUF conversion changes names and nothing
else (:data:`llamaforge.models.remap_table.REMAP_ARCHS`: qwen3, qwen3moe); a file of another architecture passes
when its names are canonical already (metadata edits only). A remap never converts tensor data: no
transposes, no stacking of per-expert tensors, no dtype change.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import gguf
import numpy as np

from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import unwritable_reason
from llamaforge.gguf.header import GGUFHeader, read_header
from llamaforge.gguf.sources import CHUNK_SIZE, hash_gguf
from llamaforge.models.remap.metadata import (
    KeyValue,
    MetadataChange,
    MetadataPlan,
    architecture,
    display,
    key_values,
    plan_metadata,
    same_value,
)
from llamaforge.models.remap.names import Mapped, canonical_tensors, check_relabel
from llamaforge.models.remap.rules import (
    ARCH_KEY,
    MatchRules,
    MetadataRules,
    RemapRules,
    TypedValue,
    list_rules,
    load_rules,
    parse_rules,
    rules_dir,
)

# The rules API is re-exported: callers of remap_gguf need RemapRules and load_rules.
__all__ = [
    "MatchRules",
    "MetadataRules",
    "RemapResult",
    "RemapRules",
    "TypedValue",
    "list_rules",
    "load_rules",
    "parse_rules",
    "remap_gguf",
    "rules_dir",
]

_PROGRESS_STEP: Final[int] = 64 << 20
_STAGE: Final[str] = "remap"

_V = gguf.GGUFValueType
_ALIGNMENT_KEY: Final[str] = gguf.Keys.General.ALIGNMENT

# ------------------------------------------------------------------------------------------------ planning


def _check_writable(kvs: Iterable[KeyValue], mapped: Iterable[Mapped], path: Path) -> None:
    for item in mapped:
        tensor = item.tensor
        if not tensor.shape:
            raise ModelError(
                f"{path.name}: tensor {tensor.name} has no dimensions, which gguf's writer cannot write"
            )
        try:
            gguf.GGMLQuantizationType(tensor.ggml_type.id)
        except ValueError:
            raise ModelError(
                f"{path.name}: tensor {tensor.name} has ggml type {tensor.ggml_type.name}, which the installed "
                "gguf package cannot write",
                hint="upgrade the gguf package",
            ) from None
    for kv in kvs:
        if kv.vtype == _V.ARRAY and not kv.value:
            raise ModelError(
                f"{path.name}: key {kv.key} is an empty array, which gguf's writer cannot write",
                hint=f'delete it with a rules file: [metadata] delete = ["{kv.key}"]',
            )


# --------------------------------------------------------------------------------------- write and verify


class _Progress:
    """Progress events for a byte count, at most one per ``_PROGRESS_STEP`` bytes (plus the last)."""

    def __init__(self, reporter: Reporter, what: str, total: int, cancel: CancelToken | None) -> None:
        self.reporter, self.what, self.total, self.cancel = reporter, what, total, cancel
        self.done = self.last = 0

    def add(self, n: int, *, final: bool = False) -> None:
        self.done += n
        if final or self.done - self.last >= _PROGRESS_STEP:
            self.last = self.done
            mib = f"{self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
            self.reporter(
                Event(
                    "progress",
                    f"{self.what} {mib}",
                    stage=_STAGE,
                    completed=self.done,
                    total=self.total,
                    unit="bytes",
                )
            )
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()


def _write(
    tmp: Path, header: GGUFHeader, plan: MetadataPlan, mapped: list[Mapped], progress: _Progress
) -> dict[str, str]:
    """Write the output through GGUFWriter, streaming tensor bytes; returns the input sha256 per tensor."""
    writer = gguf.GGUFWriter(tmp, plan.arch)  # writes general.architecture itself
    try:
        for kv in plan.kvs.values():
            if kv.key == ARCH_KEY:
                continue
            if kv.key == _ALIGNMENT_KEY:
                writer.add_custom_alignment(kv.value)
            else:
                writer.add_key_value(kv.key, kv.value, kv.vtype, sub_type=kv.sub_type)
        for item in mapped:
            tensor = item.tensor
            block, type_size = tensor.ggml_type.block_size, tensor.ggml_type.type_size
            # numpy-order byte shape; GGUFWriter turns it back into ggml's element shape for raw_dtype
            byte_shape = (*reversed(tensor.shape[1:]), tensor.shape[0] // block * type_size)
            writer.add_tensor_info(
                item.name,
                byte_shape,
                np.dtype(np.uint8),
                tensor.nbytes,
                raw_dtype=gguf.GGMLQuantizationType(tensor.ggml_type.id),
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None  # opened by write_header_to_file
        out = writer.fout[0]
        writer.write_padding(out, out.tell())
        hashes: dict[str, str] = {}
        buffer = memoryview(bytearray(CHUNK_SIZE))
        with Path(header.source).open("rb") as src:
            for item in mapped:
                digest = hashlib.sha256()
                src.seek(item.start)
                left = item.tensor.nbytes
                while left:
                    n = src.readinto(buffer[: min(left, CHUNK_SIZE)])
                    if not n:
                        raise ModelError(
                            f"{header.source} shrank while it was read (tensor {item.tensor.name})"
                        )
                    digest.update(buffer[:n])
                    out.write(buffer[:n])
                    left -= n
                    progress.add(n)
                writer.write_padding(out, item.tensor.nbytes)
                hashes[item.name] = digest.hexdigest()
        progress.add(0, final=True)
        out.flush()
        os.fsync(out.fileno())
    finally:
        writer.close()
    return hashes


def _verify(
    tmp: Path,
    plan: MetadataPlan,
    alignment: int,
    mapped: list[Mapped],
    hashes: Mapping[str, str],
    progress: _Progress,
) -> tuple[str, GGUFHeader]:
    """Re-read the written file and compare it with what was intended; returns its sha256 and header."""
    out = read_header(tmp, exact=True)
    problems: list[str] = []
    if out.alignment != alignment:
        problems.append(f"alignment {out.alignment}, expected {alignment}")
    got = key_values(out)
    missing, unexpected = sorted(set(plan.kvs) - set(got)), sorted(set(got) - set(plan.kvs))
    if missing or unexpected:
        problems.append(f"metadata keys differ: missing {missing}, unexpected {unexpected}")
    for key in sorted(set(got) & set(plan.kvs)):
        want, have = plan.kvs[key], got[key]
        if (want.vtype, want.sub_type) != (have.vtype, have.sub_type) or not same_value(
            want.value, have.value
        ):
            problems.append(f"key {key} holds {display(have.value)!r}, expected {display(want.value)!r}")
    if [t.name for t in out.tensors] != [item.name for item in mapped]:
        problems.append("tensor names or order differ from the plan")
    else:
        for tensor, item in zip(out.tensors, mapped, strict=True):
            if (tensor.ggml_type, tensor.shape) != (item.tensor.ggml_type, item.tensor.shape):
                problems.append(f"tensor {tensor.name}: type or shape differs from {item.tensor.name!r}")
    regions = [(t.name, out.absolute_offset(t), t.nbytes) for t in out.tensors]
    file_sha, tensor_sha = hash_gguf(tmp, regions, progress.add)
    progress.add(0, final=True)
    for item in mapped:
        if tensor_sha.get(item.name) != hashes[item.name]:
            problems.append(
                f"tensor {item.name}: sha256 of its data differs from input tensor {item.tensor.name!r}"
            )
    if problems:
        raise ModelError(
            "the written file does not match its input; nothing was published:\n  "
            + "\n  ".join(problems[:12]),
            hint="check the disk (free space, errors); if it persists, report it with the input's sha256",
        )
    return file_sha, out


def analyse_failures(header: GGUFHeader) -> dict[tuple[str, str], str]:
    """``models.verify``'s failing structure and tensor findings of a header, by (check, subject)."""
    from llamaforge.models.verify import analyse_header

    findings = analyse_header(header)["findings"]
    return {
        (item["check"], item["subject"]): item["message"]
        for item in findings
        if item["status"] == "fail" and item["check"] in ("structure", "tensors")
    }


def _check_loadable(source: GGUFHeader, written: GGUFHeader, rules: RemapRules | None) -> None:
    """Refuse (ModelError) a copy that ``models.verify`` fails where the source passed: the edits made a file
    llama.cpp refuses (a key llama.cpp reads into the shapes, a count it aborts on). What already failed in the
    source is the remap's to mend, not to refuse."""
    before = analyse_failures(source)
    new = [message for place, message in analyse_failures(written).items() if place not in before]
    if new:
        origin = f" of {rules.origin}" if rules is not None and rules.origin else ""
        raise ModelError(
            f"the metadata edits{origin} make a file llama.cpp would refuse; nothing was published:\n  "
            + "\n  ".join(new[:8])
            + (f"\n  … and {len(new) - 8} more" if len(new) > 8 else ""),
            hint="fix the [metadata] values the findings name (`invoke models.verify` on the source shows what "
            "it holds)",
        )


# ------------------------------------------------------------------------------------------------- public


@dataclass(frozen=True)
class RemapResult:
    """What :func:`remap_gguf` wrote (it raises rather than return an unverified file)."""

    src: Path
    dst: Path
    rules: str | None
    arch: str
    target_arch: str
    tensor_count: int
    tensor_bytes: int
    renamed: tuple[tuple[str, str], ...]
    metadata_changes: tuple[MetadataChange, ...]
    warnings: tuple[str, ...]
    size: int
    sha256: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """Summary for ``--json`` and tool results."""
        return {
            "src": str(self.src),
            "dst": str(self.dst),
            "rules": self.rules,
            "arch": self.arch,
            "target_arch": self.target_arch,
            "tensor_count": self.tensor_count,
            "tensor_bytes": self.tensor_bytes,
            "renamed_count": len(self.renamed),
            "renamed": dict(self.renamed),
            "metadata_changes": [change.to_json() for change in self.metadata_changes],
            "warnings": list(self.warnings),
            "size": self.size,
            "sha256": self.sha256,
            "verified": True,
            "seconds": round(self.seconds, 3),
        }


def _check_paths(src: Path, dst: Path, overwrite: bool) -> None:
    if not src.is_file():
        raise InvalidOption(f"input {src} does not exist or is not a file")
    if src.resolve() == dst.resolve():
        raise InvalidOption(
            f"output {dst} is the input file", hint="write to a new path; the input is never modified"
        )
    if dst.is_dir():
        raise InvalidOption(f"output {dst} is a directory", hint="give a file path ending in .gguf")
    if dst.exists() and not dst.is_file():  # a device (/dev/null), a pipe or a socket: never replaced
        raise InvalidOption(
            f"output {dst} is not a regular file", hint="give the path of a .gguf file to write (or replace)"
        )
    if dst.exists():
        if src.samefile(dst):
            raise InvalidOption(
                f"output {dst} is the input file under another name (a link)",
                hint="write to a new path; the input is never modified",
            )
        if not overwrite:
            raise InvalidOption(f"output {dst} exists", hint="pass --overwrite to replace it")


def _temporary_beside(dst: Path) -> Path:
    """An empty temporary file in ``dst``'s directory (made if missing), for the output to be written to and
    renamed over ``dst``; InvalidOption naming ``--dst`` when the directory cannot be made or written."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    except OSError as error:
        raise InvalidOption(
            f"--dst {dst}: cannot create a file in {dst.parent}: {unwritable_reason(dst, error)}",
            hint="give a --dst in a directory you can write",
        ) from None
    os.close(fd)
    return Path(name)


def remap_gguf(
    src: Path,
    dst: Path,
    rules: RemapRules | None = None,
    *,
    target_arch: str | None = None,
    overwrite: bool = False,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> RemapResult:
    """Copy GGUF ``src`` to ``dst`` with llama.cpp's tensor names and ``rules``' metadata edits applied.

    Tensor names go through ``gguf.TensorNameMap`` for the file's architecture and block count (canonical
    names pass through); a name that maps to nothing is an error naming it. ``target_arch`` (or a rule setting
    ``general.architecture``) relabels the file, refused when a tensor does not exist in the target arch.
    Tensor bytes are streamed ``CHUNK_SIZE`` at a time; the output is written next to ``dst``, re-read and
    compared with the input (metadata, tensor names, types, shapes and data sha256) and renamed into place.
    ``dst`` must not be ``src``, must not exist unless ``overwrite`` and must be in a directory that can be
    written (InvalidOption); a failed write leaves nothing behind (ModelError).
    """
    started = time.monotonic()
    src, dst = Path(src), Path(dst)
    _check_paths(src, dst, overwrite)
    reporter(Event("stage", f"reading {src}", stage=_STAGE))
    header = read_header(src, exact=True)
    arch = architecture(header)
    mapped = canonical_tensors(header, arch)
    plan = plan_metadata(header, arch, rules, target_arch)
    if plan.arch != arch:
        plan.warnings.extend(check_relabel(mapped, arch, plan.arch, src))
    _check_writable(plan.kvs.values(), mapped, src)
    for warning in plan.warnings:
        reporter(Event("warning", warning, stage=_STAGE))
    if cancel is not None:
        cancel.raise_if_cancelled()
    tensor_bytes = sum(item.tensor.nbytes for item in mapped)
    tmp = _temporary_beside(dst)
    try:
        reporter(Event("stage", f"writing {dst}", stage=_STAGE))
        hashes = _write(tmp, header, plan, mapped, _Progress(reporter, "copied", tensor_bytes, cancel))
        reporter(Event("stage", f"verifying {dst.name}", stage=_STAGE))
        size = tmp.stat().st_size
        sha256, written = _verify(
            tmp, plan, header.alignment, mapped, hashes, _Progress(reporter, "verified", size, cancel)
        )
        _check_loadable(header, written, rules)
        tmp.chmod(0o644)
        tmp.replace(dst)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise ModelError(
            f"--dst {dst}: writing it failed: {error.strerror or error}; nothing was published",
            hint=f"check the free space and health of the disk that holds {dst.parent}, or give a --dst on "
            "another disk",
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    renamed = tuple((item.tensor.name, item.name) for item in mapped if item.tensor.name != item.name)
    edits = sum(1 for change in plan.changes if not change.note.startswith(("unchanged", "already")))
    reporter(
        Event(
            "info",
            f"wrote {dst}: {len(renamed)} of {len(mapped)} tensors renamed, {edits} metadata edits, verified",
            stage=_STAGE,
        )
    )
    return RemapResult(
        src=src,
        dst=dst,
        rules=rules.origin if rules else None,
        arch=arch,
        target_arch=plan.arch,
        tensor_count=len(mapped),
        tensor_bytes=tensor_bytes,
        renamed=renamed,
        metadata_changes=tuple(plan.changes),
        warnings=tuple(plan.warnings),
        size=size,
        sha256=sha256,
        seconds=time.monotonic() - started,
    )
