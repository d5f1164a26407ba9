"""An sdist is fetched without running any of its code: found on the package index's simple API (JSON or HTML),
downloaded through the URL policy and checked against the index's sha256, for recipes and for `upgrade --to`.

The index here is a server of the test's own on 127.0.0.1 (PIP_INDEX_URL), serving a hostile sdist: its setup.py
and its in-tree build backend each write a marker file when run, as `pip download` ran them (pip prepares an
sdist's metadata, which runs its build backend, before it saves the file)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

import mcp_types
from mcp import Client
from mcp_server import ServerOptions, build_server

from llamaforge.build.pypi import download_sdist, find_sdist, index_url, normalized
from llamaforge.build.recipes import PypiSdistSource
from llamaforge.build.source import fetch_source
from llamaforge.core import guard
from llamaforge.core.errors import ChecksumMismatch, SourceError
from llamaforge.core.guard import PolicyRefused

pytestmark = [pytest.mark.quick, pytest.mark.anyio]

HOSTILE_SETUP = (
    "import pathlib\npathlib.Path({marker!r}).write_text('setup.py ran')\n"
    "from setuptools import setup\nsetup()\n"
)
HOSTILE_BACKEND = (
    "import pathlib\npathlib.Path({marker!r}).write_text('the build backend ran')\n"
    "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
)
HOSTILE_PYPROJECT = (
    '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    '[project]\nname = "evilpkg"\nversion = "1.0"\n'
)


def _sdist(marker: Path, version: str = "1.0") -> bytes:
    """evilpkg-VERSION.tar.gz: a llama.cpp-shaped tree (CMakeLists.txt, ggml/, src/llama.cpp) whose setup.py
    and build backend write ``marker`` if anything runs them."""
    files = {
        "setup.py": HOSTILE_SETUP.format(marker=str(marker)),
        "backend.py": HOSTILE_BACKEND.format(marker=str(marker)),
        "pyproject.toml": HOSTILE_PYPROJECT,
        "vendor/llama.cpp/CMakeLists.txt": "project(llama.cpp)\n",
        "vendor/llama.cpp/ggml/CMakeLists.txt": "\n",
        "vendor/llama.cpp/src/llama.cpp": "// llama\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"evilpkg-{version}/{name}")
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Index:
    """A simple-API index on 127.0.0.1: ``pages`` maps a path to (content type, body); files are served too."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests.append(self.path)
                page = index.pages.get(self.path)
                if page is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", page[0])
                self.send_header("Content-Length", str(len(page[1])))
                self.end_headers()
                self.wfile.write(page[1])

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(
        self, sdist: bytes, *, version: str = "1.0", html: bool = False, sha256: str | None = None
    ) -> str:
        """List evilpkg's sdist of ``version`` (JSON, or a PEP 503 page) with ``sha256`` (the file's own by
        default); returns the file's real sha256."""
        real = hashlib.sha256(sdist).hexdigest()
        name = f"evilpkg-{version}.tar.gz"
        self.pages[f"/files/{name}"] = ("application/octet-stream", sdist)
        stated = sha256 or real
        files = [
            {
                "filename": name,
                "url": f"{self.url}/files/{name}",
                "hashes": {"sha256": stated},
                "yanked": False,
            },
            {"filename": "evilpkg-0.9-py3-none-any.whl", "url": f"{self.url}/files/x.whl", "hashes": {}},
        ]
        if html:
            links = "".join(f'<a href="/files/{name}#sha256={stated}">{name}</a><br>' for _ in range(1))
            self.pages["/simple/evilpkg/"] = ("text/html", f"<html><body>{links}</body></html>".encode())
        else:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "evilpkg", "files": files}).encode()
            self.pages["/simple/evilpkg/"] = ("application/vnd.pypi.simple.v1+json", body)
        return real


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    served = Index()
    monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_the_index_is_pips_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple/ https://extra.example/simple")
    assert index_url() == "https://mirror.example/simple"
    monkeypatch.delenv("PIP_INDEX_URL")
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://corp.example/pypi/simple/\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert index_url() == "https://corp.example/pypi/simple"
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    assert index_url() == "https://pypi.org/simple"
    assert normalized("Llama_CPP.python") == "llama-cpp-python"


