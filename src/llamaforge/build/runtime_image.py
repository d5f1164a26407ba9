"""Runtime images: a build's ``bin/`` and ``lib/`` on the local base image, made on the local engine (no
registry), with what llama-server needs at run time, a non-root user, a HEALTHCHECK on ``/health`` and
provenance labels.

Planning is pure but for ``ldd``/``dpkg`` run by a runner on this machine: every library the build's binaries
need that the build does not carry is either a Debian package (``dpkg -S`` names it, apt installs it in the
image, e.g. ``libvulkan1``) or, when no package owns it, a file copied into the image's ``lib/``. The image's
own ``RUN ldd`` step then fails the build if anything is still missing. The tag is derived from the build key;
the plan's digest is a label, so an image made from another plan (a changed template) is rebuilt, and the
same plan is a cache hit.

Labels carry only what llamaforge read: the build's manifest (key, its sha256, recipe, llama.cpp commit and
build number) and the base image's id as the engine reports it. No registry digest exists for a local image,
so none is written.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.backends import get_backend
from llamaforge.core.errors import ImageError
from llamaforge.core.events import Event, Reporter, null_reporter
from llamaforge.core.guard import refuse_if_read_only
from llamaforge.core.templates import render
from llamaforge.runners.process import LOCAL, ProcessRunner

REPOSITORY = "llamaforge/llama-server"
PREFIX = "/opt/llamaforge"
PORT = 8080
MODEL_PATH = "/models/model.gguf"
UID = 10001
LABEL_KEY = "org.llamaforge.build.key"
LABEL_PLAN = "org.llamaforge.runtime.plan"
# Libraries every image has from libc6 (the base image's own).
_GLIBC = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|linux-vdso)\.so")
# The health check of the image (and of Swarm services made from it): a shell, so the port follows LLAMA_ARG_PORT.
HEALTHCHECK = 'curl -fsS "http://127.0.0.1:${LLAMA_ARG_PORT}/health" >/dev/null || exit 1'


def runtime_tag(build_key: str) -> str:
    """The runtime image's tag for ``build_key``."""
    return f"{REPOSITORY}:{build_key}"


@dataclass(frozen=True)
class RuntimePlan:
    """What goes into a build's runtime image."""

    tag: str
    base: str
    files: tuple[tuple[Path, str], ...]  # (local file, path under PREFIX)
    packages: tuple[str, ...]
    copied_libraries: tuple[str, ...]
    labels: dict[str, str]
    dockerfile: str

    @property
    def digest(self) -> str:
        """sha256 of the Dockerfile and of the files' names (their content is fixed by the build key)."""
        payload = json.dumps([self.dockerfile, [name for _, name in self.files]])
        return hashlib.sha256(payload.encode()).hexdigest()


def _is_library(path: Path) -> bool:
    return path.name.endswith(".so") or ".so." in path.name


def build_files(build_dir: Path) -> list[tuple[Path, str]]:
    """Every file of the build's ``bin/`` and ``lib/`` (whatever the build holds), as (file, ``bin/…``)."""
    found = []
    for part in ("bin", "lib"):
        folder = build_dir / part
        if folder.is_dir():
            found += [
                (path, f"{part}/{path.relative_to(folder)}")
                for path in sorted(folder.rglob("*"))
                if path.is_file()
            ]
    if not any(name == "bin/llama-server" for _, name in found):
        raise ImageError(f"{build_dir} has no bin/llama-server", hint="build with the llama-server target")
    return found


def _needed(files: list[tuple[Path, str]], runner: ProcessRunner) -> tuple[dict[str, Path], list[str]]:
    """Libraries the files need that the build does not carry: resolved (name -> file) and not found."""
    carried = {path.name for path, _ in files}
    resolved: dict[str, Path] = {}
    missing: list[str] = []
    for path, _ in files:
        for line in runner.run(["ldd", str(path)], warn=True).stdout.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[1] != "=>" or parts[0] in carried or _GLIBC.match(parts[0]):
                continue
            if parts[2] == "not" and parts[0] not in missing:
                missing.append(parts[0])
            elif parts[2].startswith("/"):
                resolved[parts[0]] = Path(parts[2]).resolve()
    return resolved, missing


def _package(library: Path, runner: ProcessRunner) -> str | None:
    """The Debian package that owns ``library``; dpkg knows a file by the path its package ships it at, which
    on a merged-/usr system may be /lib/… or /usr/lib/…, so both are asked."""
    text = str(library)
    other = text.removeprefix("/usr") if text.startswith("/usr/lib/") else "/usr" + text
    for candidate in (text, other):
        result = runner.run(["dpkg", "-S", candidate], warn=True)
        if result.ok and ":" in result.stdout:
            return result.stdout.split(":", 1)[0].strip().split(",")[0].strip()
    return None


