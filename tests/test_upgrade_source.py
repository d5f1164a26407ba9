"""Resolving and pinning an upgrade SOURCE, for real: PyPI sdists (through the local mirror of the test sdists,
and pip against the real index for a version that does not exist), archives made here (``git archive`` of a
repository made here, and plain tars) and a git repository made here."""

from __future__ import annotations

import datetime
import hashlib
import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from conftest import require
from llamaforge.build.recipes import ArchiveSource, GitSource, PypiSdistSource
from llamaforge.build.source import source_id
from llamaforge.build.upstream.source_pin import parse_spec, resolve_source
from llamaforge.core.errors import ChecksumMismatch, InvalidOption, SourceError

pytestmark = pytest.mark.quick

COMMIT_0335 = "4df29be4f4c3673f428170fda944a5b19f743bb8"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TREE = {
    "CMakeLists.txt": b"cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp)\n",
    "include/llama.h": b"// llama.h\n",
    "src/llama.cpp": b"int llama(void) { return 0; }\n",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tar(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return _sha256(path)


def _left_behind(home: Path) -> list[str]:
    """Files a failed resolution left in the cache: none may be there."""
    return sorted(
        str(path.relative_to(home))
        for folder in ("sources", "downloads", "tmp")
        if (home / folder).is_dir()
        for path in (home / folder).rglob("*")
        if path.is_file() and not path.name.endswith(".lock")
    )


def _git(repo: Path, *args: str, when: int = 1_700_000_000) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": f"@{when} +0900",
        "GIT_COMMITTER_DATE": f"@{when} +0900",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A llama.cpp-shaped git repository with three commits, the last at 2023-11-14 22:13:20 UTC."""
    path = tmp_path / "llama.cpp"
    path.mkdir()
    _git(path, "init", "-q", "-b", "master")
    for number, (name, data) in enumerate(TREE.items()):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
        _git(path, "add", name)
        _git(path, "commit", "-q", "-m", f"add {name}", when=1_700_000_000 - 86_400 * (2 - number))
    return path


# --- the SOURCE forms -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "empty"),
        ("llama-cpp-python==", "not a PACKAGE==VERSION"),
        ("llama-cpp-python==0.3.36 --index-url x", "not a PACKAGE==VERSION"),
        ("https://github.com/ggml-org/llama.cpp@0c1e570", "not a full 40-hex commit"),
        ("https://github.com/ggml-org/llama.cpp@b11312", "not a full 40-hex commit"),
        ("https://github.com/ggml-org/llama.cpp", "needs its full commit"),
        ("git@github.com:ggml-org/llama.cpp", "needs its full commit"),
        ("https://example.com/llama.cpp-b1.zip", "zip archives"),
        ("no-such-thing", "not a pip pin, a git URL or an existing archive"),
        ("b1234", "a release tag names no fixed source (tags move)"),  # was "not a pip pin, a git URL …"
    ],
)
def test_bad_forms_are_refused_with_the_forms(spec: str, why: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        parse_spec(spec)
    assert why in caught.value.message
    assert "PACKAGE==VERSION" in (caught.value.hint or "")


def test_a_directory_that_is_no_git_repository_is_named_as_such(tmp_path: Path) -> None:
    # It said "a git source needs its full commit", and with one given, git failed on the directory later.
    for spec in (str(tmp_path), f"{tmp_path}@{'a' * 40}"):
        with pytest.raises(InvalidOption) as caught:
            parse_spec(spec)
        assert caught.value.message == (
            f"source {spec!r}: a directory is read as a git repository, and this one is none (no .git): give an "
            "archive of the tree with --sha256, or a repository@<40-hex commit>"
        )
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    assert parse_spec(f"{bare}@{'a' * 40}").kind == "git"  # a bare repository has no .git, and is one


def test_forms_parse() -> None:
    full = "0C1E57098BBA43AC29E6E3B677CDCEEBDD22334F"
    assert parse_spec("llama-cpp-python==0.3.35").kind == "pypi-sdist"
    git = parse_spec(f"https://github.com/ggml-org/llama.cpp@{full}")
    assert (git.kind, git.location, git.commit) == (
        "git",
        "https://github.com/ggml-org/llama.cpp",
        full.lower(),
    )
    assert parse_spec(f"git@github.com:ggml-org/llama.cpp@{full}").kind == "git"
    archive = parse_spec("https://github.com/ggml-org/llama.cpp/archive/refs/tags/b11312.tar.gz")
    assert (archive.kind, archive.commit) == ("archive", None)


def test_sha256_must_be_hex(lf_home: Path) -> None:
    with pytest.raises(InvalidOption, match="64 hex"):
        resolve_source("llama-cpp-python==0.3.35", sha256="abc")


# --- PyPI sdists --------------------------------------------------------------------------------------------


@pytest.fixture
def store(lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The suite's shared store (LLAMAFORGE_TEST_HOME) when there is one, so a tree another test (or a build)
    already extracted is a cache hit; a private home otherwise."""
    shared = os.environ.get("LLAMAFORGE_TEST_HOME")
    home = Path(shared) if shared else lf_home
    monkeypatch.setenv("LLAMAFORGE_HOME", str(home))
    return home


def test_sdist_0335_commit_date_and_sha256_read_not_assumed(
    sdist_dir: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdist = sdist_dir / "llama_cpp_python-0.3.35.tar.gz"
    require(sdist.is_file(), f"{sdist} missing (nox -s tests downloads it: llama-cpp-python==0.3.35)")
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(sdist_dir))
    pinned = resolve_source("llama-cpp-python==0.3.35")
    assert pinned.sha256 == _sha256(sdist)
    assert pinned.sha256 == "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"  # sha256sum
    assert pinned.commit == COMMIT_0335  # HEAD of the sdist's .git/modules/vendor/llama.cpp
    assert pinned.date == datetime.date(2026, 8, 16)  # committer 1786884793 +0200 (git cat-file -p HEAD)
    assert pinned.build_number is None  # a shallow submodule clone, and no recipe pins this commit
    assert pinned.build_number_from.startswith("unknown")
    assert isinstance(pinned.source, PypiSdistSource)
    assert pinned.source.subdir == "llama_cpp_python-0.3.35/vendor/llama.cpp"
    assert (pinned.source.build_number, pinned.source.sha256) == (None, pinned.sha256)
    assert (pinned.tree / "CMakeLists.txt").is_file()
    assert (pinned.tree / "include" / "llama.h").is_file()
    assert not (pinned.tree / ".git").exists()
    # the cache entry a build of it reuses: the sdist's sha256 and a digest of the subdir unpacked from it
    assert pinned.tree == store / "sources" / source_id(pinned.source) / "tree"
    assert source_id(pinned.source).startswith(pinned.sha256 + "-")
    again = resolve_source("llama-cpp-python==0.3.35", build_number=11200, sha256=pinned.sha256)
    assert (again.tree, again.build_number, again.build_number_from) == (
        pinned.tree,
        11200,
        "given by the caller",
    )
    assert again.source.build_number == 11200


def test_sdist_0336_reuses_the_recipe_build_number(
    sdist_dir: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(sdist_dir))
    pinned = resolve_source("llama-cpp-python==0.3.36")
    assert pinned.commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert (pinned.build_number, pinned.build_number_from) == (11312, "recipe default (pins the same commit)")
    assert pinned.date == datetime.date(2026, 10, 1)
    assert pinned.sha256 == _sha256(sdist_dir / "llama_cpp_python-0.3.36.tar.gz")
    with pytest.raises(InvalidOption, match="recipe default"):
        resolve_source("llama-cpp-python==0.3.36", build_number=11311)


def test_sdist_sha256_mismatch_keeps_nothing(
    sdist_dir: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(sdist_dir))
    with pytest.raises(ChecksumMismatch, match=r"llama-cpp-python==0\.3\.36: expected 0{64}"):
        resolve_source("llama-cpp-python==0.3.36", sha256="0" * 64)
    assert _left_behind(lf_home) == []


def test_version_without_sdist_is_told_quickly(lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMAFORGE_SOURCE_MIRROR", raising=False)
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        resolve_source("llama-cpp-python==0.0.999")
    if "could not be reached" in caught.value.message:
        pytest.skip("the package index is not reachable here")
    assert (
        caught.value.message == "llama-cpp-python==0.0.999: the package index has no sdist of version 0.0.999"
    )
    assert "0.3.36" in (caught.value.hint or "")  # the latest versions that have one
    assert time.monotonic() - started < 30
    assert _left_behind(lf_home) == []


def test_unreachable_index_is_a_network_error(lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMAFORGE_SOURCE_MIRROR", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(SourceError) as caught:
        resolve_source("llama-cpp-python==0.3.35")
    assert "could not be reached" in caught.value.message
    assert "LLAMAFORGE_SOURCE_MIRROR" in (caught.value.hint or "")
    assert _left_behind(lf_home) == []


def test_package_that_vendors_no_llama_cpp(
    tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _tar(mirror / "tiny_pkg-1.0.tar.gz", {"tiny_pkg-1.0/setup.py": b"", "tiny_pkg-1.0/CMakeLists.txt": b""})
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(mirror))
    with pytest.raises(SourceError, match=r"tiny-pkg==1\.0 vendors no llama\.cpp"):
        resolve_source("tiny-pkg==1.0")
    assert _left_behind(lf_home) == []


# --- archives -----------------------------------------------------------------------------------------------


def test_archive_named_for_its_tag(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "llama.cpp-b4242.tar.gz"
    sha = _tar(archive, {f"llama.cpp-b4242/{name}": data for name, data in TREE.items()})
    with pytest.raises(SourceError, match="carries no git metadata"):
        resolve_source(str(archive), sha256=sha)  # which commit? nothing says
    pinned = resolve_source(f"{archive}@{COMMIT}", sha256=sha)
    assert isinstance(pinned.source, ArchiveSource)
    assert (pinned.sha256, pinned.commit, pinned.date) == (sha, COMMIT, None)
    assert (pinned.build_number, pinned.build_number_from) == (
        4242,
        "the archive name llama.cpp-b4242.tar.gz",
    )
    assert pinned.source.subdir == "llama.cpp-b4242"
    assert (pinned.tree / "src" / "llama.cpp").read_bytes() == TREE["src/llama.cpp"]


def test_archive_wrong_sha256_keeps_nothing(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "llama.cpp-b4242.tar.gz"
    _tar(archive, {f"llama.cpp-b4242/{name}": data for name, data in TREE.items()})
    with pytest.raises(ChecksumMismatch, match=f"expected {'ab' * 32}, got {_sha256(archive)}"):
        resolve_source(f"file://{archive}@{COMMIT}", sha256="ab" * 32)
    assert _left_behind(lf_home) == []
    assert archive.is_file()  # the user's file is left as it was


def test_git_archive_names_its_commit(repo: Path, tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "llama.cpp-master.tar.gz"
    _git(repo, "archive", "--format=tar.gz", "--prefix=llama.cpp-master/", "-o", str(archive), "HEAD")
    head = _git(repo, "rev-parse", "HEAD")
    pinned = resolve_source(str(archive))  # a local file: its sha256 is computed, not required
    assert (pinned.commit, pinned.sha256) == (head, _sha256(archive))
    assert pinned.date == datetime.date(2023, 11, 14)  # git archive stamps members with the commit time
    assert pinned.build_number is None
    with pytest.raises(SourceError, match=f"holds llama\\.cpp {head}"):
        resolve_source(f"{archive}@{COMMIT}")


def test_archive_without_llama_cpp(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "other.tar.gz"
    _tar(archive, {"other/CMakeLists.txt": b"project(other)\n"})
    with pytest.raises(SourceError, match=r"vendors no llama\.cpp"):
        resolve_source(f"{archive}@{COMMIT}")
    assert _left_behind(lf_home) == []


# --- git ----------------------------------------------------------------------------------------------------


def test_git_full_clone_counts_the_build_number(repo: Path, lf_home: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    pinned = resolve_source(f"{repo}@{head}")
    assert isinstance(pinned.source, GitSource)
    assert (pinned.source.url, pinned.commit) == (str(repo), head)
    assert (pinned.build_number, pinned.build_number_from) == (3, "git rev-list --count of the clone")
    assert pinned.date == datetime.date(2023, 11, 14)
    assert sorted(path.name for path in pinned.tree.iterdir()) == ["CMakeLists.txt", "include", "src"]
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    assert resolve_source(f"file://{repo}@{first}").build_number == 1
    with pytest.raises(InvalidOption, match="git rev-list --count of the clone says 3"):
        resolve_source(f"{repo}@{head}", build_number=7)


def test_git_shallow_clone_leaves_the_number_unknown(repo: Path, tmp_path: Path, lf_home: Path) -> None:
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth=1", f"file://{repo}", str(shallow))
    head = _git(shallow, "rev-parse", "HEAD")
    pinned = resolve_source(f"{shallow}@{head}")
    assert pinned.build_number is None
    assert pinned.source.build_number is None
    assert "shallow" in pinned.origin


def test_git_unknown_commit_keeps_nothing(repo: Path, lf_home: Path) -> None:
    with pytest.raises(SourceError, match=f"commit {COMMIT} is not in"):
        resolve_source(f"{repo}@{COMMIT}")
    assert _left_behind(lf_home) == []
