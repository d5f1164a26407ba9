"""Base images without a registry: ``debootstrap`` a Debian root and ``docker import`` it.

The suite, the mirror and the tag are checked before debootstrap sees them: the suite is a plain Debian suite
name, the mirror an http(s) URL the front's URL policy allows, the tag an image reference.
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import ImageError, InvalidOption
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.guard import check_url
from llamaforge.core.validation import check_image_reference
from llamaforge.runners.engine import image_id, import_image
from llamaforge.runners.process import LOCAL, ProcessRunner

DEFAULT_TAG = "llamaforge/debian:bookworm"
DEFAULT_SUITE = "bookworm"
_SUITE = re.compile(r"[a-z][a-z0-9-]{0,31}")  # bookworm, trixie, sid, stable, bookworm-backports
_MIRROR = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+-]*)*/?")


@dataclass(frozen=True)
class BootstrapResult:
    """The imported image."""

    tag: str
    image_id: str
    mirror: str
    suite: str
    reused: bool


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (so the image reaches the same mirror)."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        match = re.search(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(https?://\S+/debian)/?\s*$", text, re.M)
        if match is None:
            match = re.search(r"(https?://\S+/debian)\b(?!-)", text)
        if match:
            return match.group(1)
    return "http://deb.debian.org/debian"


def check_bootstrap_inputs(tag: str, suite: str, mirror: str) -> None:
    """Refuse a suite that is no plain suite name, a mirror that is no plain http(s) URL (or that the URL policy
    refuses) and a tag that is no image reference: each becomes a debootstrap argument or an image name."""
    if not _SUITE.fullmatch(suite):
        raise InvalidOption(
            f"suite {suite!r} is not a Debian suite name", hint="e.g. bookworm, trixie, stable (lower case)"
        )
    if not _MIRROR.fullmatch(mirror):
        raise InvalidOption(
            f"mirror {mirror!r} is not an http(s) URL of a Debian mirror",
            hint="e.g. http://deb.debian.org/debian (no spaces, query or user name)",
        )
    check_url(mirror, what="Debian mirror")
    try:
        check_image_reference(tag)
    except ValueError as error:
        raise InvalidOption(f"tag: {error}", hint="e.g. llamaforge/debian:bookworm") from None


def bootstrap_image(
    tag: str = DEFAULT_TAG,
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> BootstrapResult:
    """Create ``tag`` from a minimal Debian root made by debootstrap (run by ``runner``); reuse it when it
    already exists."""
    mirror = apt_mirror() if mirror is None else mirror
    check_bootstrap_inputs(tag, suite, mirror)
    existing = image_id(tag)
    if existing is not None and not force:
        return BootstrapResult(tag, existing, mirror, suite, reused=True)
    if shutil.which("debootstrap") is None:
        raise ImageError(
            "debootstrap is not installed", hint="apt-get install debootstrap (needs root), then retry"
        )
    with tempfile.TemporaryDirectory(prefix="llamaforge-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        command = ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]
        reporter(Event("stage", f"debootstrap {suite} from {mirror}", stage="bootstrap"))
        runner.run(
            command,
            merge_stderr=True,
            cancel=cancel,
            what="debootstrap",
            on_line=lambda line: reporter(Event("log", line, stage="bootstrap")),
            hint="debootstrap needs root and a reachable Debian mirror",
        )
        reporter(Event("stage", f"docker import as {tag}", stage="bootstrap"))
        archive = Path(scratch) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        imported = import_image(archive, tag)
    return BootstrapResult(tag, imported, mirror, suite, reused=False)
