"""The wine image the suite runs the mingw build's .exe files in: Debian bookworm's wine (8.0) on the local base
image, made through the core's image builder (no registry), with a Windows prefix initialised once at build time.
A container of it gets the build's bin/ and the tiny model mounted read-only; nothing is published outside it."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from llamaforge.runners.engine import build_image, image_id

DOCKERFILE = """\
FROM {base}
ARG DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \\
 && apt-get install -y --no-install-recommends wine wine64 curl ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
# No Mono or Gecko prompts, no debug chatter; the prefix is made once here, not in every test.
ENV WINEPREFIX=/opt/wine WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" WINEARCH=win64
RUN wine wineboot --init && wineserver -w
WORKDIR /opt/build/bin
"""


def image_tag(base: str) -> str:
    """Tag of the wine image made from ``base`` (changes with the Dockerfile)."""
    digest = hashlib.sha256(DOCKERFILE.format(base=base).encode()).hexdigest()[:12]
    return f"llamaforge-wine:{digest}"


def ensure_image(base: str) -> str:
    """The wine image, built from ``base`` unless it exists."""
    tag = image_tag(base)
    if image_id(tag) is not None:
        return tag
    with tempfile.TemporaryDirectory(prefix="llamaforge-wine-") as context:
        Path(context, "Dockerfile").write_text(DOCKERFILE.format(base=base), encoding="utf-8")
        build_image(Path(context), tag)
    return tag
