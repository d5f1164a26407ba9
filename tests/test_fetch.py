"""models.fetch against real HTTP servers on loopback: Range resume after drops at many points, corrupt bytes,
wrong sizes, offline mode, file://, and the hub clients (huggingface_hub via HF_ENDPOINT, modelscope_hub via
MODELSCOPE_ENDPOINT) with a token that must never leak."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from fakehub import COMMIT, FakeHub, random_gguf, serve
from helpers import invoke, write_mini_vocab
from llamaforge.core.errors import Cancelled, FetchError, InvalidOption, ModelChecksumMismatch, ModelError
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.http import content_range, range_request, wait_seconds
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.models import store as modelstore
from llamaforge.models.fetch import fetch_model
from llamaforge.models.recipes import ModelRecipe
from llamaforge.models.urls import redact_url

pytestmark = pytest.mark.quick

TOKEN = "hf_SECRETtoken0123456789abcdefSECRET"
MS_TOKEN = "ms-SECRET-0123456789-SECRET"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real (tiny, random-weight) qwen3 GGUF with a 300-token vocabulary."""
    root = tmp_path_factory.mktemp("gguf")
    vocab = write_mini_vocab(root / "vocab.gguf")
    model = root / "tiny-qwen3.gguf"
    write_tiny_model(model, TinyModelSpec(), vocab)
    return model.read_bytes()


@pytest.fixture(scope="module")
def big_blob() -> bytes:
    """A 3 MiB GGUF of random tensor bytes: several read chunks, so drops land inside and between chunks."""
    return random_gguf(3 * (1 << 20) + 12345, seed=7)


