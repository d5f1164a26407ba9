"""Fetch and cache the llama.cpp source: git (full commit, verified), archives and PyPI sdists (sha256).

The cache is content-addressed (``sources/<sha256-or-commit>/tree``) and written atomically: a tree is
extracted into a temporary directory and renamed into place only when complete. Builds never modify it;
they work on a copy (``make_workspace``). A mirror directory (``LLAMAFORGE_SOURCE_MIRROR``) serves archives on
machines that reach no network.

A remote URL goes through the running front's URL policy (:func:`llamaforge.core.guard.check_url`) before it is
fetched, and so does every redirect it answers with (an https download never continues over plain http). git
runs with the settings of :mod:`llamaforge.build.git`, and a clone gets ``--`` before its URL.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from llamaforge.build.download import download_url, sha256_file
from llamaforge.build.git import SAFE_ENV, git_command
from llamaforge.build.pypi import download_sdist
from llamaforge.build.recipes import ArchiveSource, GitSource, PypiSdistSource, check_git_url, is_scp_like
from llamaforge.core.errors import ChecksumMismatch, SourceError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import check_ssh_host, check_url
from llamaforge.core.paths import cache_lock, home
from llamaforge.runners.process import LOCAL, ProcessResult, ProcessRunner

SourceSpec = GitSource | ArchiveSource | PypiSdistSource


def source_id(source: SourceSpec) -> str:
    """Content address of a source tree: ``git-<commit>``, or the archive's sha256 (with a digest of the
    ``subdir`` unpacked from it when there is one: another subdir of one archive is another tree)."""
    if isinstance(source, GitSource):
        return f"git-{source.commit}"
    if not source.subdir:
        return source.sha256
    return f"{source.sha256}-{hashlib.sha256(source.subdir.encode()).hexdigest()[:12]}"


def mirror_dirs() -> list[Path]:
    """The mirror directories of LLAMAFORGE_SOURCE_MIRROR (os.pathsep-separated), searched before any download."""
    raw = os.environ.get("LLAMAFORGE_SOURCE_MIRROR", "")
    return [Path(part) for part in raw.split(os.pathsep) if part]


def sdist_file_name(package: str, version: str) -> str:
    """The file name pip gives the sdist of ``package==version`` (``llama_cpp_python-0.3.36.tar.gz``): the name a
    mirror directory holds it under."""
    return f"{package.replace('-', '_')}-{version}.tar.gz"


def _archive_name(source: ArchiveSource | PypiSdistSource) -> str:
    if isinstance(source, PypiSdistSource):
        return sdist_file_name(source.package, source.version)
    return PurePosixPath(urllib.parse.urlparse(source.url).path).name or "archive"


def _verify(path: Path, expected: str, origin: str, cancel: CancelToken | None) -> None:
    actual = sha256_file(path, cancel)
    if actual != expected:
        quarantine = path.with_name(path.name + f".sha256-{actual[:12]}.rejected")
        path.replace(quarantine)
        raise ChecksumMismatch(
            f"sha256 mismatch for {origin}: expected {expected}, got {actual}",
            hint=f"the file was moved to {quarantine}; if the new file is trusted, pin its sha256 in the recipe",
        )


def _fetch_archive_file(
    source: ArchiveSource | PypiSdistSource,
    directory: Path,
    reporter: Reporter,
    cancel: CancelToken | None,
) -> Path:
    """Return a verified archive file for ``source`` under ``directory`` (downloading if needed)."""
    final = directory / f"{source.sha256}.archive"
    if final.is_file():
        # Kept whole once (verified, renamed in); read again only to extract a tree that is missing, so the
        # check is cheap next to the extraction. A copy cut or changed since is fetched afresh.
        if sha256_file(final, cancel) == source.sha256:
            return final
        reporter(Event("warning", f"{final} no longer has its sha256: fetching it again", stage="source"))
        final.unlink()
    name = _archive_name(source)
    partial = directory / f"{source.sha256}.part"
    for mirror in mirror_dirs():
        for candidate in (mirror / name, mirror / source.sha256):
            if candidate.is_file():
                reporter(Event("info", f"using mirror copy {candidate}", stage="source"))
                shutil.copyfile(candidate, partial)
                _verify(partial, source.sha256, str(candidate), cancel)
                partial.replace(final)
                return final
    if isinstance(source, PypiSdistSource):
        # Downloaded from the package index, never through pip: pip runs an sdist's build backend first.
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            sdist = download_sdist(
                source.package, source.version, Path(scratch), cancel=cancel, reporter=reporter
            )
            shutil.move(str(sdist), partial)
        _verify(partial, source.sha256, f"{source.package}=={source.version}", cancel)
        partial.replace(final)
        return final
    url = source.url
    if "://" not in url:
        path = Path(url).expanduser()
        if not path.is_file():
            raise SourceError(f"archive {path} does not exist", hint="fix source.url in the recipe")
        shutil.copyfile(path, partial)
    elif url.startswith(("https://", "http://", "file://")):
        download_url(url, partial, reporter, cancel)
    else:
        raise SourceError(f"unsupported archive URL {url!r}", hint="use https://, file:// or a local path")
    _verify(partial, source.sha256, url, cancel)
    partial.replace(final)
    return final


def _extract(archive: Path, subdir: str, target: Path, cancel: CancelToken | None) -> None:
    import tarfile  # only when a source is unpacked, never on a cache hit

    prefix = PurePosixPath(subdir) if subdir else None
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                if cancel:
                    cancel.raise_if_cancelled()
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts:
                    raise SourceError(
                        f"archive {archive} has member {member.name!r} that escapes the target directory",
                        hint="this archive is unsafe; check where it came from",
                    )
                if prefix is not None:
                    if name == prefix or prefix not in name.parents:
                        continue
                    name = name.relative_to(prefix)
                # A vendored checkout keeps a stale submodule `.git` pointer file: it breaks build-info.
                if name == PurePosixPath(".git") or (name.parts and name.parts[0] == ".git"):
                    continue
                member.name = str(name)
                if member.issym() or member.islnk():
                    link = PurePosixPath(member.linkname)
                    if member.islnk() and prefix is not None and prefix in link.parents:
                        member.linkname = str(link.relative_to(prefix))
                tar.extract(member, target, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise SourceError(f"cannot extract {archive}: {error}", hint="the archive may be corrupt") from None
    if not any(target.iterdir()):
        raise SourceError(f"archive {archive} has nothing under {subdir!r}", hint="fix source.subdir")


def check_clone_url(url: str, *, what: str, hint: str) -> str:
    """``url`` when git may clone it (:func:`~llamaforge.build.recipes.check_git_url`) and the front's URL and SSH
    host policies allow its host; ``what`` names it in errors, ``hint`` says how to fix a malformed one."""
    try:
        url = check_git_url(url)  # a clone never gets an option
    except ValueError as error:
        raise SourceError(str(error), hint=hint) from None
    if is_scp_like(url):
        check_ssh_host(url.partition(":")[0].rpartition("@")[2], what=f"{what} host")
    else:
        check_url(url, what=what)
        if urllib.parse.urlsplit(url).scheme.lower() == "ssh":
            check_ssh_host(urllib.parse.urlsplit(url).hostname or "", what=f"{what} host")
    return url


def _git_checkout(
    source: GitSource, target: Path, reporter: Reporter, cancel: CancelToken | None, runner: ProcessRunner
) -> None:
    def git(*args: str, cwd: Path | None = None) -> ProcessResult:
        return runner.run(git_command(*args), cwd=cwd, env=SAFE_ENV, cancel=cancel, warn=True)

    url = check_clone_url(source.url, what="recipe source.url", hint="fix source.url in the recipe")
    reporter(Event("info", f"git clone {url}", stage="source"))
    clone = git("clone", "--quiet", "--no-checkout", "--", url, str(target))
    if clone.exit_code != 0:
        raise SourceError(
            f"git clone {source.url} failed: {clone.stderr.strip()}",
            hint="check the URL and network, or use an archive source with a mirror directory",
        )
    if git("cat-file", "-e", f"{source.commit}^{{commit}}", cwd=target).exit_code != 0:
        raise SourceError(
            f"commit {source.commit} not found in {source.url}",
            hint="check source.commit in the recipe (a full 40-hex commit of that repository)",
        )
    checkout = git("checkout", "--quiet", "--detach", source.commit, cwd=target)
    head = git("rev-parse", "HEAD", cwd=target).stdout.strip()
    if checkout.exit_code != 0 or head != source.commit:
        raise SourceError(f"could not check out {source.commit}: {checkout.stderr.strip()}")
    shutil.rmtree(target / ".git")


def fetch_source(
    source: SourceSpec,
    *,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> Path:
    """Return the cached, verified source tree for ``source``, fetching it first if needed (``runner`` runs
    git; an sdist is downloaded from the package index, never run)."""
    root = home() / "sources"
    root.mkdir(parents=True, exist_ok=True)
    entry = root / source_id(source)
    tree = entry / "tree"
    if (entry / "complete").is_file():
        return tree
    with cache_lock(root / f"{source_id(source)}.lock"):  # a cached source needs no lock
        if (entry / "complete").is_file():
            return tree
        downloads = home() / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
        try:
            staged = scratch / "tree"
            staged.mkdir()
            if isinstance(source, GitSource):
                shutil.rmtree(staged)
                _git_checkout(source, staged, reporter, cancel, runner)
            else:
                archive = _fetch_archive_file(source, downloads, reporter, cancel)
                reporter(Event("info", f"extracting {archive.name}", stage="source"))
                _extract(archive, source.subdir, staged, cancel)
            (scratch / "complete").write_text(source_id(source) + "\n", encoding="utf-8")
            if entry.exists():
                shutil.rmtree(entry)
            scratch.rename(entry)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return tree


@contextmanager
def make_workspace(tree: Path, parent: Path | None = None) -> Iterator[Path]:
    """A private, writable copy of ``tree`` for patching and building; always removed afterwards."""
    base = parent or home() / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="workspace-", dir=base))
    try:
        copy = scratch / "src"
        shutil.copytree(tree, copy, symlinks=True)
        yield copy
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
