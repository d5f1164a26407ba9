"""What a source archive holds, read before anything is extracted into the cache: where its llama.cpp tree is,
and which commit it is, from the git metadata it carries.

A PyPI sdist of llama-cpp-python ships its submodule's (shallow) git directory at
``<pkg>-<ver>/.git/modules/vendor/llama.cpp/``: its ``HEAD`` is the vendored commit, whose object (with the
committer's timestamp) is in its packs. An archive made by ``git archive`` (GitHub's tag and commit tarballs) names
its commit in the pax global header's ``comment`` and gives every member the commit's time as its mtime. Only
the git directory's ``HEAD``, refs and objects are copied out, never its ``config`` (a repository's configuration
can make git run programs); git reads them with a configuration llamaforge wrote.
"""

from __future__ import annotations

import datetime
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llamaforge.build.git import SAFE_ENV, git_command
from llamaforge.build.recipes import load_recipe, recipe_dir
from llamaforge.core.errors import InvalidOption, RecipeError, SourceError
from llamaforge.core.events import CancelToken
from llamaforge.runners.process import ProcessRunner

COMMIT = re.compile(r"^[0-9a-f]{40}$")
_GIT_PARTS = frozenset({"HEAD", "packed-refs", "shallow", "objects", "refs"})
_TAG = re.compile(r"(?:^|[^A-Za-z0-9])b(\d{3,7})(?=$|[^0-9])")  # llama.cpp-bNNNN.tar.gz
_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"


@dataclass(frozen=True)
class CommitFacts:
    """A commit as read from git metadata: its id, committer time and where it was read."""

    commit: str
    committed: datetime.datetime | None  # UTC
    found_in: str


@dataclass(frozen=True)
class ArchiveFacts:
    """Where an archive's llama.cpp tree is and what it is."""

    subdir: str  # directory of the llama.cpp tree inside the archive ("" for the archive's root)
    top: str  # the archive's first path component ("llama_cpp_python-X.Y.Z", "llama.cpp-bNNNN")
    commit: CommitFacts | None


def _git_dir_of(parts: tuple[str, ...]) -> int | None:
    """Index of the first part inside a git directory that llamaforge reads (HEAD, objects …), for a member
    under ``.git/`` or ``.git/modules/<path>/``; None for any other member (config, hooks, index …)."""
    if ".git" not in parts:
        return None
    start = parts.index(".git") + 1
    if len(parts) > start and parts[start] in _GIT_PARTS:
        return start
    if len(parts) > start and parts[start] == "modules":
        for index in range(start + 2, len(parts)):
            if parts[index] == "logs":
                return None  # reflogs, which hold refs/ too: nothing git needs to read HEAD
            if parts[index] in _GIT_PARTS:
                return index
    return None


def inspect_archive(
    archive: Path, origin: str, scratch: Path, cancel: CancelToken | None
) -> tuple[ArchiveFacts, dict[str, Path]]:
    """Read ``archive`` once: find its llama.cpp tree and copy the git directories it carries to ``scratch``.

    Returns the facts (the commit only when a git-archive header names it) and the git directories found, by
    the path they have in the archive."""
    with_cmake: set[PurePosixPath] = set()
    with_header: set[PurePosixPath] = set()
    git_dirs: dict[str, Path] = {}
    members: dict[PurePosixPath, tarfile.TarInfo] = {}
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                if cancel:
                    cancel.raise_if_cancelled()
                name = PurePosixPath(member.name.removeprefix("./"))
                if name.is_absolute() or ".." in name.parts:
                    raise SourceError(
                        f"{origin}: member {member.name!r} escapes the target directory",
                        hint="this archive is unsafe; check where it came from",
                    )
                if member.isdir():
                    members[name] = member
                if name.name == "CMakeLists.txt":
                    with_cmake.add(name.parent)
                elif name.name == "llama.h" and name.parent.name == "include":
                    with_header.add(name.parent.parent)
                index = _git_dir_of(name.parts)
                if index is not None and member.isfile():
                    base = "/".join(name.parts[:index])
                    target = scratch / f"git-{len(git_dirs)}" if base not in git_dirs else git_dirs[base]
                    git_dirs.setdefault(base, target)
                    out = target.joinpath(*name.parts[index:])
                    out.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    if source is not None:
                        with source, out.open("wb") as handle:
                            shutil.copyfileobj(source, handle)
            pax_commit = tar.pax_headers.get("comment", "")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise SourceError(
            f"cannot read {origin}: {error}", hint="the archive may be corrupt or not a tar"
        ) from None
    roots = sorted(with_cmake & with_header, key=lambda path: (len(path.parts), str(path)))
    if not roots:
        raise SourceError(
            f"{origin} vendors no llama.cpp: no directory in it holds CMakeLists.txt and include/llama.h (an sdist "
            "that vendors it has vendor/llama.cpp)",
            hint="pick a source that vendors llama.cpp, e.g. llama-cpp-python==X.Y.Z, or a llama.cpp archive",
        )
    root = roots[0]
    subdir = "" if str(root) == "." else str(root)
    top = (root.parts or ("",))[0]
    commit = None
    if COMMIT.match(pax_commit):
        root_member = members.get(root)
        when = datetime.datetime.fromtimestamp(root_member.mtime, datetime.UTC) if root_member else None
        commit = CommitFacts(pax_commit, when, "the git archive header")
    return ArchiveFacts(subdir=subdir, top=top, commit=commit), git_dirs


