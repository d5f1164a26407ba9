"""Base images without a registry: ``debootstrap`` a Debian root and ``docker import`` it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import ImageError, ToolFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.runners.engine import docker_client

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
) -> BootstrapResult:
    """Create ``tag`` from a minimal Debian root made by debootstrap; reuse it when it already exists."""
    import docker.errors

    client = docker_client()
    mirror = mirror or apt_mirror()
    if not force:
        try:
            image = client.images.get(tag)
            return BootstrapResult(tag, image.id, mirror, suite, reused=True)
        except docker.errors.ImageNotFound:
            pass
    if shutil.which("debootstrap") is None:
        raise ImageError(
            "debootstrap is not installed", hint="apt-get install debootstrap (needs root), then retry"
        )
    with tempfile.TemporaryDirectory(prefix="llamaforge-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        command = ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]
        reporter(Event("stage", f"debootstrap {suite} from {mirror}", stage="bootstrap"))
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        remove = cancel.on_cancel(process.terminate) if cancel else None
        try:
            assert process.stdout is not None
            for line in process.stdout:
                tail = [*tail[-30:], line.rstrip()]
                reporter(Event("log", line.rstrip(), stage="bootstrap"))
            process.wait()
        finally:
            if remove:
                remove()
            if process.stdout is not None:
                process.stdout.close()
        if cancel:
            cancel.raise_if_cancelled()
        if process.returncode != 0:
            raise ToolFailed(
                "debootstrap failed", command=command, returncode=process.returncode, tail=tail,
                hint="debootstrap needs root and a reachable Debian mirror",
            )  # fmt: skip
        reporter(Event("stage", f"docker import as {tag}", stage="bootstrap"))
        archive = Path(scratch) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version or "latest")
    image = client.images.get(tag)
    return BootstrapResult(tag, image.id, mirror, suite, reused=False)
