"""The shape of a build platform: what a recipe's ``platform`` means for a build.

A platform turns a recipe plus options into the build's environment (a builder image to make from a Dockerfile,
and the tools a host must have), its build script with the interpreter that runs it, and its artifact names. It
composes with the build's backend (:mod:`llamaforge.backends`): the backend says what it adds (CMake options,
builder packages, host tools), the platform where and how that is built."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from llamaforge.backends import get_backend
from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.recipes import BuildRecipe, ImageRef
from llamaforge.core.errors import InvalidOption

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions


def sha256_text(data: str | bytes) -> str:
    """Hex sha256 of ``data`` (text is hashed as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass(frozen=True)
class BuilderImage:
    """A builder image for container executors: made from ``dockerfile`` on ``base``, tagged ``tag``."""

    tag: str
    base: ImageRef
    dockerfile: str
    ca_bundle: Path | None = None  # copied next to the Dockerfile as ca-bundle.crt
    ca_bundle_origin: str | None = None  # --ca-bundle, or the host setting that named it (not in the key)

    def key_inputs(self) -> dict[str, Any]:
        """The image's part of the build key (the image id itself joins once the image exists)."""
        return {
            "dockerfile_sha256": sha256_text(self.dockerfile),
            "base_image": self.base.model_dump(mode="json"),
            "ca_bundle_sha256": sha256_text(self.ca_bundle.read_bytes()) if self.ca_bundle else None,
        }


def image_ca_bundle(options: BuildOptions, downloads_over_tls: bool) -> tuple[Path | None, str | None]:
    """The CA bundle a builder image installs, and where it came from: one given with ``--ca-bundle`` always;
    one the host's settings name only where the image downloads over TLS (pip, an https apt repository), so
    the images and keys of the other builds stay those of a build without one."""
    if options.ca_bundle is None or (options.ca_bundle_from_host and not downloads_over_tls):
        return None, None
    return options.ca_bundle, options.ca_bundle_from_host or "--ca-bundle"


def builder_tag(flavour: str, dockerfile: str, base: ImageRef, ca_bundle: Path | None) -> str:
    """The builder image's tag: a digest of its Dockerfile, base image and CA bundle (another bundle, another
    image; without one the digest is the one it always was)."""
    material: list[Any] = [dockerfile, base.model_dump(mode="json")]
    if ca_bundle is not None:
        material.append(sha256_text(ca_bundle.read_bytes()))
    return f"llamaforge-builder:{flavour}-{sha256_text(json.dumps(material, sort_keys=True))[:16]}"


@dataclass(frozen=True)
class HostTool:
    """A program a host executor needs on PATH (``optional`` ones only join the toolchain fingerprint)."""

    name: str
    hint: str = ""
    optional: bool = False


@dataclass(frozen=True)
class BuildEnvironment:
    """Where a build script can run: in a builder image (None: on a host only), and what a host must have."""

    image: BuilderImage | None
    host_tools: tuple[HostTool, ...] = ()

    def key_inputs(self) -> dict[str, Any]:
        """The environment's part of the build key; the executor's environment id completes it."""
        if self.image is None:
            return {"host_tools": [tool.name for tool in self.host_tools]}
        return self.image.key_inputs()


@dataclass(frozen=True)
class BuildScript:
    """The generated build script, its file name and the interpreter that runs it (``bash``, ``pwsh`` …)."""

    name: str
    text: str
    interpreter: tuple[str, ...]

    def command(self, path: str) -> list[str]:
        """The argv that runs this script when it lies at ``path``."""
        return [*self.interpreter, path]


@dataclass(frozen=True)
class PlatformBuild:
    """What a platform contributes to a BuildPlan."""

    environment: BuildEnvironment
    script: BuildScript
    artifacts: tuple[str, ...] = field(default=())
    # Paths of the source tree the build never reads: a container executor does not copy them in.
    source_unread: tuple[str, ...] = field(default=())
    toolchain: str | None = None  # a platform with several (windows: mingw, msvc) names the one it used


class Platform:
    """One build platform (linux, windows, macos). Subclasses set the class attributes and ``build``."""

    name: ClassVar[PlatformName]
    title: ClassVar[str] = ""  # the platform as messages name it (Linux, Windows, macOS)
    template_dir: ClassVar[str | None] = None  # folder under templates/ with its templates (None: none yet)
    # The backend of a build moved here with --platform and no --backend (None: the recipe's).
    preferred_backend: ClassVar[BackendName | None] = None
    # The machine architecture its builds are for, as CPU levels name it (x86_64, aarch64); None: the build
    # machine's own (a Linux build compiles for the machine it runs on).
    machine: ClassVar[str | None] = None
    # Whether ggml builds its CPU variants (cpu = variants) here; where it does not, a recipe's variants
    # builds the one CPU backend at the baseline level, and --cpu variants is refused.
    cpu_variants: ClassVar[bool] = True

    def check(self, recipe: BuildRecipe, backend: BackendName) -> None:
        """Raise InvalidOption, saying what to do instead, when this platform cannot build ``backend``: by
        default, when the backend does not list this platform."""
        if self.name not in get_backend(backend).platforms:
            raise InvalidOption(
                f"backend {backend!r} cannot be built for {self.title or self.name}",
                hint=self.backend_hint(backend),
            )

    def backend_hint(self, backend: BackendName) -> str:
        """What to do instead of building ``backend`` here."""
        return "use --backend cpu"

    def cmake(self, recipe: BuildRecipe, backend: BackendName, options: BuildOptions) -> dict[str, str]:
        """CMake settings this platform needs for ``backend``, over the recipe's (the backend's and the user's
        --cmake win)."""
        return {}

    def build(
        self,
        recipe: BuildRecipe,
        backend: BackendName,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """The environment, script and artifact names of a build of ``recipe`` with ``backend``."""
        raise NotImplementedError
