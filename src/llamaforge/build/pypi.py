"""PyPI sdists fetched without running them.

``pip download`` prepares an sdist's metadata before it saves the file: it installs the sdist's build
dependencies and runs its build backend, that is, code anyone may publish, on this host. Here the file is found on
the package index's simple API instead (PEP 691 JSON, or the PEP 503 HTML page of an older index), downloaded
through the URL policy (:func:`llamaforge.core.guard.check_url`, every redirect included) and checked against the
sha256 the index states; the caller then checks it against the recipe's pin and extracts it with the safe
extractor. Nothing of the package runs.

The index is pip's own setting: ``PIP_INDEX_URL``, else ``global.index-url`` in pip's configuration files, else
PyPI; so a mirror or a proxy that pip uses serves these downloads too.
"""

from __future__ import annotations

import configparser
import html.parser
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from llamaforge.build.ca_bundle import pip_config_files
from llamaforge.build.download import check_redirect, download_url, sha256_file
from llamaforge.core.errors import ChecksumMismatch, SourceError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import check_url

DEFAULT_INDEX = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"
_MIRROR_HINT = "or put the sdist in a mirror directory (LLAMAFORGE_SOURCE_MIRROR)"


@dataclass(frozen=True)
class IndexFile:
    """One file the index lists for a project: its name, where to get it, the sha256 the index states."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool = False


def normalized(name: str) -> str:
    """A project name as the index keys it (PEP 503): ``llama_cpp.Python`` -> ``llama-cpp-python``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def index_url() -> str:
    """The package index pip would use: ``PIP_INDEX_URL``, else pip's ``global.index-url``, else PyPI's."""
    named = os.environ.get("PIP_INDEX_URL", "").split()
    if named:
        return named[0].rstrip("/")
    found = DEFAULT_INDEX
    for path in pip_config_files():
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue  # a file pip cannot read either; pip's own error names it when pip runs
        value = parser.get("global", "index-url", fallback="").split()
        if value:
            found = value[0].rstrip("/")
    return found


class _Links(html.parser.HTMLParser):
    """The anchors of a PEP 503 page: (href, text, data-yanked present)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, bool]] = []
        self._open: tuple[str, bool] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            values = dict(attrs)
            self._open = (values.get("href") or "", "data-yanked" in values)
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.links.append((self._open[0], "".join(self._text).strip(), self._open[1]))
            self._open = None


def _files_from_html(page: str, base: str) -> list[IndexFile]:
    parser = _Links()
    parser.feed(page)
    files = []
    for href, text, yanked in parser.links:
        url = urllib.parse.urljoin(base, href)
        fragment = urllib.parse.urlsplit(url).fragment
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        name = text or Path(urllib.parse.urlsplit(url).path).name
        files.append(IndexFile(name, urllib.parse.urldefrag(url).url, sha256, yanked))
    return files


def _files_from_json(data: object, base: str) -> list[IndexFile]:
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise SourceError(f"the package index answered {base} with JSON that lists no files")
    files = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            continue
        hashes = entry.get("hashes")
        sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
        sha256 = sha256 if isinstance(sha256, str) else None
        url = urllib.parse.urljoin(base, str(entry.get("url", "")))
        files.append(IndexFile(entry["filename"], url, sha256, bool(entry.get("yanked"))))
    return files


def project_files(package: str, *, index: str | None = None) -> list[IndexFile]:
    """Every file the index lists for ``package`` (SourceError: no such project, or an index out of reach)."""
    import urllib.error
    import urllib.request

    from llamaforge.core.http import checked_opener

    page = f"{index or index_url()}/{normalized(package)}/"
    check_url(page, what="package index page")
    request = urllib.request.Request(page, headers={"Accept": f"{_JSON}, text/html;q=0.1"})  # noqa: S310
    web = checked_opener(check_redirect, error=SourceError)
    try:
        with web.open(request, timeout=60) as response:
            kind = response.headers.get("Content-Type", "")
            body = response.read()
            where = response.geturl()
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 404:
            raise SourceError(
                f"the package index has no project {package!r} ({page} answered 404)",
                hint=f"check the package name, {_MIRROR_HINT}",
            ) from None
        raise SourceError(
            f"the package index answered {page} with HTTP {error.code}",
            hint=f"try again later, {_MIRROR_HINT}",
        ) from None
    except OSError as error:
        raise SourceError(
            f"the package index could not be reached ({page}): {error}",
            hint=f"check the network and PIP_INDEX_URL (or pip's index-url, proxy, CA bundle), {_MIRROR_HINT}",
        ) from None
    text = body.decode("utf-8", errors="replace")
    if kind.split(";")[0].strip() == _JSON:
        try:
            return _files_from_json(json.loads(text), where)
        except ValueError:
            raise SourceError(f"the package index answered {page} with JSON that cannot be read") from None
    return _files_from_html(text, where)


def _version_of(filename: str, project: str) -> str | None:
    """The version an sdist's file name states (``llama_cpp_python-0.3.36.tar.gz`` -> ``0.3.36``), None for a
    wheel or another project's file."""
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            stem = filename.removesuffix(suffix)
            name, _, version = stem.rpartition("-")
            return version if name and normalized(name) == project else None
    return None


