"""The device-code check after every CUDA build: which SASS (real) and PTX (virtual) archs each artifact carries,
read with the toolkit's own ``cuobjdump`` (``cuda-device-code.txt``, written by the build script), compared with
the archs the build asked for. A requested arch that is missing, or a real arch nobody asked for, fails the build
before it is published; the listing goes into the manifest."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from llamaforge.core.errors import BuildFailed

LISTING = "cuda-device-code.txt"
_IMAGE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S+\.(sm_\d+[a-z]?)\.(?:cubin|ptx)$")
OBJECTS = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir"  # where ninja leaves ggml-cuda's objects
_ENTRY = re.compile(r"^(?P<arch>[0-9]+[af]?)(?:-(?P<kind>real|virtual))?$")

DeviceCode = dict[str, dict[str, list[str]]]  # artifact -> {"sass": [sm_86, …], "ptx": [sm_86, …]}


def parse_listing(text: str) -> DeviceCode:
    """``== ARTIFACT`` headers, each followed by that file's ``cuobjdump --list-elf`` / ``--list-ptx`` lines."""
    code: DeviceCode = {}
    current: dict[str, set[str]] | None = None
    found: dict[str, dict[str, set[str]]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("== "):
            current = found.setdefault(line[3:].strip(), {"sass": set(), "ptx": set()})
        elif current is not None and (match := _IMAGE.match(line)):
            current["sass" if match.group(1) == "ELF" else "ptx"].add(match.group(2))
    for artifact, kinds in found.items():
        code[artifact] = {kind: sorted(archs, key=_order) for kind, archs in kinds.items()}
    return code


def _order(arch: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", arch)), arch


def expected(requested: Sequence[str]) -> tuple[set[str], set[str]]:
    """(SASS, PTX) archs that CMAKE_CUDA_ARCHITECTURES entries ask for: ``86`` both, ``86-real`` SASS only,
    ``86-virtual`` PTX only."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for entry in requested:
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"not a CUDA arch entry: {entry!r}")
        name = f"sm_{match.group('arch')}"
        if match.group("kind") in (None, "real"):
            sass.add(name)
        if match.group("kind") in (None, "virtual"):
            ptx.add(name)
    return sass, ptx


def problems(code: DeviceCode, requested: Sequence[str]) -> list[str]:
    """What the artifacts' device code gets wrong against ``requested`` (empty: it matches)."""
    if not code:
        return ["no artifact carries CUDA device code"]
    want_sass, want_ptx = expected(requested)
    have_sass = {arch for kinds in code.values() for arch in kinds["sass"]}
    have_ptx = {arch for kinds in code.values() for arch in kinds["ptx"]}
    found: list[str] = []
    found += [
        f"SASS for {arch} was asked for but no artifact carries it" for arch in sorted(want_sass - have_sass)
    ]
    found += [
        f"PTX for {arch} was asked for but no artifact carries it" for arch in sorted(want_ptx - have_ptx)
    ]
    for artifact, kinds in sorted(code.items()):
        extra = sorted(set(kinds["sass"]) - want_sass, key=_order)
        if extra:
            found.append(f"{artifact} carries SASS for {', '.join(extra)}, which nobody asked for")
    return found


def check_device_code(out: Path, requested: Sequence[str], log_path: str | None = None) -> DeviceCode:
    """The device code of a finished CUDA build in ``out``; BuildFailed naming each problem otherwise."""
    listing = out / LISTING
    if not listing.is_file():
        raise BuildFailed(
            f"the CUDA build wrote no {LISTING}: its device code cannot be checked",
            command=["cuobjdump"],
            returncode=0,
            tail=[],
            log_path=log_path,
            hint="the builder image needs cuobjdump on PATH",
        )
    code = parse_listing(listing.read_text(encoding="utf-8"))
    found = problems(code, requested)
    if found:
        raise BuildFailed(
            "the CUDA build's device code does not match --arch "
            + ",".join(requested)
            + ": "
            + "; ".join(found),
            command=["cuobjdump", "--list-elf", "--list-ptx"],
            returncode=0,
            tail=listing.read_text(encoding="utf-8").splitlines()[-40:],
            log_path=log_path,
            hint="check CMAKE_CUDA_ARCHITECTURES in the plan (`invoke build --dry-run`) and any --cmake override",
        )
    return code