@pytest.fixture
def hub(lf_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    """A fake hub + CDN on loopback, with HF_ENDPOINT and MODELSCOPE_ENDPOINT pointing at it."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("LLAMAFORGE_LOCK_FILE", str(tmp_path / "lock.toml"))
    with serve(FakeHub()) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", fake.url)
        yield fake
    from huggingface_hub import close_session

    close_session()  # drop pooled connections to the server that just stopped


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def all_text_under(root: Path) -> str:
    """Every readable file under ``root``, concatenated (to look for leaked secrets)."""
    return "\n".join(
        path.read_bytes().decode("utf-8", "replace") for path in root.rglob("*") if path.is_file()
    )


# --- https:// -----------------------------------------------------------------------------------------------


def test_https_fetch_verifies_publishes_and_then_serves_from_cache(hub: FakeHub, tiny_gguf: bytes) -> None:
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    url = hub.file_url(name)
    first = fetch_model(url, backoff_s=0)
    assert (first.cached, first.sha256, first.size) == (False, sha(tiny_gguf), len(tiny_gguf))
    assert first.path == modelstore.entry_dir(first.sha256) / name
    assert first.path.read_bytes() == tiny_gguf
    gguf.GGUFReader(first.path)  # what arrived is still a GGUF
    assert not os.access(first.path, os.W_OK) or os.geteuid() == 0  # published read-only
    assert not list((modelstore.models_root() / "partial").glob("*.part"))
    gets = len(hub.requests(method="GET"))
    second = fetch_model(url)
    assert second.cached and second.path == first.path
    assert len(hub.requests(method="GET")) == gets  # no network for a cache hit


@pytest.mark.parametrize("drop_at", [1, 4096, 1 << 20, (1 << 20) + 1, 2 * (1 << 20) + 7, -1])
def test_interrupted_download_resumes_with_range_to_the_right_sha256(
    hub: FakeHub, big_blob: bytes, drop_at: int
) -> None:
    drop_at = drop_at if drop_at > 0 else len(big_blob) - 1
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [drop_at]
    with pytest.raises(FetchError, match=f"closed the transfer at byte {drop_at} of") as caught:
        fetch_model(hub.file_url(name), retries=0, backoff_s=0)
    assert "fetch again to resume" in (caught.value.hint or "")
    parts = list((modelstore.models_root() / "partial").glob("*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == drop_at
    assert modelstore.lookup(sha(big_blob)) is None  # nothing published

    result = fetch_model(hub.file_url(name), retries=0, backoff_s=0)
    assert result.sha256 == sha(big_blob) and result.path.read_bytes() == big_blob
    last = hub.requests(server="cdn", method="GET")[-1]
    assert last.headers["Range"] == f"bytes={drop_at}-"
    assert last.headers["If-Range"] == f'"{sha(big_blob)}"'


@pytest.mark.parametrize(
    "damage",
    [
        "sidecar a list",
        "sidecar not JSON",
        "sidecar empty",
        "part longer than the pin",
        "part a directory",
        "part a symlink",
    ],
)
def test_leftover_partial_downloads_in_any_state_are_resumed_or_restarted(
    hub: FakeHub, big_blob: bytes, damage: str
) -> None:
    """What a crash, a full disk or an edit leaves under partial/ is resumed or started over; what no download
    leaves (a directory, a symlink) is named. A sidecar that was JSON but no object, or a directory, raised a
    traceback."""
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [1000]
    pinned = ModelRecipe(name="blob", source=hub.file_url(name), sha256=sha(big_blob), size=len(big_blob))
    with pytest.raises(FetchError):
        fetch_model(pinned, retries=0, backoff_s=0)
    (part,) = (modelstore.models_root() / "partial").glob("*.part")
    sidecar = part.with_suffix(".json")
    if damage == "part longer than the pin":
        part.write_bytes(big_blob + b"more")
    elif damage in ("part a directory", "part a symlink"):
        part.unlink()
        if damage == "part a directory":
            part.mkdir()
        else:
            part.symlink_to(part.parent / "elsewhere")
        with pytest.raises(FetchError, match=r"\.part is not a regular file") as refused:
            fetch_model(pinned, retries=0, backoff_s=0)
        assert refused.value.hint == f"remove {part} and fetch again"
        assert not (part.parent / "elsewhere").exists()
        return
    else:
        sidecar.write_text({"sidecar a list": "[]", "sidecar not JSON": "{", "sidecar empty": ""}[damage])
    result = fetch_model(pinned, retries=0, backoff_s=0)
    assert result.sha256 == sha(big_blob) and result.path.read_bytes() == big_blob


def test_repeated_drops_are_retried_within_one_call(hub: FakeHub, big_blob: bytes) -> None:
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [100, 1000, 1 << 20, 0]  # four hang-ups at growing offsets (0: nothing new at all)
    warnings: list[Event] = []
    result = fetch_model(hub.file_url(name), retries=2, backoff_s=0, reporter=warnings.append)
    assert result.sha256 == sha(big_blob)
    ranges = [item.headers.get("Range") for item in hub.requests(server="cdn", method="GET")]
    assert ranges == [
        None,
        "bytes=100-",
        "bytes=1100-",
        f"bytes={1100 + (1 << 20)}-",
        f"bytes={1100 + (1 << 20)}-",
    ]
    assert sum(event.kind == "warning" for event in warnings) == 4


def test_retries_are_bounded(hub: FakeHub, big_blob: bytes) -> None:
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [10, 0, 0, 0, 0]  # progress once, then no progress on every retry
    with pytest.raises(FetchError, match="after 2 retries"):
        fetch_model(hub.file_url(name), retries=2, backoff_s=0)
    assert len(hub.requests(server="cdn", method="GET")) == 3  # the first, then 2 retries that bring nothing


def test_backoff_doubles_and_is_capped() -> None:
    assert [wait_seconds(n, 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert wait_seconds(50, 1.0) == 30.0


def test_range_requests_and_answers() -> None:
    """The one range client's request and Content-Range reading (model downloads and remote header reads)."""
    resume = range_request("https://h/x.gguf", 100, private_headers={"Authorization": "t"}, if_range='"e1"')
    assert (resume.get_header("Range"), resume.get_header("If-range")) == ("bytes=100-", '"e1"')
    assert resume.get_header("Accept-encoding") == "identity"
    assert "Authorization" not in resume.headers and resume.unredirected_hdrs["Authorization"] == "t"
    assert range_request("https://h/x.gguf", 0, 99).get_header("Range") == "bytes=0-99"
    assert range_request("https://h/x.gguf", if_range='"e1"').get_header("Range") is None  # the whole file
    assert content_range("bytes 100-199/200") == (100, 199, 200)
    assert content_range("bytes 0-9/*") == (0, 9, None)
    assert content_range("bytes */200") is None and content_range(None) is None


def test_server_that_ignores_range_restarts_from_zero(hub: FakeHub, big_blob: bytes) -> None:
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [5000]
    hub.faults.ignore_range = True
    result = fetch_model(hub.file_url(name), retries=1, backoff_s=0)
    assert result.sha256 == sha(big_blob) and result.size == len(big_blob)


def test_resume_hashes_the_existing_prefix_once(hub: FakeHub, big_blob: bytes) -> None:
    """A .part from an earlier run is hashed first and the download continues after it (one pass overall)."""
    name = hub.add("org/repo", "blob.gguf", big_blob)
    hub.faults.drops = [123_456]
    with pytest.raises(FetchError):
        fetch_model(hub.file_url(name), retries=0, backoff_s=0)
    events: list[Event] = []
    fetch_model(hub.file_url(name), backoff_s=0, reporter=events.append)
    hashing = [e for e in events if e.kind == "progress" and "hashing" in e.message]
    assert hashing and hashing[-1].completed == 123_456
    downloading = [e for e in events if e.kind == "progress" and "downloading" in e.message]
    assert downloading[-1].completed == len(big_blob)


# --- corrupt bytes, wrong sizes ------------------------------------------------------------------------------


def test_corrupt_bytes_are_quarantined_and_the_cache_is_untouched(hub: FakeHub, tiny_gguf: bytes) -> None:
    good = fetch_model(hub.file_url(hub.add("org/repo", "other.gguf", random_gguf(4096, seed=11))))
    store_before = sorted(p.name for p in (modelstore.models_root() / "sha256").iterdir())
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    hub.faults.corrupt = True
    recipe = ModelRecipe(name="tiny", source=hub.file_url(name), sha256=sha(tiny_gguf))
    with pytest.raises(ModelChecksumMismatch, match=f"expected {sha(tiny_gguf)}") as caught:
        fetch_model(recipe, backoff_s=0)
    assert "quarantine" in (caught.value.hint or "")
    rejected = list((modelstore.models_root() / "quarantine").glob("*.rejected"))
    assert len(rejected) == 1 and rejected[0].read_bytes()[:-1] == tiny_gguf[:-1]
    assert sorted(p.name for p in (modelstore.models_root() / "sha256").iterdir()) == store_before
    assert modelstore.lookup(sha(tiny_gguf)) is None and modelstore.lookup(good.sha256) is not None
    assert not list((modelstore.models_root() / "partial").glob("*.part"))
    hub.faults.corrupt = False
    assert fetch_model(recipe).sha256 == sha(tiny_gguf)  # fetching again downloads afresh


@pytest.mark.parametrize("delta", [1, -1])
def test_wrong_size_fails(hub: FakeHub, tiny_gguf: bytes, delta: int) -> None:
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    recipe = ModelRecipe(name="tiny", source=hub.file_url(name), size=len(tiny_gguf) + delta)
    with pytest.raises(ModelChecksumMismatch, match=f"expected {len(tiny_gguf) + delta} bytes"):
        fetch_model(recipe, retries=1, backoff_s=0)
    assert modelstore.lookup(sha(tiny_gguf)) is None


def test_a_size_pin_holds_for_a_file_already_fetched_from_its_source(hub: FakeHub, tiny_gguf: bytes) -> None:
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    fetch_model(hub.file_url(name), backoff_s=0)
    recipe = ModelRecipe(
        name="tiny", source=hub.file_url(name), size=5
    )  # found by its source, not its sha256
    with pytest.raises(ModelChecksumMismatch, match="expected 5 bytes"):
        fetch_model(recipe, retries=1, backoff_s=0)


def test_a_url_with_other_than_ascii_is_percent_encoded(hub: FakeHub, tiny_gguf: bytes) -> None:
    digest = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    hub.redirects["/%C3%BCn%C3%AF.gguf"] = hub.file_url(
        digest
    )  # what the server is asked for: UTF-8, escaped
    fetched = fetch_model(f"{hub.cdn_url}/ünï.gguf", backoff_s=0)
    assert fetched.sha256 == sha(tiny_gguf)


def test_server_sending_too_many_bytes_fails(hub: FakeHub, tiny_gguf: bytes) -> None:
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    hub.faults.extra_bytes = 10
    recipe = ModelRecipe(name="tiny", source=hub.file_url(name), size=len(tiny_gguf))
    with pytest.raises(ModelChecksumMismatch, match="bytes"):
        fetch_model(recipe, backoff_s=0)


def test_http_404_is_a_clear_error(hub: FakeHub) -> None:
    with pytest.raises(FetchError, match="HTTP 404") as caught:
        fetch_model(hub.file_url("missing"), backoff_s=0)
    assert "not found" in (caught.value.hint or "")


# --- offline, file://, cancel --------------------------------------------------------------------------------


def test_offline_serves_only_the_cache(hub: FakeHub, tiny_gguf: bytes) -> None:
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    with pytest.raises(FetchError, match="--offline"):
        fetch_model(hub.file_url(name), offline=True)
    assert not hub.requests()
    fetched = fetch_model(hub.file_url(name))
    count = len(hub.requests())
    assert fetch_model(hub.file_url(name), offline=True).path == fetched.path
    pinned = ModelRecipe(name="pinned", source="https://example.invalid/x.gguf", sha256=sha(tiny_gguf))
    assert fetch_model(pinned, offline=True).path == fetched.path  # a pinned sha256 is found by content
    with pytest.raises(FetchError, match="not in the model cache"):
        fetch_model("hf://org/repo/tiny.gguf", offline=True)
    assert len(hub.requests()) == count


@pytest.mark.parametrize(
    "damage",
    [
        "manifest not JSON",
        "manifest a list",
        "no filename",
        "size a string",
        "filename a path",
        "no manifest",
        "index",
    ],
)
def test_damaged_store_records_are_not_a_traceback(hub: FakeHub, tiny_gguf: bytes, damage: str) -> None:
    """A store entry's manifest.json or a source index record left damaged (a crash, a full disk, an edit) raised
    a raw JSONDecodeError, KeyError or ValueError from every command that looked the model up; a manifest naming
    a file outside its entry served that file; an entry without its manifest blocked publishing the same bytes
    again (OSError: directory not empty)."""
    name = hub.add("org/repo", "tiny.gguf", tiny_gguf)
    fetched = fetch_model(hub.file_url(name))
    manifest = fetched.path.parent / modelstore.MANIFEST
    good = json.loads(manifest.read_text(encoding="utf-8"))
    outside = fetched.path.parent.parent / "outside.gguf"
    outside.write_bytes(tiny_gguf)
    record, text = (
        manifest,
        {
            "manifest not JSON": "{",
            "manifest a list": "[]",
            "no filename": json.dumps({**good, "filename": None}),
            "size a string": json.dumps({**good, "size": "big"}),
            "filename a path": json.dumps({**good, "filename": str(outside)}),
        }.get(damage, "{"),
    )
    if damage == "index":
        (record,) = (modelstore.models_root() / "sources").glob("*.json")
    if damage == "no manifest":
        manifest.unlink()
    else:
        record.write_text(text, encoding="utf-8")
    with pytest.raises(FetchError, match="not in the model cache"):
        fetch_model(hub.file_url(name), offline=True)
    notes = [note.read_text() for note in modelstore.models_root().glob("quarantine/*.entry/QUARANTINED")]
    assert notes == {
        "index": [],
        "no manifest": ["no manifest.json: not an entry the store published\n"],
    }.get(damage, ["manifest.json is damaged (not JSON, or no plain filename and size)\n"])
    # downloaded again, or found by content once the index is rewritten
    again = fetch_model(hub.file_url(name))
    assert again.path == fetched.path and again.sha256 == sha(tiny_gguf)
    assert fetch_model(hub.file_url(name), offline=True).path == fetched.path


def test_file_url_is_copied_hashed_and_published(lf_home: Path, tmp_path: Path, tiny_gguf: bytes) -> None:
    source = tmp_path / "local model.gguf"
    source.write_bytes(tiny_gguf)
    result = fetch_model(source.as_uri(), offline=True)
    assert result.sha256 == sha(tiny_gguf) and result.path.name == "local model.gguf"
    assert fetch_model(source.as_uri()).cached
    with pytest.raises(ModelError, match=r"nope\.gguf does not exist"):
        fetch_model((tmp_path / "nope.gguf").as_uri())
    with pytest.raises(InvalidOption):
        fetch_model(source.as_uri(), revision="main")


def test_cancel_stops_the_download_and_keeps_the_part(hub: FakeHub, big_blob: bytes) -> None:
    name = hub.add("org/repo", "blob.gguf", big_blob)
    cancel = CancelToken()

    def reporter(event: Event) -> None:
        if event.kind == "progress" and (event.completed or 0) >= 1 << 20:
            cancel.cancel()

    with pytest.raises(Cancelled):
        fetch_model(hub.file_url(name), cancel=cancel, reporter=reporter)
    assert modelstore.lookup(sha(big_blob)) is None
    assert list((modelstore.models_root() / "partial").glob("*.part"))


# --- hf:// through huggingface_hub -----------------------------------------------------------------------------


def test_hf_fetch_through_huggingface_hub_with_token(
    hub: FakeHub, tiny_gguf: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.token = TOKEN
    digest = hub.add("org/Tiny-GGUF", "sub/tiny-Q8_0.gguf", tiny_gguf)
    events: list[Event] = []
    with pytest.raises(FetchError, match="not found"):
        fetch_model("hf://org/Tiny-GGUF/sub/tiny-Q8_0.gguf", backoff_s=0)  # no token: the hub says no
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = fetch_model("hf://org/Tiny-GGUF/sub/tiny-Q8_0.gguf", reporter=events.append, backoff_s=0)
    assert (result.sha256, result.commit, result.revision) == (digest, COMMIT, "main")
    assert result.path.name == "tiny-Q8_0.gguf"
    heads = hub.requests(server="hub", method="HEAD")
    assert heads and heads[-1].path == "/org/Tiny-GGUF/resolve/main/sub/tiny-Q8_0.gguf"
    gets = hub.requests(server="hub", method="GET")
    assert gets[-1].path == f"/org/Tiny-GGUF/resolve/{COMMIT}/sub/tiny-Q8_0.gguf"  # pinned to the commit
    assert gets[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    # The redirect target (CDN, another origin) never sees the token.
    assert all("Authorization" not in item.headers for item in hub.requests(server="cdn"))
    # Nor does anything written or reported.
    assert TOKEN not in all_text_under(modelstore.models_root())
    assert all(TOKEN not in event.message for event in events)
    manifest = json.loads((result.path.parent / "manifest.json").read_text())
    assert manifest["source"] == "hf://org/Tiny-GGUF/sub/tiny-Q8_0.gguf" and manifest["commit"] == COMMIT
    # Online, the moving revision "main" is asked again (HEAD), but the bytes come from the store.
    gets = len(hub.requests(method="GET"))
    again = fetch_model("hf://org/Tiny-GGUF/sub/tiny-Q8_0.gguf")
    assert again.cached and again.path == result.path and len(hub.requests(method="GET")) == gets
    assert len(hub.requests(server="hub", method="HEAD")) == len(heads) + 1
    # Offline, it is served from the index without a request.
    count = len(hub.requests())
    assert fetch_model("hf://org/Tiny-GGUF/sub/tiny-Q8_0.gguf", offline=True).path == result.path
    assert len(hub.requests()) == count


def test_hf_pinned_sha256_that_the_hub_contradicts_fails_before_downloading(
    hub: FakeHub, tiny_gguf: bytes
) -> None:
    hub.add("org/repo", "tiny.gguf", tiny_gguf)
    recipe = ModelRecipe(name="tiny", source="hf://org/repo/tiny.gguf", sha256="0" * 64)
    with pytest.raises(ModelChecksumMismatch, match="hub publishes"):
        fetch_model(recipe)
    assert not hub.requests(method="GET")


def test_hf_errors_name_the_file_and_the_revision(hub: FakeHub, tiny_gguf: bytes) -> None:
    hub.add("org/repo", "tiny.gguf", tiny_gguf)
    with pytest.raises(FetchError, match=r"no file 'other\.gguf'"):
        fetch_model("hf://org/repo/other.gguf")
    with pytest.raises(FetchError, match="revision 'v9' not found"):
        fetch_model("hf://org/repo/tiny.gguf", revision="v9")


def test_hf_corrupt_cdn_bytes_fail_against_the_hub_sha256(hub: FakeHub, tiny_gguf: bytes) -> None:
    hub.add("org/repo", "tiny.gguf", tiny_gguf)
    hub.faults.corrupt = True
    with pytest.raises(ModelChecksumMismatch, match="sha256 mismatch"):
        fetch_model("hf://org/repo/tiny.gguf", backoff_s=0)
    assert modelstore.lookup(sha(tiny_gguf)) is None


def test_unreachable_hub_is_a_clear_error(lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(FetchError, match="did not answer") as caught:
        fetch_model("hf://org/repo/tiny.gguf")
    assert "--offline" in (caught.value.hint or "")


# --- ms:// through modelscope_hub ------------------------------------------------------------------------------


def test_ms_fetch_through_modelscope_hub(
    hub: FakeHub, big_blob: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", MS_TOKEN)
    digest = hub.add("org/Tiny-GGUF", "tiny.gguf", big_blob)
    hub.faults.drops = [777_777]
    result = fetch_model("ms://org/Tiny-GGUF/tiny.gguf", backoff_s=0)
    assert (result.sha256, result.revision) == (digest, "master")
    downloads = [item for item in hub.requests(server="hub", method="GET") if "FilePath=" in item.path]
    assert [item.headers.get("Range") for item in downloads] == [None, "bytes=777777-"]
    assert downloads[-1].headers["Authorization"] == f"Bearer {MS_TOKEN}"
    assert MS_TOKEN not in all_text_under(modelstore.models_root())
    with pytest.raises(FetchError, match=r"no file 'missing\.gguf'"):
        fetch_model("ms://org/Tiny-GGUF/missing.gguf")


# --- odds and ends -----------------------------------------------------------------------------------------------


def test_redact_url_drops_credentials_and_query() -> None:
    assert redact_url("https://user:pw@host:8443/a/b.gguf?token=x#f") == "https://host:8443/a/b.gguf"


def test_cli_fetch_json_and_offline_exit_code(lf_home: Path, tmp_path: Path, tiny_gguf: bytes) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(tiny_gguf)
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    done = invoke("models.fetch", source.as_uri(), "--json", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["sha256"] == sha(tiny_gguf) and data["cached"] is False
    refused = invoke(
        "models.fetch", "https://example.invalid/x.gguf", "--offline", "--json", env=env, timeout=120
    )
    assert refused.returncode == FetchError.exit_code
    assert "--offline" in refused.stderr