def provenance_labels(manifest: dict[str, Any], manifest_sha256: str, base_id: str) -> dict[str, str]:
    """OCI and llamaforge labels from the manifest (and the base image id the engine reported)."""
    source = manifest.get("source", {})
    recipe = manifest.get("recipe", {})
    commit = str(source.get("commit", ""))
    return {
        "org.opencontainers.image.title": "llama-server",
        "org.opencontainers.image.description": f"llama.cpp's llama-server, llamaforge build {manifest['key']}",
        "org.opencontainers.image.version": f"b{source.get('build_number', '')}",
        "org.opencontainers.image.revision": commit,
        "org.opencontainers.image.source": "https://github.com/ggml-org/llama.cpp",
        "org.opencontainers.image.licenses": "MIT",
        "org.opencontainers.image.created": str(manifest.get("finished_at", "")),
        "org.opencontainers.image.base.name": str(manifest.get("image", {}).get("base_tag", "")),
        LABEL_KEY: str(manifest["key"]),
        "org.llamaforge.build.manifest.sha256": manifest_sha256,
        "org.llamaforge.build.recipe": str(recipe.get("name", "")),
        "org.llamaforge.build.backend": str(manifest.get("backend", "")),
        "org.llamaforge.llama.cpp.commit": commit,
        "org.llamaforge.llama.cpp.build_number": str(source.get("build_number", "")),
        "org.llamaforge.base.id": base_id,
    }


def plan_runtime_image(
    manifest: dict[str, Any], build_dir: Path, base: str, base_id: str, runner: ProcessRunner = LOCAL
) -> RuntimePlan:
    """The runtime image for the build of ``manifest`` in ``build_dir`` on ``base`` (image id ``base_id``)."""
    from llamaforge.runners.ssh.transfer import file_sha256

    files = build_files(build_dir)
    resolved, missing = _needed(files, runner)
    # The backend's driver libraries are mounted by the container runtime; its runtime libraries come with the
    # packages it installs in the image (this machine need not have them).
    backend = get_backend(str(manifest.get("backend") or "cpu"))
    allowed = [name for name in missing if name in backend.driver_libraries]
    refused = [name for name in missing if name not in allowed and name not in backend.runtime_libraries]
    if refused:
        raise ImageError(
            f"the build's binaries need {', '.join(refused)}, which this machine does not have",
            hint="install the packages that provide them here (ldd finds them), or use a base image that has them",
        )
    packages: set[str] = {"curl", *backend.runtime_packages}
    copied: list[tuple[Path, str]] = []
    for name, path in sorted(resolved.items()):
        package = _package(path, runner)
        if package is None:
            copied.append((path, f"lib/{name}"))
        else:
            packages.add(package)
    labels = provenance_labels(manifest, file_sha256(build_dir / "manifest.json"), base_id)
    everything = tuple(files + copied)
    dockerfile = render(
        "deploy/Dockerfile.runtime.j2",
        key=manifest["key"],
        base=base,
        packages=sorted(packages),
        uid=UID,
        prefix=PREFIX,
        port=PORT,
        missing_ok=allowed,
        labels=labels,
        healthcheck=HEALTHCHECK,
    )
    return RuntimePlan(
        runtime_tag(str(manifest["key"])),
        base,
        everything,
        tuple(sorted(packages)),
        tuple(name for _, name in copied),
        labels,
        dockerfile,
    )


@dataclass(frozen=True)
class RuntimeImageResult:
    """The runtime image on the engine."""

    tag: str
    image_id: str
    reused: bool
    plan: RuntimePlan
    labels: dict[str, str]  # as the engine reports them


def ensure_runtime_image(
    build_key: str,
    *,
    base: str | None = None,
    force: bool = False,
    reporter: Reporter = null_reporter,
    runner: ProcessRunner = LOCAL,
) -> RuntimeImageResult:
    """The runtime image of build ``build_key`` (a unique prefix will do): reused when the engine has it from
    the same plan, built otherwise."""
    from llamaforge.build.images import DEFAULT_TAG
    from llamaforge.build.store import build_dir, find_build
    from llamaforge.runners.engine import build_image, image_id, image_labels, remove_unused_image

    manifest = find_build(build_key)
    base = base or str(manifest.get("image", {}).get("base_tag") or DEFAULT_TAG)
    base_id = image_id(base)
    if base_id is None:
        raise ImageError(
            f"the base image {base} is not on the Docker engine",
            hint="`invoke images.bootstrap` makes llamaforge/debian:bookworm",
        )
    plan = plan_runtime_image(manifest, build_dir(str(manifest["key"])), base, base_id, runner)
    existing = image_id(plan.tag)
    if existing is not None and not force:
        labels = image_labels(plan.tag)
        if labels.get(LABEL_PLAN) == plan.digest:
            return RuntimeImageResult(plan.tag, existing, True, plan, labels)
    refuse_if_read_only(f"build the runtime image {plan.tag}")
    reporter(Event("stage", f"building {plan.tag} on {base}", stage="image"))
    with tempfile.TemporaryDirectory(prefix="llamaforge-runtime-") as scratch:
        context = Path(scratch)
        for source, name in plan.files:
            target = context / "opt" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        # The plan digest is known only once the Dockerfile is rendered, so its label is the last line.
        text = plan.dockerfile + f"LABEL {json.dumps(LABEL_PLAN)}={json.dumps(plan.digest)}\n"
        (context / "Dockerfile").write_text(text, encoding="utf-8")
        built = build_image(
            context, plan.tag, on_line=lambda line: reporter(Event("log", line, stage="image"))
        )
    if existing is not None and existing != built:
        remove_unused_image(existing)  # the tag moved: the image it named is left untagged, unless in use
    return RuntimeImageResult(plan.tag, built, False, plan, image_labels(plan.tag))
