"""The patch queue: ``patches/<series>/series`` lists ``*.patch`` files applied in order to a fresh copy.

Each line names a file of the series directory itself: a plain file name (no path, no ``/``, ``\\`` or ``..``),
and not a link that leads out of the directory.

A line may end in the platforms its patch is for, in brackets (``0002-fix.patch [windows]`` or
``[windows, macos]``); a build for another platform leaves that patch out (and its key does not change).

A patch that does not apply fails naming the patch file, the file it touches and the hunk; the partly patched
copy is removed, so no half-patched tree is ever left behind. The source cache is never modified.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from llamaforge.build.git import SAFE_ENV, git_command
from llamaforge.build.names import PlatformName
from llamaforge.core.errors import PatchError
from llamaforge.core.paths import data_dir
from llamaforge.runners.process import LOCAL, ProcessRunner


@dataclass(frozen=True)
class PatchRef:
    """One patch of a series, identified by file name and content hash; ``platforms`` are those it applies to
    (empty: every platform)."""

    name: str
    path: Path
    sha256: str
    platforms: tuple[str, ...] = ()

    def applies_to(self, platform: str) -> bool:
        """True when the patch belongs to a build for ``platform``."""
        return not self.platforms or platform in self.platforms


def series_dir(series: str | Path) -> Path:
    """Directory of a series: a path, or a name under the shipped ``patches/`` folder."""
    candidate = Path(series)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    return data_dir("patches") / series


# A series line: the patch file, optionally followed by the platforms it is for in brackets, and a comment:
#   0002-ggml-cpu-mingw-power-throttling.patch  [windows]   # why
_LINE = re.compile(r"^(?P<name>[^\s\[\]]+)(?:\s+\[(?P<platforms>[^\]]*)\])?$")


def _parse_line(listing: Path, number: int, text: str) -> tuple[str, tuple[str, ...]]:
    """The patch name and platforms of one series line (comment and blanks stripped)."""
    found = _LINE.match(text)
    if found is None:
        raise PatchError(
            f"{listing}:{number}: {text!r} is not a series line",
            patch=text,
            hint="write one patch per line: NAME.patch, optionally followed by [platform, ...] "
            "(e.g. 0002-fix.patch [windows])",
        )
    name, listed = found.group("name"), found.group("platforms")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise PatchError(
            f"{listing}:{number}: {name!r} is not a plain file name",
            patch=name,
            hint="a series lists the patch files of its own directory by name (0002-fix.patch): no path, no "
            "'/', '\\' or '..'",
        )
    if listed is None:
        return name, ()
    platforms = tuple(item.strip() for item in listed.split(",") if item.strip())
    known = sorted(get_args(PlatformName))
    unknown = [item for item in platforms if item not in known]
    if unknown or not platforms:
        what = f"unknown platform(s) {', '.join(map(repr, unknown))}" if unknown else "no platform in [...]"
        raise PatchError(
            f"{listing}:{number}: patch {name!r} names {what}",
            patch=name,
            hint="the platforms in [...] are one or more of " + ", ".join(known) + ", separated by commas",
        )
    return name, platforms


def read_series(
    series: str | Path | None, platform: str | None = None, *, new: bool = False
) -> list[PatchRef]:
    """The patches of ``series`` in order (empty for ``None``); with ``platform``, only those that apply to it
    (every line is checked either way). A directory without a ``series`` file is no series and is refused,
    unless ``new`` (``patches.new`` starting one)."""
    if series is None:
        return []
    directory = series_dir(series)
    if not directory.is_dir():
        raise PatchError(
            f"{directory} is a file, not a patch series directory"
            if directory.exists()
            else f"patch series directory {directory} does not exist",
            patch=str(series),
            hint="give the directory that holds the series file and its patches (a name under patches/, e.g. "
            "llama.cpp)",
        )
    listing = directory / "series"
    if not listing.is_file():
        if new:
            return []
        raise PatchError(
            f"{directory} is no patch series: it has no series file",
            patch=str(series),
            hint="a series directory holds a file named series that lists its patches in order "
            "(invoke patches.new starts one)",
        )
    try:
        lines = listing.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise PatchError(
            f"{listing} is not UTF-8 text (byte {error.start}: {error.reason})",
            patch=str(series),
            hint="a series file lists its patches by name, one a line, in UTF-8",
        ) from None
    refs: list[PatchRef] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        name, platforms = _parse_line(listing, number, text)
        if name in seen:
            raise PatchError(
                f"{listing}:{number}: patch {name!r} is listed twice (first on line {seen[name]})",
                patch=name,
                hint="list each patch once; a patch for several platforms names them all in one line: "
                f"{name} [windows, macos]",
            )
        seen[name] = number
        path = directory / name
        if path.is_symlink() and not path.resolve().is_relative_to(directory.resolve()):
            raise PatchError(
                f"{listing}:{number}: patch {name!r} is a link to {path.resolve()}, outside the series directory",
                patch=name,
                hint="put the patch file itself in the series directory",
            )
        if not path.is_file():
            raise PatchError(
                f"{listing}:{number}: patch {name!r} is listed but missing",
                patch=name,
                hint=f"add {path} or remove the line from the series file",
            )
        data = path.read_bytes()
        if _converted_to_crlf(data):
            raise PatchError(
                f"{listing}:{number}: patch {name!r} has Windows line endings (CRLF): a checkout or an editor "
                "converted it, and git cannot apply it to llama.cpp's LF sources",
                patch=name,
                hint=f"convert it back to LF line endings (e.g. `dos2unix {path}`); the repository's "
                ".gitattributes keeps patches LF in a fresh checkout, also with core.autocrlf",
            )
        ref = PatchRef(name=name, path=path, sha256=hashlib.sha256(data).hexdigest(), platforms=platforms)
        if platform is None or ref.applies_to(platform):
            refs.append(ref)
    return refs


def _converted_to_crlf(data: bytes) -> bool:
    """Whether a patch's own header lines (which git writes, never the source) end in CRLF: the whole file was
    converted (git's core.autocrlf on Windows, an editor), and its hunks no longer match. Hunks that change a
    CRLF file legitimately hold CR in their lines, so only the headers tell."""
    return any(
        line.startswith((b"diff --git ", b"--- a/", b"+++ b/")) and line.endswith(b"\r")
        for line in data.split(b"\n")
    )


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)")


def _hunk_at(patch_text: str, target: str, line: int) -> tuple[int, str] | None:
    """Number (1-based within ``target``) and header of the hunk that starts at ``line`` of ``target``."""
    current: str | None = None
    number = 0
    best: tuple[int, str] | None = None
    for text in patch_text.splitlines():
        file_match = _FILE.match(text)
        if file_match:
            current, number = file_match.group(1), 0
            continue
        hunk = _HUNK.match(text)
        if hunk and current == target:
            number += 1
            start = int(hunk.group(1))
            if start <= line and (best is None or start >= int(_HUNK.match(best[1]).group(1))):  # type: ignore[union-attr]
                best = (number, text)
    return best


def _explain_failure(patch: PatchRef, stderr: str) -> PatchError:
    failed = re.search(r"patch failed: (\S+):(\d+)", stderr)
    missing = re.search(r"error: (\S+): No such file or directory", stderr)
    if failed:
        file, line = failed.group(1), int(failed.group(2))
        hunk = _hunk_at(patch.path.read_text(encoding="utf-8", errors="replace"), file, line)
        where = f"hunk #{hunk[0]} ({hunk[1]})" if hunk else f"the hunk at line {line}"
        return PatchError(
            f"patch {patch.name} does not apply: {file}: {where} no longer matches the source",
            patch=patch.name,
            file=file,
            hunk=hunk[0] if hunk else None,
            hint="refresh the patch against this llama.cpp version (`invoke patches.refresh`) or drop it from "
            "the series; git said: " + " / ".join(stderr.strip().splitlines()[:4]),
        )
    if missing:
        return PatchError(
            f"patch {patch.name} does not apply: {missing.group(1)} does not exist in the source",
            patch=patch.name,
            file=missing.group(1),
            hint="the file moved or was removed upstream; refresh the patch",
        )
    return PatchError(
        f"patch {patch.name} does not apply: {stderr.strip() or 'git apply failed'}",
        patch=patch.name,
        hint="check that the file is a unified diff made from the llama.cpp source root (git diff)",
    )


def apply_series(patches: list[PatchRef], tree: Path, runner: ProcessRunner = LOCAL) -> None:
    """Apply ``patches`` in order to ``tree`` (a private copy). On failure ``tree`` is deleted and
    ``PatchError`` names the patch, file and hunk."""
    # Stop git from discovering an enclosing repository, which would change how paths are resolved.
    env = {**SAFE_ENV, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    for patch in patches:
        arguments = ["--whitespace=nowarn", "-p1", str(patch.path.resolve())]
        command = git_command("apply", *arguments)
        check = runner.run(git_command("apply", "--check", *arguments), cwd=tree, env=env, warn=True)
        if check.exit_code != 0:
            shutil.rmtree(tree, ignore_errors=True)
            raise _explain_failure(patch, check.stderr)
        result = runner.run(command, cwd=tree, env=env, warn=True)
        if result.exit_code != 0:
            shutil.rmtree(tree, ignore_errors=True)
            raise _explain_failure(patch, result.stderr)
