"""Rebuild a published build from scratch (fresh container, ccache off) through the build pipeline's
``build_into`` and compare every artifact, on the engine that built it or on another builder. The artifact names
a manifest lists must be paths inside the build (no absolute path, no ``..``): a differing artifact is copied
aside under its name. Each check is recorded in the build's manifest (``reproducibility``): where the build was
made, where it was rebuilt, in which builder images, and the verdict."""

from __future__ import annotations

import datetime
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from llamaforge.build.ccache import CCACHE_RECORD
from llamaforge.build.download import sha256_file
from llamaforge.build.execute import BuildResult, build_into
from llamaforge.build.executors.base import Executor
from llamaforge.build.plan import BuildPlan
from llamaforge.build.store import record_check, staging_dir
from llamaforge.core.errors import CacheError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import home


@dataclass(frozen=True)
class ArtifactDiff:
    """One artifact whose rebuild differs from the manifest."""

    path: str
    expected_sha256: str
    actual_sha256: str | None
    expected_size: int
    actual_size: int | None
    first_difference: int | None
    sections: tuple[str, ...]
    explanation: str
    kept: str | None


@dataclass(frozen=True)
class ReproducibilityReport:
    """Outcome of a rebuild-and-compare: ``built_on`` / ``rebuilt_on`` name the builders, ``built_in`` /
    ``rebuilt_in`` their environments (builder image ids)."""

    key: str
    identical: tuple[str, ...]
    different: tuple[ArtifactDiff, ...]
    seconds: float
    log_path: str
    built_on: str = ""
    rebuilt_on: str = ""
    built_in: str = ""
    rebuilt_in: str = ""

    @property
    def reproducible(self) -> bool:
        """True when every artifact is bit-identical."""
        return not self.different

    def to_json(self) -> dict[str, Any]:
        """Report as data."""
        return {
            "key": self.key,
            "reproducible": self.reproducible,
            "identical": list(self.identical),
            "different": [diff.__dict__ for diff in self.different],
            "seconds": round(self.seconds, 1),
            "log": self.log_path,
            "built_on": self.built_on,
            "rebuilt_on": self.rebuilt_on,
            "built_in": self.built_in,
            "rebuilt_in": self.rebuilt_in,
            "note": self.note,
        }

    @property
    def note(self) -> str | None:
        """Why a difference may not be the builders' own: the rebuild ran in another builder image."""
        if self.built_in and self.rebuilt_in and self.built_in != self.rebuilt_in:
            return (
                f"the rebuild ran in builder image {self.rebuilt_in[:19]} on {self.rebuilt_on}, the build in "
                f"{self.built_in[:19]}: any difference may come from the images"
            )
        return None

    def record(self) -> dict[str, Any]:
        """The check as the manifest keeps it: when, the two builders and images, the verdict, and each
        differing artifact with its sections."""
        return {
            "checked_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "built_on": self.built_on,
            "rebuilt_on": self.rebuilt_on,
            "built_in": self.built_in,
            "rebuilt_in": self.rebuilt_in,
            "reproducible": self.reproducible,
            "identical": len(self.identical),
            "different": [{"path": diff.path, "sections": list(diff.sections)} for diff in self.different],
        }


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> file bytes of an ELF64 little-endian file (empty dict if it is not one)."""
    if data[:6] != b"\x7fELF\x02\x01" or len(data) < 64:
        return {}
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        return {}
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    sections: dict[str, bytes] = {}
    for name_offset, kind, _flags, _addr, offset, size in headers:
        end = data.find(b"\0", strtab + name_offset)
        name = data[strtab + name_offset : end].decode(errors="replace")
        sections[name] = b"" if kind == 8 else data[offset : offset + size]  # SHT_NOBITS has no file bytes
    return sections


PE_HEADERS = (
    "(PE headers)"  # the headers before the first section: the link time stamp and checksum live there
)


def pe_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> file bytes of a PE file (.exe, .dll), the headers as ``(PE headers)``; empty dict if it is
    not one."""
    if data[:2] != b"MZ" or len(data) < 0x40:
        return {}
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe : pe + 4] != b"PE\0\0" or pe + 24 > len(data):
        return {}
    count = struct.unpack_from("<H", data, pe + 6)[0]
    optional_size = struct.unpack_from("<H", data, pe + 20)[0]
    table = pe + 24 + optional_size
    if table + count * 40 > len(data):
        return {}
    sections: dict[str, bytes] = {}
    first = len(data)
    for index in range(count):
        entry = table + index * 40
        name = data[entry : entry + 8].rstrip(b"\0").decode(errors="replace")
        size, offset = struct.unpack_from("<II", data, entry + 16)
        sections[name] = data[offset : offset + size]
        if size:
            first = min(first, offset)
    return {PE_HEADERS: data[:first], **sections}


def differing_sections(a: bytes, b: bytes) -> list[str]:
    """Names of ELF or PE sections whose bytes differ (or exist in one file only), in file order."""
    left, right = (
        (elf_sections(a), elf_sections(b)) if a[:4] == b"\x7fELF" else (pe_sections(a), pe_sections(b))
    )
    names = list(left) + [name for name in right if name not in left]
    return [name for name in names if name and left.get(name) != right.get(name)]


def _first_difference(a: Path, b: Path) -> int | None:
    left, right = a.read_bytes(), b.read_bytes()
    for index, (x, y) in enumerate(zip(left, right, strict=False)):
        if x != y:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


