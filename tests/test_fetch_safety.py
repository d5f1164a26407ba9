"""models.fetch and models.inspect against hostile networks and failing disks, on real loopback servers: a local
write error ends a download (never retried into a corrupt file), the file on disk is checked before it is
published, free space and the unpinned size cap are checked before a byte is written, every URL and every
redirect goes through the host guard, plain http needs a pin (or loopback), and a read-only front downloads
nothing."""

from __future__ import annotations

import errno
import hashlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from fakehub import FakeHub, random_gguf, serve, tls_context, tls_files
from llamaforge.core import guard
from llamaforge.core.errors import FetchError, ModelChecksumMismatch
from llamaforge.core.events import Event, Reporter
from llamaforge.core.guard import HostGuard, PolicyRefused
from llamaforge.models import download
from llamaforge.models import store as modelstore
from llamaforge.models.fetch import fetch_model
from llamaforge.models.hubs import parse_hub_source, resolve
from llamaforge.models.inspect import inspect_model
from llamaforge.models.recipes import ModelRecipe
from llamaforge.models.remote import HttpRangeSource
from llamaforge.models.urls import check_model_url, max_unpinned_bytes

pytestmark = pytest.mark.quick

BLOB = random_gguf(3 * (1 << 20) + 4321, seed=21)
METADATA = "http://169.254.169.254/latest/meta-data/iam"
TEST_NET = "http://192.0.2.10/model.gguf"  # RFC 5737: never routed, and an IP needs no DNS


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def hub(lf_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("LLAMAFORGE_MAX_UNPINNED_DOWNLOAD", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("LLAMAFORGE_LOCK_FILE", str(tmp_path / "lock.toml"))
    with serve(FakeHub()) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake
    from huggingface_hub import close_session

    close_session()


@pytest.fixture
def policy() -> Iterator[None]:
    """Restore the permissive default guard after a test installs another."""
    yield
    guard.install(HostGuard())


def parts() -> list[Path]:
    return sorted((modelstore.models_root() / "partial").glob("*.part"))


def published() -> list[str]:
    root = modelstore.models_root() / "sha256"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# --- a local write error is fatal ---------------------------------------------------------------------------


def test_disk_full_mid_download_is_fatal_names_the_file_and_publishes_nothing(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC the way a full disk gives it: part of a chunk is written, then the write fails. It used to be
    retried as a network error, resuming from the stream's counter while the .part held more: the file was
    corrupt and, its streamed sha256 matching the pin, published."""
    name = hub.add("org/repo", "blob.gguf", BLOB)
    real_append = download._append
    written = 0

    def disk_fills_up(writer: BinaryIO, chunk: bytes) -> None:
        nonlocal written
        if written + len(chunk) > 2 * (1 << 20):  # the disk fills up inside the third chunk
            writer.write(chunk[: len(chunk) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(writer, chunk)
        written += len(chunk)

    monkeypatch.setattr(download, "_append", disk_fills_up)
    recipe = ModelRecipe(name="blob", source=hub.file_url(name), sha256=sha(BLOB))
    with pytest.raises(FetchError) as caught:
        fetch_model(recipe, retries=3, backoff_s=0)
    message = caught.value.message
    assert "No space left on device" in message and "ENOSPC" in message and "free in" in message
    assert "nothing was published" in message and ".part" in message
    assert len(hub.requests(server="cdn", method="GET")) == 1  # not retried
    assert published() == [] and modelstore.lookup(sha(BLOB)) is None
    # The .part was cut back to the bytes counted, so the next run resumes from a consistent prefix.
    (part,) = parts()
    assert part.stat().st_size == written == 2 * (1 << 20)
    assert part.read_bytes() == BLOB[:written]

    monkeypatch.setattr(download, "_append", real_append)  # space freed
    result = fetch_model(recipe, backoff_s=0)
    assert result.sha256 == sha(BLOB) and result.path.read_bytes() == BLOB
    assert hub.requests(server="cdn", method="GET")[-1].headers["Range"] == f"bytes={written}-"


def test_an_io_error_writing_is_fatal_for_downloads_and_local_copies(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    local = tmp_path / "local.gguf"
    local.write_bytes(BLOB)

    def broken_disk(writer: BinaryIO, chunk: bytes) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(download, "_append", broken_disk)
    with pytest.raises(FetchError, match=r"Input/output error \(EIO\)"):
        fetch_model(hub.file_url(name), retries=3, backoff_s=0)
    assert len(hub.requests(server="cdn", method="GET")) == 1
    with pytest.raises(
        FetchError, match=r"writing \w+\.part for file://.* failed at byte 0: Input/output error"
    ):
        fetch_model(local.as_uri())
    assert published() == []


# --- the file on disk is what gets checked -----------------------------------------------------------------


def corrupt_part_when_complete(flip: bool) -> Reporter:
    """A reporter that changes the .part on disk once the last byte has arrived (before it is published)."""

    def reporter(event: Event) -> None:
        if event.kind == "progress" and "downloading" in event.message and event.completed == event.total:
            (part,) = parts()
            with part.open("r+b") as handle:
                if flip:
                    first = handle.read(1)
                    handle.seek(0)
                    handle.write(bytes([first[0] ^ 0xFF]))
                else:
                    handle.seek(0, 2)
                    handle.write(b"!")

    return reporter


def test_a_part_corrupted_before_publishing_is_caught_by_the_rehash(hub: FakeHub) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    recipe = ModelRecipe(name="blob", source=hub.file_url(name), sha256=sha(BLOB))
    with pytest.raises(ModelChecksumMismatch, match="the file on disk has") as caught:
        fetch_model(recipe, backoff_s=0, reporter=corrupt_part_when_complete(flip=True))
    assert f"arrived with sha256 {sha(BLOB)}" in caught.value.message  # the stream itself was right
    assert "quarantine" in (caught.value.hint or "")
    assert published() == [] and parts() == []
    rejected = list((modelstore.models_root() / "quarantine").glob("*.rejected"))
    assert len(rejected) == 1 and rejected[0].read_bytes()[1:] == BLOB[1:]


def test_an_unpinned_part_that_changed_size_is_not_published(hub: FakeHub) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    with pytest.raises(ModelChecksumMismatch, match=f"{len(BLOB)} bytes arrived but the file on disk holds"):
        fetch_model(hub.file_url(name), backoff_s=0, reporter=corrupt_part_when_complete(flip=False))
    assert published() == []


# --- room on disk, and the cap on unpinned downloads ---------------------------------------------------------


def test_too_little_free_space_is_refused_before_writing(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    monkeypatch.setattr(download, "_free_bytes", lambda directory: 1 << 20)
    with pytest.raises(FetchError, match=r"needs 3\.0 MiB more but .*partial has 1\.0 MiB free") as caught:
        fetch_model(hub.file_url(name), backoff_s=0)
    assert "LLAMAFORGE_HOME" in (caught.value.hint or "")
    assert all(part.stat().st_size == 0 for part in parts()) and published() == []


def test_unpinned_downloads_are_capped(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert max_unpinned_bytes() == 256 << 30
    name = hub.add("org/repo", "blob.gguf", BLOB)
    monkeypatch.setenv("LLAMAFORGE_MAX_UNPINNED_DOWNLOAD", "2M")
    with pytest.raises(
        FetchError, match=r"is 3\.0 MiB, more than the 2\.0 MiB .*LLAMAFORGE_MAX_UNPINNED_DOWNLOAD"
    ):
        fetch_model(hub.file_url(name), backoff_s=0)
    assert published() == []
    # A pinned download is bounded by its pin, not by the cap.
    recipe = ModelRecipe(name="blob", source=hub.file_url(name), sha256=sha(BLOB))
    assert fetch_model(recipe, backoff_s=0).sha256 == sha(BLOB)
    monkeypatch.setenv("LLAMAFORGE_MAX_UNPINNED_DOWNLOAD", "lots")
    with pytest.raises(Exception, match="is no size"):
        max_unpinned_bytes()


# --- URLs and redirects --------------------------------------------------------------------------------------


def test_plain_http_needs_a_pin_or_loopback(hub: FakeHub) -> None:
    started = time.monotonic()
    with pytest.raises(FetchError, match="plain http:// and nothing pins its content") as caught:
        fetch_model(TEST_NET, backoff_s=0)
    assert "pin the file's sha256" in (caught.value.hint or "")
    assert time.monotonic() - started < 5  # refused before any connection
    check_model_url(TEST_NET, plain_http_ok=True)  # pinned: the bytes are checked whatever the network did
    check_model_url(hub.file_url("x"), plain_http_ok=False)  # loopback: this machine
    with pytest.raises(FetchError, match="unsupported"):
        check_model_url("ftp://192.0.2.10/model.gguf", plain_http_ok=True)


def test_metadata_addresses_are_refused_before_connecting(hub: FakeHub) -> None:
    recipe = ModelRecipe(name="meta", source=METADATA + "/model.gguf", sha256="0" * 64)
    with pytest.raises(PolicyRefused, match="link-local or cloud-metadata"):
        fetch_model(recipe, backoff_s=0)
    with pytest.raises(PolicyRefused, match="link-local or cloud-metadata"):
        inspect_model(METADATA + "/model.gguf")


@pytest.mark.parametrize(
    ("location", "error", "needle", "header_read_too"),
    [
        (METADATA, PolicyRefused, "link-local or cloud-metadata", True),
        # A header read stores nothing: plain http is allowed there (and the host guard still applies).
        (TEST_NET, FetchError, "redirect target of .* is plain http://", False),
    ],
)
def test_every_redirect_is_checked(
    hub: FakeHub, location: str, error: type[Exception], needle: str, header_read_too: bool
) -> None:
    hub.redirects["/files/moved.gguf"] = location
    started = time.monotonic()
    with pytest.raises(error, match=needle):
        fetch_model(hub.file_url("moved.gguf"), retries=3, backoff_s=0)
    if header_read_too:
        with pytest.raises(error, match=needle):
            HttpRangeSource(hub.file_url("moved.gguf"))
    assert time.monotonic() - started < 10  # refused, never dialled
    assert published() == []


def test_the_host_allow_list_applies_to_redirects(hub: FakeHub, policy: None) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    hub.redirects["/files/elsewhere.gguf"] = hub.file_url(name).replace("127.0.0.1", "localhost")
    guard.install(HostGuard(url_hosts=frozenset({"127.0.0.1"})))
    with pytest.raises(PolicyRefused, match="host 'localhost' is not on this server's list"):
        fetch_model(hub.file_url("elsewhere.gguf"), backoff_s=0)
    assert fetch_model(hub.file_url(name), backoff_s=0).sha256 == sha(BLOB)


def test_a_redirect_from_https_to_http_is_refused(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real TLS hub on loopback (its certificate trusted through SSL_CERT_FILE): it serves over https, and a
    redirect from it to plain http is refused even for a pinned file."""
    cert, key = tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with serve(FakeHub(), tls=tls_context(cert, key)) as hub:
        name = hub.add("org/repo", "blob.gguf", BLOB)
        assert hub.url.startswith("https://")
        hub.redirects["/down.gguf"] = hub.file_url(name)  # https -> http (the CDN)
        pinned = ModelRecipe(name="down", source=f"{hub.url}/down.gguf", sha256=sha(BLOB))
        with pytest.raises(
            FetchError, match=r"redirects to http://127\.0\.0\.1:\d+/files/\w+, leaving https"
        ):
            fetch_model(pinned, backoff_s=0)
        with pytest.raises(FetchError, match="leaving https"):
            inspect_model(f"{hub.url}/down.gguf")
        assert published() == []
        assert len(hub.requests(server="cdn")) == 0  # never reached


def test_https_download_works_through_the_tls_hub(
    lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with serve(FakeHub(), tls=tls_context(cert, key)) as hub:
        hub.add("org/repo", "blob.gguf", BLOB)
        # The hub serves the bytes itself at ModelScope's file endpoint; an https -> https redirect leads there.
        hub.redirects["/blob.gguf"] = f"{hub.url}/api/v1/models/org/repo/repo?FilePath=blob.gguf"
        result = fetch_model(f"{hub.url}/blob.gguf", backoff_s=0)
        assert result.sha256 == sha(BLOB) and result.path.read_bytes() == BLOB


def test_hub_endpoints_are_checked_before_they_are_asked(
    lf_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token saved by `hf auth login`
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_ENDPOINT", "http://169.254.169.254")
    with pytest.raises(PolicyRefused, match="Hugging Face endpoint"):
        resolve(parse_hub_source("hf://org/repo/x.gguf"), None)
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.10")
    with pytest.raises(FetchError, match=r"Hugging Face endpoint .* is plain http://"):
        resolve(parse_hub_source("hf://org/repo/x.gguf"), None)  # what lock and an unpinned fetch do
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    with pytest.raises(FetchError, match="would carry a token in clear"):
        resolve(parse_hub_source("hf://org/repo/x.gguf"), None, pinned=True)
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://169.254.169.254")
    with pytest.raises(PolicyRefused, match="ModelScope endpoint"):
        resolve(parse_hub_source("ms://org/repo/x.gguf"), None)


# --- read-only ---------------------------------------------------------------------------------------------------


def test_a_read_only_front_downloads_nothing(hub: FakeHub, policy: None) -> None:
    name = hub.add("org/repo", "blob.gguf", BLOB)
    cached = fetch_model(hub.file_url(name), backoff_s=0)
    other = hub.add("org/repo", "other.gguf", random_gguf(4096, seed=12))
    guard.install(HostGuard(read_only=True))
    requests = len(hub.requests())
    with pytest.raises(
        PolicyRefused, match=rf"read-only, and this call would download {re.escape(hub.file_url(other))} into"
    ):
        fetch_model(hub.file_url(other), backoff_s=0)
    assert len(hub.requests()) == requests and modelstore.lookup(other) is None
    assert fetch_model(hub.file_url(name)).path == cached.path  # what the store has is still served


def test_a_read_only_lookup_passes_a_damaged_store_entry_by_and_moves_nothing(
    lf_home: Path, tmp_path: Path, policy: None
) -> None:
    # A lookup quarantined a damaged entry (a rename and a note written) while the front had promised to write
    # nothing; now it only does not serve it, and the next writing run moves it.
    part = tmp_path / "part"
    part.write_bytes(BLOB)
    digest = hashlib.sha256(BLOB).hexdigest()
    stored = modelstore.publish(part, sha256=digest, filename="blob.gguf", manifest={"source": "test"})
    with stored.path.open("ab") as handle:
        handle.write(b"x")  # the size no longer matches the manifest
    guard.install(HostGuard(read_only=True))
    assert modelstore.lookup(digest) is None
    assert stored.path.is_file() and not (lf_home / "models" / "quarantine").exists()
    guard.install(HostGuard())
    assert modelstore.lookup(digest) is None
    assert not stored.path.exists() and len(list((lf_home / "models" / "quarantine").iterdir())) == 1
