"""Resolve a SOURCE given by a person (``llama-cpp-python==0.3.35``, ``https://github.com/ggml-org/llama.cpp@<commit>``
or an archive and its sha256) to a pinned recipe ``[source]`` and its extracted llama.cpp tree.

Everything the pin holds is read or measured, never assumed: the sha256 is computed from the file that was
downloaded (and checked against ``--sha256`` when one is given), the commit and its date are read from git
metadata (:mod:`llamaforge.build.upstream.source_facts`). llama.cpp's build number is ``git rev-list --count
HEAD``, which a shallow or absent history cannot give: it comes from the caller, a full clone, an archive named
for its tag (``llama.cpp-bNNNN.tar.gz``) or a shipped recipe that pins the same commit; otherwise it is unknown
(``build_number`` None, here and in the recipe source; a build of it reports llama.cpp's own "unknown", 0).

Nothing is published until the source is known good: a download goes to a scratch directory and enters the
cache (:func:`llamaforge.build.source.fetch_source`, whose extracted tree a later build reuses) only once it is
verified and its llama.cpp tree found.
"""

from __future__ import annotations

import datetime
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict

from llamaforge.build.download import download_url, sha256_file
from llamaforge.build.git import SAFE_ENV, git_command
from llamaforge.build.pypi import download_sdist
from llamaforge.build.recipes import (
    ArchiveSource,
    GitSource,
    PypiSdistSource,
    Source,
    is_scp_like,
)
from llamaforge.build.source import (
    check_clone_url,
    fetch_source,
    mirror_dirs,
    sdist_file_name,
)
from llamaforge.build.upstream.source_facts import (
    COMMIT,
    ArchiveFacts,
    CommitFacts,
    committer_time,
    find_build_number,
    inspect_archive,
    read_head,
    tree_git_dir,
)
from llamaforge.core.errors import ChecksumMismatch, InvalidOption, SourceError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import check_file_path
from llamaforge.core.paths import home, write_text_atomic
from llamaforge.runners.process import LOCAL, ProcessRunner

FORMS = (
    "PACKAGE==VERSION (a PyPI sdist that vendors llama.cpp, e.g. llama-cpp-python==0.3.36), "
    "GIT_URL@<40-hex commit> (e.g. https://github.com/ggml-org/llama.cpp@0c1e570…), "
    "or an archive (path, file:// or https:// URL of a .tar.gz/.tar.xz/.tar) with --sha256"
)
_PIP = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9._+!-]*)$")
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PinnedSource(BaseModel):
    """A resolved SOURCE: the recipe ``[source]`` value that pins it, and its extracted llama.cpp tree."""

    model_config = ConfigDict(frozen=True)

    source: Source  # ready for a recipe; its build_number is None when the number is unknown
    tree: Path  # the cached, extracted llama.cpp tree (read-only: builds work on a copy)
    commit: str
    date: datetime.date | None  # the commit's date (UTC), SOURCE_DATE_EPOCH of its builds
    build_number: int | None  # None: unknown (a shallow history and nothing else that names it)
    build_number_from: str  # where the number came from, or why it is unknown
    sha256: str | None  # of the archive or sdist file; None for a git source
    origin: str  # the SOURCE as a person reads it
    seconds: float  # how long resolving took (download, checks, extraction)

    @property
    def build_number_known(self) -> bool:
        """True when the build number was read or given, not unknown."""
        return self.build_number is not None


@dataclass(frozen=True)
class _Spec:
    kind: Literal["pypi-sdist", "git", "archive"]
    location: str  # package, URL or path
    version: str = ""
    commit: str | None = None


def _bad(spec: str, why: str) -> InvalidOption:
    return InvalidOption(f"source {spec!r}: {why}", hint=f"give one of: {FORMS}")


