"""Base images without a registry: ``debootstrap`` a Debian root and ``docker import`` it."""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import ImageError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.runners.engine import image_id, import_image
from llamaforge.runners.process import LOCAL, ProcessRunner

DEFAULT_TAG = "llamaforge/debian:bookworm"
DEFAULT_SUITE = "bookworm"


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
    mirror = mirror or apt_mirror()
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
            command, merge_stderr=True, cancel=cancel, what="debootstrap",
            on_line=lambda line: reporter(Event("log", line, stage="bootstrap")),
            hint="debootstrap needs root and a reachable Debian mirror",
        )  # fmt: skip
        reporter(Event("stage", f"docker import as {tag}", stage="bootstrap"))
        archive = Path(scratch) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        imported = import_image(archive, tag)
    return BootstrapResult(tag, imported, mirror, suite, reused=False)