@pytest.mark.parametrize("html", [False, True], ids=["json", "html"])
def test_an_sdist_is_downloaded_and_checked_and_nothing_of_it_runs(
    index: Index, tmp_path: Path, html: bool
) -> None:
    marker = tmp_path / "ran"
    real = index.publish(_sdist(marker), html=html)
    assert find_sdist("EvilPkg", "1.0").sha256 == real
    path = download_sdist("evilpkg", "1.0", tmp_path)
    assert path.name == "evilpkg-1.0.tar.gz" and hashlib.sha256(path.read_bytes()).hexdigest() == real
    assert not marker.exists()


def test_a_file_that_differs_from_the_indexs_sha256_is_refused_and_not_kept(
    index: Index, tmp_path: Path
) -> None:
    index.publish(_sdist(tmp_path / "ran"), sha256="0" * 64)
    (tmp_path / "out").mkdir()
    with pytest.raises(ChecksumMismatch, match="does not have the sha256 the package index states"):
        download_sdist("evilpkg", "1.0", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_version_without_an_sdist_a_yanked_one_and_an_unknown_project_are_named(
    index: Index, tmp_path: Path
) -> None:
    index.publish(_sdist(tmp_path / "ran"))
    with pytest.raises(SourceError) as missing:
        find_sdist("evilpkg", "2.0")
    assert missing.value.message == "evilpkg==2.0: the package index has no sdist of version 2.0"
    assert "1.0" in (missing.value.hint or "")
    with pytest.raises(SourceError, match="has no project 'nosuchpkg'"):
        find_sdist("nosuchpkg", "1.0")
    page = json.loads(index.pages["/simple/evilpkg/"][1])
    page["files"][0]["yanked"] = True
    index.pages["/simple/evilpkg/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(page).encode())
    with pytest.raises(SourceError, match="was yanked"):
        find_sdist("evilpkg", "1.0")


def test_a_recipe_source_from_the_index_is_extracted_checked_by_its_pin_and_never_run(
    index: Index, tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLAMAFORGE_SOURCE_MIRROR", raising=False)
    marker = tmp_path / "ran"
    real = index.publish(_sdist(marker))
    spec = {
        "kind": "pypi-sdist",
        "package": "evilpkg",
        "version": "1.0",
        "subdir": "evilpkg-1.0/vendor/llama.cpp",
        "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    }
    tree = fetch_source(PypiSdistSource.model_validate({**spec, "sha256": real}))
    assert (tree / "src" / "llama.cpp").is_file() and not marker.exists()
    with pytest.raises(ChecksumMismatch):  # the index's sha256 holds, the recipe pins another
        fetch_source(PypiSdistSource.model_validate({**spec, "sha256": "1" * 64}))
    assert not marker.exists()


def test_the_url_policy_covers_the_index_and_the_file(index: Index, tmp_path: Path) -> None:
    index.publish(_sdist(tmp_path / "ran"))
    before = guard.current()
    guard.install(guard.HostGuard(url_hosts=frozenset({"pypi.org"})))
    try:
        with pytest.raises(PolicyRefused, match=r"127\.0\.0\.1"):
            download_sdist("evilpkg", "1.0", tmp_path)
    finally:
        guard.install(before)
    assert index.requests == []  # refused before any request


async def test_an_upgrade_dry_run_over_mcp_runs_nothing_of_the_package(
    index: Index, tmp_path: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack of issue 49: `upgrade(to="PKG==VER", dry_run=true)` from an MCP client. The sdist is fetched
    and read; its setup.py and build backend never run (pip ran them as root before it saved the file)."""
    monkeypatch.delenv("LLAMAFORGE_SOURCE_MIRROR", raising=False)
    marker = tmp_path / "ran"
    index.publish(_sdist(marker))
    async with Client(build_server(ServerOptions(allow_roots=(tmp_path,)))) as client:
        result = await client.call_tool("upgrade", {"to": "evilpkg==1.0", "dry_run": True})
    assert isinstance(result, mcp_types.CallToolResult)
    print(
        "upgrade answered:",
        " ".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))[:600],
    )
    assert "/files/evilpkg-1.0.tar.gz" in index.requests  # it was fetched
    assert not marker.exists(), marker.read_text()