def _git_repository(path: Path) -> bool:
    """Whether ``path`` is a git repository: a work tree's ``.git``, or a bare repository's own layout."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def parse_spec(spec: str) -> _Spec:
    """The form of a SOURCE string, checked: a pip spec, a git URL with a full commit, or an archive."""
    text = spec.strip()
    if not text:
        raise _bad(spec, "empty")
    if "==" in text and "/" not in text:
        match = _PIP.fullmatch(text)
        if match is None:
            raise _bad(spec, "not a PACKAGE==VERSION pin (letters, digits, '.', '_', '-')")
        return _Spec("pypi-sdist", match.group(1), version=match.group(2))
    base, commit = text, None
    head, at, tail = text.rpartition("@")
    if at and head and "/" not in tail and ":" not in tail:
        base, commit = head, tail.lower()
        if not COMMIT.fullmatch(commit):
            raise _bad(spec, f"{tail!r} is not a full 40-hex commit (short hashes, tags and branches move)")
    path = unquote(urlsplit(base).path) if "://" in base else base
    if path.lower().endswith(".zip"):
        raise _bad(spec, "zip archives are not read; use the .tar.gz of the same release")
    if path.lower().endswith(_ARCHIVE_SUFFIXES) or ("://" not in base and Path(base).expanduser().is_file()):
        return _Spec("archive", base, commit=commit)
    remote_git = re.match(r"^(https?|ssh|git|file)://", base) or is_scp_like(base)
    if remote_git or Path(base).expanduser().is_dir():
        if not remote_git and not _git_repository(Path(base).expanduser()):
            raise _bad(
                spec,
                "a directory is read as a git repository, and this one is none (no .git): give an archive of "
                "the tree with --sha256, or a repository@<40-hex commit>",
            )
        if commit is None:
            raise _bad(spec, "a git source needs its full commit: URL@<40-hex commit>")
        return _Spec("git", base, commit=commit)
    if re.fullmatch(r"[bB][0-9]+", text):
        raise _bad(
            spec,
            "a release tag names no fixed source (tags move): give GIT_URL@<40-hex commit> of that release, or "
            "the PACKAGE==VERSION sdist that vendors it",
        )
    raise _bad(spec, "not a pip pin, a git URL or an existing archive")


def resolve_source(
    spec: str,
    *,
    sha256: str | None = None,
    build_number: int | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> PinnedSource:
    """Download (or find in the cache or a mirror), verify and pin ``spec``; see the module docstring.

    ``sha256`` must match the archive or sdist file when given (required for an archive fetched over the
    network); ``build_number`` is llama.cpp's build number when the caller knows it. ``runner`` runs git; an
    sdist is downloaded from the package index and never run (no pip). Raises InvalidOption for a malformed
    SOURCE, ChecksumMismatch, SourceError for everything else.
    """
    started = time.monotonic()
    parsed = parse_spec(spec)
    if sha256 is not None:
        sha256 = sha256.strip().lower()
        if not _SHA256.fullmatch(sha256):
            raise InvalidOption(f"--sha256 {sha256!r} is not 64 hex digits", hint="copy the whole sha256")
    if build_number is not None and build_number < 0:
        raise InvalidOption(f"--build-number {build_number} is negative", hint="llama.cpp's bNNNN number")
    if parsed.kind == "git" and sha256 is not None:
        raise _bad(spec, "a git source is pinned by its commit; --sha256 is for archives and sdists")
    scratch_root = home() / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="resolve-", dir=scratch_root))
    try:
        if parsed.kind == "git":
            pinned = _resolve_git(parsed, spec, build_number, reporter, cancel, runner, scratch)
        else:
            pinned = _resolve_archive(parsed, spec, sha256, build_number, reporter, cancel, runner, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return pinned.model_copy(update={"seconds": round(time.monotonic() - started, 2)})


def _resolve_archive(
    parsed: _Spec,
    spec: str,
    sha256: str | None,
    given: int | None,
    reporter: Reporter,
    cancel: CancelToken | None,
    runner: ProcessRunner,
    scratch: Path,
) -> PinnedSource:
    file, downloaded = _obtain(parsed, spec, sha256, reporter, cancel, scratch)
    reporter(Event("info", f"sha256 of {file.name}", stage="source"))
    actual = sha256_file(file, cancel)
    origin = f"{parsed.location}=={parsed.version}" if parsed.kind == "pypi-sdist" else parsed.location
    if sha256 is not None and actual != sha256:
        raise ChecksumMismatch(
            f"sha256 mismatch for {origin}: expected {sha256}, got {actual}",
            hint="nothing was kept; check where --sha256 came from, or drop it to pin what was downloaded",
        )
    reporter(Event("info", f"reading {file.name}", stage="source"))
    facts, git_dirs = inspect_archive(file, origin, scratch / "git", cancel)
    found = _archive_commit(facts, git_dirs, parsed.commit, origin, runner, cancel)
    number, number_from = find_build_number(
        given,
        found.commit,
        counted=None,
        names=[] if parsed.kind == "pypi-sdist" else [Path(urlsplit(parsed.location).path).name, facts.top],
    )
    date = found.committed.date() if found.committed else None
    source: ArchiveSource | PypiSdistSource
    if parsed.kind == "pypi-sdist":
        source = PypiSdistSource(
            kind="pypi-sdist",
            package=parsed.location,
            version=parsed.version,
            sha256=actual,
            subdir=facts.subdir,
            commit=found.commit,
            build_number=number,
            date=date,
        )
    else:
        source = ArchiveSource(
            kind="archive",
            url=parsed.location,
            sha256=actual,
            subdir=facts.subdir,
            commit=found.commit,
            build_number=number,
            date=date,
        )
    if downloaded:  # publish the verified file where fetch_source looks first: it is not fetched twice
        downloads = home() / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        file.replace(downloads / f"{actual}.archive")
        if parsed.kind == "pypi-sdist":
            name = sdist_file_name(parsed.location, parsed.version)
            write_text_atomic(downloads / f"{name}.sha256", f"{actual}\n")
    tree = fetch_source(source, reporter=reporter, cancel=cancel, runner=runner)
    return PinnedSource(
        source=source,
        tree=tree,
        commit=found.commit,
        date=date,
        build_number=number,
        build_number_from=number_from,
        sha256=actual,
        origin=f"{origin} (llama.cpp {found.commit[:7]}, commit read from {found.found_in})",
        seconds=0.0,
    )


def _obtain(
    parsed: _Spec,
    spec: str,
    sha256: str | None,
    reporter: Reporter,
    cancel: CancelToken | None,
    scratch: Path,
) -> tuple[Path, bool]:
    """The archive file to read, and whether it was downloaded into ``scratch`` (else it is read in place: a
    mirror copy, a local file or the download cache)."""
    if sha256 is not None and (cached := home() / "downloads" / f"{sha256}.archive").is_file():
        return cached, False
    if parsed.kind == "pypi-sdist":
        name = sdist_file_name(parsed.location, parsed.version)
        for mirror in mirror_dirs():
            if (mirror / name).is_file():
                reporter(Event("info", f"using mirror copy {mirror / name}", stage="source"))
                return mirror / name, False
        if (known := _downloaded_sdist(name)) is not None:
            reporter(Event("info", f"using {name}, downloaded before", stage="source"))
            return known, False
        (scratch / "sdist").mkdir()
        sdist = download_sdist(
            parsed.location, parsed.version, scratch / "sdist", cancel=cancel, reporter=reporter
        )
        return sdist, True
    url = parsed.location
    if url.startswith(("https://", "http://")):
        if sha256 is None:
            raise _bad(spec, "an archive fetched over the network needs its sha256 (--sha256 HEX)")
        target = scratch / "archive"
        download_url(url, target, reporter, cancel)
        return target, True
    path = Path(unquote(urlsplit(url).path) if url.startswith("file://") else url).expanduser().absolute()
    check_file_path("source archive", path)
    if not path.is_file():
        raise SourceError(f"archive {path} does not exist", hint="check the path")
    return path, False


def _downloaded_sdist(name: str) -> Path | None:
    """The sdist file ``name`` as an earlier resolution downloaded it, when it is still in the download cache.
    PyPI never lets a file name be uploaded twice, so the name pins the bytes; they are hashed again anyway."""
    record = home() / "downloads" / f"{name}.sha256"
    if not record.is_file():
        return None
    archive = home() / "downloads" / f"{record.read_text(encoding='utf-8').strip()}.archive"
    return archive if archive.is_file() else None


def _archive_commit(
    facts: ArchiveFacts,
    git_dirs: dict[str, Path],
    named: str | None,
    origin: str,
    runner: ProcessRunner,
    cancel: CancelToken | None,
) -> CommitFacts:
    """The commit of the archive's tree: from its git directory, its git-archive header or the SOURCE's
    ``@commit``; a named commit that differs from the one the archive carries is refused."""
    found = facts.commit
    if found is None and (located := tree_git_dir(facts, git_dirs)) is not None:
        found = read_head(located[1], located[0], runner, cancel)
    if found is not None and named is not None and found.commit != named:
        raise SourceError(
            f"{origin} holds llama.cpp {found.commit} (read from {found.found_in}), not {named}",
            hint="check the commit after '@', or drop it to pin what the archive holds",
        )
    if found is not None:
        return found
    if named is not None:
        return CommitFacts(named, None, "the SOURCE")
    raise SourceError(
        f"cannot tell which llama.cpp commit {origin} holds: it carries no git metadata and no git-archive header",
        hint="name the commit the archive was made from: ARCHIVE@<40-hex commit>",
    )


def _resolve_git(
    parsed: _Spec,
    spec: str,
    given: int | None,
    reporter: Reporter,
    cancel: CancelToken | None,
    runner: ProcessRunner,
    scratch: Path,
) -> PinnedSource:
    assert parsed.commit is not None
    url = parsed.location
    local = Path(unquote(urlsplit(url).path) if url.startswith("file://") else url).expanduser().absolute()
    if url.startswith("file://") or ("://" not in url and not is_scp_like(url)):
        check_file_path("source repository", local)
        url = str(local) if "://" not in url else url
    url = check_clone_url(url, what="source URL", hint=f"give one of: {FORMS}")
    clone = scratch / "clone"

    def git(*args: str, cwd: Path | None = clone) -> str | None:
        result = runner.run(git_command(*args), cwd=cwd, env=SAFE_ENV, cancel=cancel, warn=True)
        return result.stdout if result.exit_code == 0 else None

    reporter(Event("info", f"git clone {url}", stage="source"))
    result = runner.run(
        git_command("clone", "--quiet", "--no-checkout", "--", url, str(clone)),
        env=SAFE_ENV,
        cancel=cancel,
        warn=True,
    )
    if result.exit_code != 0:
        raise SourceError(
            f"git clone {parsed.location} failed: {result.stderr.strip()}",
            hint="check the URL and the network, or use an archive (with --sha256) or a PyPI sdist",
        )
    commit = parsed.commit
    raw = git("cat-file", "commit", commit)
    if raw is None:
        raise SourceError(
            f"commit {commit} is not in {parsed.location}",
            hint="check the commit (a full 40-hex commit of that repository)",
        )
    committed = committer_time(raw)
    shallow = (git("rev-parse", "--is-shallow-repository") or "").strip() == "true"
    count = None if shallow else git("rev-list", "--count", commit)
    counted = int(count) if count and count.strip().isdigit() else None
    number, number_from = find_build_number(given, commit, counted=counted, names=[])
    date = committed.date() if committed else None
    # The cache is keyed by the commit alone: fetching from the clone fills the entry the real URL would.
    fetch_source(
        GitSource(kind="git", url=str(clone), commit=commit, build_number=number, date=date),
        reporter=reporter,
        cancel=cancel,
        runner=runner,
    )
    source = GitSource(kind="git", url=parsed.location, commit=commit, build_number=number, date=date)
    return PinnedSource(
        source=source,
        tree=fetch_source(source, reporter=reporter, cancel=cancel, runner=runner),
        commit=commit,
        date=date,
        build_number=number,
        build_number_from=number_from,
        sha256=None,
        origin=f"{parsed.location}@{commit[:12]}" + (" (shallow history)" if shallow else ""),
        seconds=0.0,
    )
