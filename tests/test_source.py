"""Source fetching on real archives, a real loopback HTTP server and a real git repository."""

from __future__ import annotations

import hashlib
import http.server
import io
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from fakehub import FakeHub, serve, tls_context, tls_files
from llamaforge.build.recipes import ArchiveSource, GitSource
from llamaforge.build.source import fetch_source, make_workspace
from llamaforge.core.errors import ChecksumMismatch, SourceError

pytestmark = pytest.mark.quick

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def _archive(path: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source(url: str, sha: str, subdir: str = "pkg/vendor/llama.cpp") -> ArchiveSource:
    return ArchiveSource(kind="archive", url=url, sha256=sha, subdir=subdir, commit=COMMIT, build_number=1)


MEMBERS = {
    "pkg/setup.py": b"outside subdir\n",
    "pkg/vendor/llama.cpp/CMakeLists.txt": b"project(x)\n",
    "pkg/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/vendor/llama.cpp\n",
    "pkg/vendor/llama.cpp/src/llama.cpp": b"int main(){}\n",
}


def test_archive_subdir_extracted_git_pointer_dropped(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "src.tar.gz"
    sha = _archive(archive, MEMBERS)
    tree = fetch_source(_source(str(archive), sha))
    assert (tree / "CMakeLists.txt").read_bytes() == b"project(x)\n"
    assert (tree / "src" / "llama.cpp").is_file()
    assert not (tree / ".git").exists()
    assert not (tree / "setup.py").exists()
    archive.unlink()  # second fetch is served from the content-addressed cache
    assert fetch_source(_source(str(archive), sha)) == tree


def test_a_kept_archive_cut_short_since_is_fetched_again(tmp_path: Path, lf_home: Path) -> None:
    """A kept archive truncated after it was verified (a full disk, an edit) raised gzip's EOFError from every
    extraction of a tree that was missing (a subdir not extracted yet, a removed tree)."""
    from llamaforge.core.events import Event

    archive = tmp_path / "src.tar.gz"
    sha = _archive(archive, MEMBERS)
    whole = fetch_source(_source(str(archive), sha, subdir=""))
    (kept,) = (lf_home / "downloads").glob("*.archive")
    kept.write_bytes(kept.read_bytes()[:40])
    events: list[Event] = []
    tree = fetch_source(
        _source(str(archive), sha), reporter=events.append
    )  # another subdir: extracted afresh
    assert (tree / "CMakeLists.txt").read_bytes() == b"project(x)\n" and whole != tree
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == sha
    assert [event.message for event in events if event.kind == "warning"] == [
        f"{kept} no longer has its sha256: fetching it again"
    ]


def test_each_subdir_of_one_archive_is_its_own_tree(tmp_path: Path, lf_home: Path) -> None:
    """A wrong subdir is refused and caches nothing; the right one, fetched after it, is not served the wrong
    one's tree (the archive's sha256 alone addressed both)."""
    archive = tmp_path / "src.tar.gz"
    sha = _archive(archive, MEMBERS)
    with pytest.raises(SourceError, match="has nothing under 'pkg/vendor/nothere'"):
        fetch_source(_source(str(archive), sha, subdir="pkg/vendor/nothere"))
    whole = fetch_source(_source(str(archive), sha, subdir=""))
    assert (whole / "pkg" / "setup.py").is_file()
    tree = fetch_source(_source(str(archive), sha))
    assert tree != whole and (tree / "CMakeLists.txt").is_file() and not (tree / "pkg").exists()
    for bad in ("../../../etc", "/etc", "pkg//vendor", "pkg/../pkg", "pkg;id"):
        with pytest.raises(ValidationError, match="is not a directory inside the archive"):
            _source(str(archive), sha, subdir=bad)
    with pytest.raises(ValidationError, match="before 1970-01-01"):
        ArchiveSource(kind="archive", url=str(archive), sha256=sha, commit=COMMIT, date="1900-01-01")


def test_sha_mismatch_quarantines_and_caches_nothing(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "src.tar.gz"
    _archive(archive, MEMBERS)
    with pytest.raises(ChecksumMismatch) as info:
        fetch_source(_source(str(archive), "0" * 64))
    assert "expected " + "0" * 64 in info.value.message
    assert list((lf_home / "downloads").glob("*.rejected"))
    assert not [entry for entry in (lf_home / "sources").glob("0" * 64 + "*") if entry.is_dir()]


def test_member_escaping_target_is_refused(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    sha = _archive(archive, {"../../etc/evil": b"x", "ok/file": b"y"})
    with pytest.raises(SourceError) as info:
        fetch_source(_source(str(archive), sha, subdir=""))
    assert "escapes" in info.value.message
    assert not (tmp_path.parent / "etc" / "evil").exists()
    assert not [entry for entry in (lf_home / "sources").glob(sha + "*") if entry.is_dir()]


def test_symlink_escaping_target_is_refused(tmp_path: Path, lf_home: Path) -> None:
    link = tarfile.TarInfo("pkg/vendor/llama.cpp/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    archive = tmp_path / "link.tar.gz"
    sha = _archive(archive, MEMBERS, extra=[link])
    with pytest.raises(SourceError):
        fetch_source(_source(str(archive), sha))


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0),
        lambda *a: _Handler(*a, directory=str(root)),  # type: ignore[misc]
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_over_http_and_404(http_root: tuple[Path, str], lf_home: Path) -> None:
    root, base = http_root
    sha = _archive(root / "src.tar.gz", MEMBERS)
    tree = fetch_source(_source(f"{base}/src.tar.gz", sha))
    assert (tree / "CMakeLists.txt").is_file()
    with pytest.raises(SourceError) as info:
        fetch_source(_source(f"{base}/missing.tar.gz", "1" * 64))
    assert "404" in info.value.message and "LLAMAFORGE_SOURCE_MIRROR" in (info.value.hint or "")


def test_mirror_directory_serves_offline(
    tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    sha = _archive(mirror / "src.tar.gz", MEMBERS)
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(mirror))
    tree = fetch_source(_source("https://unreachable.invalid/src.tar.gz", sha))
    assert (tree / "CMakeLists.txt").is_file()


def test_https_download_follows_https_redirects_only(
    tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real TLS server on loopback (trusted through SSL_CERT_FILE), through the opener model downloads use
    too: an https -> https redirect is followed, one to plain http is refused before the http server is asked."""
    cert, key = tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    archive = tmp_path / "src.tar.gz"
    sha = _archive(archive, MEMBERS)
    with serve(FakeHub(), tls=tls_context(cert, key)) as hub:
        name = hub.add("org/llama.cpp", "src.tar.gz", archive.read_bytes())
        hub.redirects["/moved.tar.gz"] = f"{hub.url}/api/v1/models/org/llama.cpp/repo?FilePath=src.tar.gz"
        hub.redirects["/down.tar.gz"] = hub.file_url(name)  # the plain-http server
        with pytest.raises(
            SourceError, match=r"/down\.tar\.gz redirects to http://127\.0\.0\.1:\d+/files/\w+, leaving https"
        ):
            fetch_source(_source(f"{hub.url}/down.tar.gz", sha))
        assert hub.requests(server="cdn") == []
        tree = fetch_source(_source(f"{hub.url}/moved.tar.gz", sha))
        assert (tree / "CMakeLists.txt").read_bytes() == b"project(x)\n"


def test_an_ssl_cert_file_that_is_no_bundle_is_named(
    tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "gone.pem"))
    with pytest.raises(SourceError, match=r"SSL_CERT_FILE=.*gone\.pem cannot be used as a CA bundle") as info:
        fetch_source(_source("https://127.0.0.1:9/src.tar.gz", "2" * 64))
    assert "unset it" in (info.value.hint or "")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_git_source_checks_out_and_verifies_commit(tmp_path: Path, lf_home: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    (repo / "CMakeLists.txt").write_text("v1\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "one", cwd=repo)
    first = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "CMakeLists.txt").write_text("v2\n")
    _git("commit", "-qam", "two", cwd=repo)
    tree = fetch_source(GitSource(kind="git", url=str(repo), commit=first, build_number=1))
    assert (tree / "CMakeLists.txt").read_text() == "v1\n"
    assert not (tree / ".git").exists()
    with pytest.raises(SourceError) as info:
        fetch_source(GitSource(kind="git", url=str(repo), commit="f" * 40, build_number=1))
    assert "not found" in info.value.message


def test_workspace_is_a_private_copy(tmp_path: Path, lf_home: Path) -> None:
    archive = tmp_path / "src.tar.gz"
    tree = fetch_source(_source(str(archive), _archive(archive, MEMBERS)))
    with make_workspace(tree) as workspace:
        (workspace / "CMakeLists.txt").write_text("changed\n")
        scratch = workspace.parent
    assert (tree / "CMakeLists.txt").read_bytes() == b"project(x)\n"
    assert not scratch.exists()