def tree_git_dir(facts: ArchiveFacts, git_dirs: dict[str, Path]) -> tuple[str, Path] | None:
    """The git directory that belongs to the llama.cpp tree: ``<tree>/.git`` or, for a submodule,
    ``<top>/.git/modules/<path of the tree under top>``."""
    wanted = [f"{facts.subdir}/.git" if facts.subdir else ".git"]
    if facts.subdir and "/" in facts.subdir:
        top, _, rest = facts.subdir.partition("/")
        wanted.append(f"{top}/.git/modules/{rest}")
    for name in wanted:
        if name in git_dirs and (git_dirs[name] / "HEAD").is_file():
            return name, git_dirs[name]
    return None


def read_head(git_dir: Path, found_in: str, runner: ProcessRunner, cancel: CancelToken | None) -> CommitFacts:
    """The commit ``HEAD`` names in the copied git directory, and its committer time, read with git."""
    (git_dir / "config").write_text(_CONFIG, encoding="utf-8")
    (git_dir / "objects").mkdir(exist_ok=True)
    (git_dir / "refs").mkdir(exist_ok=True)

    def git(*args: str) -> str:
        result = runner.run(
            git_command(f"--git-dir={git_dir}", *args), env=SAFE_ENV, cancel=cancel, warn=True
        )
        if result.exit_code != 0:
            raise SourceError(
                f"cannot read the commit from {found_in}: git {args[0]}: {result.stderr.strip()}",
                hint="the git metadata in the archive is incomplete; give the commit as ARCHIVE@<40-hex commit>",
            )
        return result.stdout

    commit = git("rev-parse", "--verify", "HEAD^{commit}").strip()
    return CommitFacts(commit, committer_time(git("cat-file", "commit", commit)), found_in)


def committer_time(commit_object: str) -> datetime.datetime | None:
    """The committer time (UTC) of a raw commit object (``git cat-file commit``)."""
    for line in commit_object.splitlines():
        if not line:
            break  # the headers end at the first empty line
        match = re.match(r"^committer .* (\d+) [+-]\d{4}$", line)
        if match:
            return datetime.datetime.fromtimestamp(int(match.group(1)), datetime.UTC)
    return None


def find_build_number(
    given: int | None, commit: str, *, counted: int | None, names: list[str]
) -> tuple[int | None, str]:
    """llama.cpp's build number for ``commit`` and where it came from: the caller, a full clone's count, an
    archive named for its ``bNNNN`` tag, or a shipped recipe that pins the same commit. A given number that
    another of them contradicts is refused."""
    found: list[tuple[int, str]] = []
    if counted is not None:
        found.append((counted, "git rev-list --count of the clone"))
    for name in names:
        if match := _TAG.search(name):
            found.append((int(match.group(1)), f"the archive name {name}"))
            break
    for path in sorted(recipe_dir().glob("*.toml")):
        try:
            pinned = load_recipe(str(path)).source
        except RecipeError:
            continue
        if pinned.commit == commit and pinned.build_number is not None:
            found.append((pinned.build_number, f"recipe {path.stem} (pins the same commit)"))
            break
    if given is not None:
        for number, where in found:
            if number != given:
                raise InvalidOption(
                    f"build number {given} given, but {where} says {number} for llama.cpp {commit[:12]}",
                    hint=f"drop --build-number, or check it (llama.cpp's number is b{number} per {where})",
                )
        return given, "given by the caller"
    if found:
        return found[0]
    return None, "unknown: the history is shallow or absent and nothing else names it"
