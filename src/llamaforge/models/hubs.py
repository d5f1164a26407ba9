"""Model hubs: turn ``hf://`` and ``ms://`` sources into a pinned download (URL, commit, sha256, size).

Hugging Face goes through ``huggingface_hub`` (its URL scheme, ``HF_ENDPOINT`` mirrors, token lookup and the
HEAD metadata that carries the commit and the LFS sha256); ModelScope through ``modelscope_hub`` (its file
listing carries the sha256 and size, its client builds the file URL and reads ``MODELSCOPE_ENDPOINT`` and
``MODELSCOPE_API_TOKEN``). The bytes themselves go through llamaforge's own resumable downloader, so the
sha256 is computed while they arrive and the store stays content-addressed.

Tokens only ever travel in request headers marked private (never forwarded to a redirect target, such as a
CDN), and never reach a manifest, a lock file, an event or an error message. Each hub's endpoint is checked
before it is asked (the host guard; plain ``http://`` only on loopback or for a pinned file).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from llamaforge.core.errors import FetchError
from llamaforge.models.urls import check_model_url

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubSource:
    """A parsed ``hf://owner/repo/path`` or ``ms://owner/repo/path``."""

    hub: str  # "hf" or "ms"
    repo_id: str
    path: str

    @property
    def filename(self) -> str:
        """Base name of the file in the repository."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class HubFile:
    """A file on a hub, resolved at one revision."""

    source: HubSource
    revision: str  # what was asked for (branch, tag or commit)
    commit: str | None  # the commit it resolved to (None where the hub does not tell)
    sha256: str | None  # as published by the hub (LFS metadata); None when it publishes none
    size: int | None
    url: str  # download URL pinned to the commit when known
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # sent to every host
    private_headers: dict[str, str] = field(default_factory=dict, repr=False)  # hub host only (auth)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be printed (used to scrub messages)."""
        return tuple(value for value in self.private_headers.values() if value)


def parse_hub_source(source: str) -> HubSource:
    """Split ``hf://owner/repo/path/in/repo.gguf`` into its parts."""
    match = re.fullmatch(r"(hf|ms)://([^/]+/[^/]+)/(.+)", source)
    if not match:
        raise FetchError(f"{source!r} is not a hub source", hint="use hf://owner/repo/path/in/repo.gguf")
    return HubSource(hub=match.group(1), repo_id=match.group(2), path=match.group(3))


def default_revision(hub: str) -> str:
    """The branch a hub serves when no revision is given."""
    return "main" if hub == "hf" else "master"


def is_commit(revision: str | None) -> bool:
    """True for a full 40-hex commit id."""
    return bool(revision and _COMMIT.fullmatch(revision))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret value replaced (error messages from clients may echo headers)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def resolve(source: HubSource, revision: str | None, *, pinned: bool = False) -> HubFile:
    """Resolve ``source`` at ``revision`` (default branch when None) against its hub.

    The hub's endpoint is checked first (:func:`~llamaforge.models.urls.check_model_url`): a plain ``http://``
    endpoint on another machine is refused unless the recipe ``pinned`` the file's sha256, since the sha256
    and commit it would publish could be anyone's.
    """
    if source.hub == "hf":
        return _resolve_hf(source, revision or default_revision("hf"), pinned)
    return _resolve_ms(source, revision or default_revision("ms"), pinned)


# --- Hugging Face ------------------------------------------------------------------------------------------


def hf_endpoint() -> str | None:
    """The Hugging Face endpoint in force (``HF_ENDPOINT``, read at call time so mirrors apply)."""
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def hf_token() -> str | None:
    """The Hugging Face token: ``HF_TOKEN``, else the one ``hf auth login`` saved."""
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token()


