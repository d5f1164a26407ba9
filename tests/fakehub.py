"""A real HTTP server on 127.0.0.1 that speaks enough of the Hugging Face and ModelScope hubs (and plain file
serving with Range) for the real clients: ``huggingface_hub`` (HF_ENDPOINT) and ``modelscope_hub``
(MODELSCOPE_ENDPOINT). Faults are injected per request: drop the connection after N bytes, ignore Range, corrupt a
byte. Every request is logged with its headers so tests can check Range use and where a token went.

Two servers make one fake hub: the hub itself and a "CDN" on another port (another origin), so the hub's
redirects to the CDN cross origins exactly like huggingface.co -> cdn: clients must not forward tokens there.
The hub can speak TLS (:func:`tls_files` makes a certificate for 127.0.0.1) and redirect any path anywhere.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import random
import ssl
import struct
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def random_gguf(size: int, seed: int) -> bytes:
    """A well-formed GGUF of ``size`` bytes (at least 128): ``general.architecture`` and one I8 tensor of random
    bytes, the shape of a model file a download must bring back unchanged (it is no model llama.cpp loads)."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    def header(n_bytes: int) -> bytes:
        kv = string("general.architecture") + struct.pack("<I", 8) + string("llama")
        tensor = string("blob") + struct.pack("<IQIQ", 1, n_bytes, 24, 0)  # 1 dim of n_bytes, I8, offset 0
        return b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + tensor

    data_offset = -(-len(header(0)) // 32) * 32  # the data section is 32-byte aligned
    n_bytes = size - data_offset
    assert n_bytes > 0, f"a GGUF needs more than {data_offset} bytes"
    return header(n_bytes).ljust(data_offset, b"\0") + random.Random(seed).randbytes(n_bytes)


@dataclass
class Faults:
    """What the next GETs of file bytes do wrong."""

    drops: list[int] = field(default_factory=list)  # each GET pops one: send only N bytes, then hang up
    ignore_range: bool = False  # answer 200 with the whole file even when asked for a range
    corrupt: bool = (
        False  # flip the last byte of everything served (the GGUF magic stays: the sha256 differs)
    )
    extra_bytes: int = 0  # serve this many more bytes than the file has


@dataclass
class Logged:
    """One request as the server saw it."""

    server: str
    method: str
    path: str
    headers: dict[str, str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub, name: str, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self.name = name
        self.scheme = "http"
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
            self.scheme = "https"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"


@dataclass
class FakeHub:
    """Files by name, plus the repositories that hold them."""

    files: dict[str, bytes] = field(default_factory=dict)  # name -> content (served at /files/<name>, CDN)
    repos: dict[str, dict[str, str]] = field(
        default_factory=dict
    )  # "owner/repo" -> {path in repo: file name}
    commit: str = COMMIT
    token: str | None = None  # when set, hub endpoints require "Bearer <token>"
    faults: Faults = field(default_factory=Faults)
    redirects: dict[str, str] = field(
        default_factory=dict
    )  # path -> Location, answered with a 302 by both servers
    log: list[Logged] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hub_server: _Server | None = None
    cdn_server: _Server | None = None

    def add(self, repo: str, path: str, content: bytes) -> str:
        """Put ``content`` at ``repo``/``path``; returns its sha256."""
        digest = hashlib.sha256(content).hexdigest()
        self.files[digest] = content
        self.repos.setdefault(repo, {})[path] = digest
        return digest

    @property
    def url(self) -> str:
        assert self.hub_server is not None
        return self.hub_server.url

    @property
    def cdn_url(self) -> str:
        assert self.cdn_server is not None
        return self.cdn_server.url

    def file_url(self, name: str) -> str:
        """Plain https-style URL of a file on the CDN."""
        return f"{self.cdn_url}/files/{name}"

    def requests(self, server: str | None = None, method: str | None = None) -> list[Logged]:
        """Logged requests, optionally only those to ``server`` ("hub"/"cdn") with ``method``."""
        with self.lock:
            return [
                item
                for item in self.log
                if (server is None or item.server == server) and (method is None or item.method == method)
            ]


def tls_files(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files in ``directory``): serve the hub with
    :func:`tls_context` and let clients trust it through ``SSL_CERT_FILE``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "hub-cert.pem", directory / "hub-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server-side TLS context for :func:`serve`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


@contextmanager
def serve(hub: FakeHub, tls: ssl.SSLContext | None = None) -> Iterator[FakeHub]:
    """Run the hub and its CDN on loopback for the duration of the block; always shut down and close. With
    ``tls`` the hub (not the CDN) speaks https."""
    hub.hub_server = _Server(hub, "hub", tls)
    hub.cdn_server = _Server(hub, "cdn")
    threads = [
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        for server in (hub.hub_server, hub.cdn_server)
    ]
    for thread in threads:
        thread.start()
    try:
        yield hub
    finally:
        for server in (hub.hub_server, hub.cdn_server):
            server.shutdown()
            server.server_close()
        for thread in threads:
            thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests are recorded in FakeHub.log instead."""

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def _record(self) -> None:
        with self.hub.lock:
            self.hub.log.append(Logged(self.server.name, self.command, self.path, dict(self.headers.items())))

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.hub.token is None:
            return True
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        self._record()
        parsed = urllib.parse.urlsplit(self.path)
        if parsed.path in self.hub.redirects:
            self._send(302, b"", {"Location": self.hub.redirects[parsed.path]})
            return
        parts = [urllib.parse.unquote(part) for part in parsed.path.split("/") if part]
        if self.server.name == "cdn":
            if len(parts) == 2 and parts[0] == "files" and parts[1] in self.hub.files:
                self._serve_bytes(self.hub.files[parts[1]])
            else:
                self._send(404, b"no such file")
            return
        if parts[:2] == ["api", "v1"]:
            self._modelscope(parts[2:], urllib.parse.parse_qs(parsed.query))
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            self._hf_resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            return
        self._send(404, b"unknown endpoint")

    # --- Hugging Face: /{repo}/resolve/{revision}/{path} -----------------------------------------------------

    def _hf_resolve(self, repo: str, revision: str, path: str) -> None:
        if repo not in self.hub.repos:
            self._send(401 if self.hub.token else 404, b"repo", {"X-Error-Code": "RepoNotFound"})
            return
        if not self._authorized():
            self._send(401, b"token", {"X-Error-Code": "RepoNotFound"})
            return
        if revision not in ("main", self.hub.commit):
            self._send(404, b"revision", {"X-Error-Code": "RevisionNotFound"})
            return
        name = self.hub.repos[repo].get(path)
        if name is None:
            self._send(404, b"entry", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": self.hub.commit})
            return
        content = self.hub.files[name]
        # Like huggingface.co for an LFS file: a redirect to the CDN that carries the file's metadata.
        self._send(
            302,
            b"",
            {
                "Location": f"{self.hub.cdn_url}/files/{name}",
                "X-Repo-Commit": self.hub.commit,
                "X-Linked-Etag": f'"{name}"',
                "X-Linked-Size": str(len(content)),
                "ETag": '"pointer-blob-sha1"',
            },
        )

    # --- ModelScope: /api/v1/models/{owner}/{repo}/repo/files and /repo?FilePath= ---------------------------

    def _modelscope(self, parts: list[str], query: dict[str, list[str]]) -> None:
        if len(parts) < 4 or parts[0] != "models":
            self._send(404, b"unknown endpoint")
            return
        repo = f"{parts[1]}/{parts[2]}"
        if repo not in self.hub.repos:
            self._send(404, json.dumps({"Code": 10010205001, "Message": "model not found"}).encode())
            return
        if parts[3:] == ["repo", "files"]:
            files = [
                {
                    "Path": path,
                    "Name": path.rsplit("/", 1)[-1],
                    "Size": len(self.hub.files[name]),
                    "Sha256": name,
                    "Type": "blob",
                    "Revision": "master",
                }
                for path, name in self.hub.repos[repo].items()
            ]
            body = json.dumps({"Code": 200, "Success": True, "Data": {"Files": files}}).encode()
            self._send(200, body, {"Content-Type": "application/json"})
            return
        if parts[3:] == ["repo"]:
            name = self.hub.repos[repo].get(query.get("FilePath", [""])[0])
            if name is None:
                self._send(404, b"no such file")
                return
            self._serve_bytes(self.hub.files[name])
            return
        self._send(404, b"unknown endpoint")

    # --- bytes, with Range, If-Range and injected faults ------------------------------------------------------

    def _serve_bytes(self, content: bytes) -> None:
        faults = self.hub.faults
        if faults.corrupt:
            content = content[:-1] + bytes([content[-1] ^ 0xFF])
        if faults.extra_bytes:
            content = content + b"\0" * faults.extra_bytes
        etag = f'"{hashlib.sha256(content).hexdigest()}"'
        start = 0
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if wanted and not faults.ignore_range and (if_range is None or if_range == etag):
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            if start >= len(content):
                self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"})
                return
        body = content[start:]
        self.send_response(206 if start else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.hub.lock:
            drop = faults.drops.pop(0) if faults.drops else None
        if drop is not None and drop < len(body):
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True  # hang up mid-body: the client sees a short read
            return
        self.wfile.write(body)
