"""Rebuild a published build from scratch (fresh container, ccache off) and compare every artifact."""

from __future__ import annotations

import datetime
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.build import BuildResult
from llamaforge.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.patches import apply_series
from llamaforge.plan import BuildPlan
from llamaforge.resources import home
from llamaforge.runners import LogSink, RunRequest, get_executor
from llamaforge.source import fetch_source, make_workspace, sha256_file
from llamaforge.store import staging_dir


@dataclass(frozen=True)
class ArtifactDiff:
    """One artifact whose rebuild differs from the manifest."""

    path: str
    expected_sha256: str
    actual_sha256: str | None
    expected_size: int
    actual_size: int | None
    first_difference: int | None
    section: str | None
    explanation: str


@dataclass(frozen=True)
class ReproducibilityReport:
    """Outcome of a rebuild-and-compare."""

    key: str
    identical: tuple[str, ...]
    different: tuple[ArtifactDiff, ...]
    seconds: float
    log_path: str

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
        }


def elf_section_at(path: Path, offset: int) -> str | None:
    """Name of the ELF64 section that holds file ``offset`` (None if not ELF64 or in no section)."""
    data = path.read_bytes()
    if data[:5] != b"\x7fELF\x02" or len(data) < 64:
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        return None
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset = headers[shstrndx][4]
    for name_offset, _type, _flags, _addr, sec_offset, size in headers:
        if sec_offset <= offset < sec_offset + size and _type != 8:  # SHT_NOBITS occupies no file bytes
            end = data.find(b"\0", strtab_offset + name_offset)
            return data[strtab_offset + name_offset : end].decode(errors="replace")
    return None


def _first_difference(a: Path, b: Path) -> int | None:
    left, right = a.read_bytes(), b.read_bytes()
    for index, (x, y) in enumerate(zip(left, right, strict=False)):
        if x != y:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


_EXPLANATIONS = {
    ".note.gnu.build-id": "only the build-id differs, so some other input (usually a path) differs too",
    ".rodata": "constant data differs: typically embedded paths, __DATE__/__TIME__ or a build-info string",
    ".text": "machine code differs: compiler flags, compiler version or non-deterministic code generation",
    ".data": "initialised data differs: typically embedded strings such as build info",
    ".debug_info": "debug info differs: usually absolute paths not covered by -ffile-prefix-map",
    ".comment": "compiler identification strings differ",
}


def check_reproducible(
    result: BuildResult,
    plan: BuildPlan,
    *,
    executor: str = "docker",
    jobs: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
) -> ReproducibilityReport:
    """Rebuild ``plan`` with ccache off in a fresh environment and compare artifacts with ``result``."""
    cancel = cancel or CancelToken()
    started = time.monotonic()
    runner = get_executor(executor)
    runner.environment_id(plan, reporter)
    tree = fetch_source(plan.recipe.source, reporter=reporter, cancel=cancel)
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}"
    log_path = home() / "logs" / f"{result.key}-reproduce-{stamp}.log"
    scratch = staging_dir(result.key)
    try:
        with make_workspace(tree) as workspace:
            apply_series(list(plan.patches), workspace)
            sink = LogSink(log_path, reporter)
            reporter(Event("stage", "rebuilding with ccache off", stage="reproduce"))
            try:
                runner.run(RunRequest(plan, workspace, scratch, sink, cancel, use_ccache=False, jobs=jobs))
            finally:
                sink.close()
        identical: list[str] = []
        different: list[ArtifactDiff] = []
        for relative, expected in sorted(result.manifest["artifacts"].items()):
            rebuilt = scratch / relative
            if not rebuilt.is_file():
                different.append(
                    ArtifactDiff(relative, expected["sha256"], None, expected["size"], None, None, None,
                                 "the rebuild did not produce this file")
                )  # fmt: skip
                continue
            actual = sha256_file(rebuilt)
            if actual == expected["sha256"]:
                identical.append(relative)
                continue
            original = result.path / relative
            offset = _first_difference(original, rebuilt) if original.is_file() else None
            section = elf_section_at(original, offset) if offset is not None else None
            explanation = _EXPLANATIONS.get(section or "", "differs; compare with diffoscope for details")
            different.append(
                ArtifactDiff(relative, expected["sha256"], actual, expected["size"], rebuilt.stat().st_size,
                             offset, section, explanation)
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ReproducibilityReport(
        result.key, tuple(identical), tuple(different), time.monotonic() - started, str(log_path)
    )