_EXPLANATIONS = {
    ".gnu.hash": "the dynamic symbol table differs",
    ".note.gnu.build-id": "only the build-id differs, so some other input (usually a path) differs too",
    ".rodata": "constant data differs: typically embedded paths, __DATE__/__TIME__ or a build-info string",
    ".text": "machine code differs: compiler flags, compiler version or non-deterministic code generation",
    ".data": "initialised data differs: typically embedded strings such as build info",
    ".debug_info": "debug info differs: usually absolute paths not covered by -ffile-prefix-map",
    ".comment": "compiler identification strings differ",
    PE_HEADERS: "the PE headers differ: usually the link time stamp (-Wl,--no-insert-timestamp leaves it 0) or the "
    "checksum",
    ".rdata": "constant data differs: typically embedded paths, __DATE__/__TIME__ or a build-info string",
    ".edata": "the export table differs (its time stamp, or the exported names)",
}


def _check_artifact_names(key: str, names: list[str]) -> None:
    """Refuse a manifest whose artifact names leave the build directory."""
    for name in names:
        path = PurePosixPath(name)
        if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
            raise CacheError(
                f"the manifest of build {key} lists artifact {name!r}, which is not a path inside the build",
                hint="the store entry was edited: remove it (`invoke builds.list` names its directory) and build "
                "again",
            )


def _built_on(manifest: dict[str, Any]) -> str:
    """Where a build was made, as its manifest says: a fleet's builder (``NAME (ADDRESS)``), else the engine,
    else the executor."""
    builder = manifest.get("builder")
    if isinstance(builder, dict) and builder.get("name"):
        return f"{builder['name']} ({builder.get('address', '?')})"
    image = manifest.get("image") or {}
    return str(image.get("engine") or image.get("executor") or "")


def check_reproducible(
    result: BuildResult,
    plan: BuildPlan,
    *,
    executor: Executor,
    jobs: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    rebuilt_on: str | None = None,
) -> ReproducibilityReport:
    """Rebuild ``plan`` with ``executor`` (on the builder ``rebuilt_on`` names; default: the executor's
    location), ccache off, in a fresh workspace and container (the build pipeline's ``build_into``), compare
    every artifact with ``result`` and record the check in its manifest."""
    cancel = cancel or CancelToken()
    _check_artifact_names(result.key, list(result.manifest["artifacts"]))
    started = time.monotonic()
    rebuilt_in = executor.prepare_environment(plan, reporter)
    image = result.manifest.get("image") or {}
    built_on = _built_on(result.manifest)
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}"
    log_path = home() / "logs" / f"{result.key}-reproduce-{stamp}.log"
    scratch = staging_dir(result.key)
    # Differing rebuilt artifacts are kept for inspection (e.g. diffoscope ORIGINAL KEPT).
    keep = home() / "reproduce" / f"{result.key}-{stamp}"
    try:
        reporter(Event("stage", "rebuilding with ccache off", stage="reproduce"))
        build_into(
            plan, executor, scratch, log_path, use_ccache=False, jobs=jobs, reporter=reporter, cancel=cancel
        )
        identical: list[str] = []
        different: list[ArtifactDiff] = []
        for relative, expected in sorted(result.manifest["artifacts"].items()):
            rebuilt = scratch / relative
            if not rebuilt.is_file():
                different.append(
                    ArtifactDiff(
                        relative,
                        expected["sha256"],
                        None,
                        expected["size"],
                        None,
                        None,
                        (),
                        "the rebuild did not produce this file",
                        None,
                    )
                )
                continue
            actual = sha256_file(rebuilt)
            if actual == expected["sha256"]:
                identical.append(relative)
                continue
            original = result.path / relative
            offset = _first_difference(original, rebuilt) if original.is_file() else None
            sections = tuple(differing_sections(original.read_bytes(), rebuilt.read_bytes()))
            causes = [name for name in sections if name != ".note.gnu.build-id"]
            explanation = "; ".join(
                f"{name}: {_EXPLANATIONS.get(name, 'differs')}" for name in causes[:4]
            ) or _EXPLANATIONS.get(".note.gnu.build-id", "differs")
            kept = keep / relative
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(rebuilt, kept)
            different.append(
                ArtifactDiff(
                    relative,
                    expected["sha256"],
                    actual,
                    expected["size"],
                    rebuilt.stat().st_size,
                    offset,
                    sections,
                    explanation,
                    str(kept),
                )
            )
        for path in sorted(scratch.rglob("*")):
            relative = path.relative_to(scratch).as_posix()
            if (
                path.is_file()
                and relative not in result.manifest["artifacts"]
                and relative not in ("toolchain.json", CCACHE_RECORD)
            ):
                different.append(
                    ArtifactDiff(
                        relative,
                        "",
                        sha256_file(path),
                        0,
                        path.stat().st_size,
                        None,
                        (),
                        "the rebuild made a file the published build does not have",
                        None,
                    )
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = ReproducibilityReport(
        result.key,
        tuple(identical),
        tuple(different),
        time.monotonic() - started,
        str(log_path),
        built_on=built_on,
        rebuilt_on=rebuilt_on or executor.location(),
        built_in=str(image.get("environment_id") or ""),
        rebuilt_in=rebuilt_in,
    )
    if report.note:
        reporter(Event("warning", report.note, stage="reproduce"))
    record_check(result.key, report.record())
    return report