def _version_key(version: str) -> list[tuple[int, int | str]]:
    """Order versions as people read them: 0.3.10 after 0.3.9 (numbers compare as numbers)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", version) if part]


def find_sdist(package: str, version: str, *, index: str | None = None) -> IndexFile:
    """The sdist of ``package==version`` on the index; a SourceError that lists the versions that have one when
    this one has none, and says so when its only file was yanked."""
    project = normalized(package)
    files = project_files(package, index=index)
    sdists = [(found, item) for item in files if (found := _version_of(item.filename, project)) is not None]
    matching = [item for found, item in sdists if found == version]
    live = [item for item in matching if not item.yanked]
    if live:
        return live[0]
    if matching:
        raise SourceError(
            f"{package}=={version}: its sdist {matching[0].filename} was yanked from the package index",
            hint="pick another version (a yanked release was withdrawn by its authors)",
        )
    versions = sorted({found for found, item in sdists if not item.yanked}, key=_version_key)
    if not versions:
        raise SourceError(
            f"the package index lists no sdist of {package} (only wheels, or nothing)",
            hint=f"check the package name, {_MIRROR_HINT}",
        )
    raise SourceError(
        f"{package}=={version}: the package index has no sdist of version {version}",
        hint=f"pick a version that has one (the latest: {', '.join(versions[-5:])})",
    )


def download_sdist(
    package: str,
    version: str,
    directory: Path,
    *,
    cancel: CancelToken | None = None,
    reporter: Reporter = null_reporter,
    index: str | None = None,
) -> Path:
    """Download the sdist of ``package==version`` into ``directory`` under its own file name, checked against
    the sha256 the index states (an index that states none is named as such); returns the file. No code of the
    package runs: the file is only downloaded and hashed."""
    found = find_sdist(package, version, index=index)
    if "/" in found.filename or found.filename in ("", ".", ".."):
        raise SourceError(f"the package index names the file {found.filename!r}, which is no file name")
    reporter(Event("info", f"downloading {found.filename} from the package index (not run)", stage="source"))
    target = directory / found.filename
    download_url(found.url, target, reporter, cancel)
    if found.sha256 is None:
        reporter(Event("warning", f"the package index states no sha256 for {found.filename}", stage="source"))
        return target
    actual = sha256_file(target, cancel)
    if actual != found.sha256.lower():
        target.unlink()
        raise ChecksumMismatch(
            f"{found.filename} does not have the sha256 the package index states: expected {found.sha256}, "
            f"got {actual}",
            hint="the download was damaged or altered on its way (a proxy?); nothing was kept: try again",
        )
    return target