def _resolve_hf(source: HubSource, revision: str, pinned: bool) -> HubFile:
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # documented public API

    endpoint = hf_endpoint()
    token = hf_token()
    secrets = (token,) if token else ()
    where = f"hf://{source.repo_id}/{source.path}@{revision}"
    url = hf_hub_url(source.repo_id, source.path, revision=revision, endpoint=endpoint)
    check_model_url(url, plain_http_ok=pinned, what="Hugging Face endpoint", token=bool(token))
    try:
        meta = get_hf_file_metadata(url, token=token or False, endpoint=endpoint)
    except GatedRepoError:
        raise FetchError(
            f"{where}: the repository is gated", hint="accept its terms on the hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise FetchError(
            f"{where}: repository {source.repo_id} not found (or private)",
            hint="check the repo id; for a private repo set HF_TOKEN",
        ) from None
    except RevisionNotFoundError:
        raise FetchError(f"{where}: revision {revision!r} not found", hint="check --revision") from None
    except EntryNotFoundError:
        raise FetchError(
            f"{where}: no file {source.path!r} in {source.repo_id}", hint="check the file name in the recipe"
        ) from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        raise FetchError(
            f"{where}: the hub did not answer: {scrub(str(error), secrets)}",
            hint="check the network, or set HF_ENDPOINT to a reachable mirror (`invoke models.fetch --offline` "
            "serves a copy already in the model cache)",
        ) from None
    commit = meta.commit_hash if is_commit(meta.commit_hash) else None
    # For LFS/Xet files the (linked) ETag is the sha256 of the content; a git blob's is a sha1.
    sha256 = meta.etag if meta.etag and _SHA256.fullmatch(meta.etag) else None
    download_url = hf_hub_url(source.repo_id, source.path, revision=commit or revision, endpoint=endpoint)
    headers = build_hf_headers(token=token or False)
    private = {key: value for key, value in headers.items() if key.lower() == "authorization"}
    public = {key: value for key, value in headers.items() if key.lower() != "authorization"}
    return HubFile(source, revision, commit, sha256, meta.size, download_url, public, private)


# --- ModelScope --------------------------------------------------------------------------------------------


def _resolve_ms(source: HubSource, revision: str, pinned: bool) -> HubFile:
    import requests
    from modelscope_hub import HubApi, HubConfig
    from modelscope_hub.errors import HubError

    config = HubConfig()  # read now, not at import: MODELSCOPE_ENDPOINT / MODELSCOPE_API_TOKEN apply per call
    token = config.token or None
    secrets = (token,) if token else ()
    where = f"ms://{source.repo_id}/{source.path}@{revision}"
    check_model_url(
        config.endpoint or "https://modelscope.cn",
        plain_http_ok=pinned,
        what="ModelScope endpoint",
        token=bool(token),
    )
    api = HubApi(config)
    try:
        files = api.list_repo_files(source.repo_id, "model", revision=revision, recursive=True)
    except (HubError, requests.RequestException, OSError) as error:
        raise FetchError(
            f"{where}: ModelScope did not answer: {scrub(str(error), secrets)}",
            hint="check the repo id and revision, the network, or MODELSCOPE_ENDPOINT (`invoke models.fetch "
            "--offline` serves a copy already in the model cache)",
        ) from None
    entry = next((item for item in files if item.path == source.path), None)
    if entry is None:
        raise FetchError(
            f"{where}: no file {source.path!r} in {source.repo_id}", hint="check the file name in the recipe"
        )
    sha256 = (entry.sha256 or "").lower() or None
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        sha256 = None
    url = api.legacy.get_download_url(source.repo_id, "model", source.path, revision)
    private: dict[str, str] = {}
    if token:
        # The legacy file endpoint accepts the bearer token and, on older deployments, the session cookie.
        private = {"Authorization": f"Bearer {token}", "Cookie": f"m_session_id={token}"}
    # ModelScope names no commit for a branch in its file listing: the sha256 is what pins the content.
    commit = revision if is_commit(revision) else None
    return HubFile(source, revision, commit, sha256, entry.size or None, url, {}, private)
