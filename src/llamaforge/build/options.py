"""What a user may change on top of a recipe (the CLI flags): read by the planner, its platforms and backends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.recipes import CudaToolkitKind, WindowsToolchain


@dataclass(frozen=True)
class BuildOptions:
    """What a user may change on top of a recipe (the CLI flags)."""

    backend: BackendName | None = None
    # --arch: the backend's arch list (CUDA compute capabilities); the name is the manifests' and the CLI's.
    cuda_architectures: tuple[str, ...] = ()
    base_image: str | None = None
    patches: str | None = None
    no_patches: bool = False
    ca_bundle: Path | None = None
    # The host setting that named ca_bundle (PIP_CERT …; None: given with --ca-bundle). A bundle from the host
    # goes only into builder images that download over TLS; a given one into every builder image.
    ca_bundle_from_host: str | None = None
    cmake: tuple[tuple[str, str], ...] = ()
    cpu: str | None = None  # a CPU level (llamaforge.build.cpu_level) instead of the recipe's
    platform: PlatformName | None = None  # overrides the recipe's platform
    cuda_toolkit: CudaToolkitKind | None = None  # overrides the recipe's [cuda] toolkit
    toolchain: WindowsToolchain | None = None  # windows: mingw (Docker; the default) or msvc (a host)
