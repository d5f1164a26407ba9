"""Linux: a Debian/Ubuntu builder image from ``templates/linux/Dockerfile.<backend>.j2`` and a bash script
that runs unchanged in that image and on a Linux host; artifacts are ``bin/<target>``, and the shared libraries
and backend modules the script copies beside them (found once the build has run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamaforge.build.recipes import Backend, BuildRecipe, ImageRef
from llamaforge.build.recipes import Platform as PlatformName
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render_cached
from llamaforge.platforms import (
    BuildEnvironment,
    BuilderImage,
    BuildScript,
    HostTool,
    PlatformBuild,
    builder_tag,
    image_ca_bundle,
)

if TYPE_CHECKING:
    from llamaforge.build.plan import BuildOptions

TEMPLATES = "linux"  # templates/linux/
BACKENDS: tuple[Backend, ...] = ("cpu", "cuda")

# Installed into the builder image, and listed with their versions in each build's toolchain.json.
PACKAGES: dict[str, list[str]] = {
    "cpu": ["ca-certificates", "ccache", "cmake", "g++", "gcc", "libc6-dev", "make", "ninja-build"],
    "cuda": ["ca-certificates", "ccache", "cmake", "g++", "ninja-build"],
    "cuda-wheels": [
        "ca-certificates",
        "ccache",
        "cmake",
        "g++",
        "gcc",
        "libc6-dev",
        "make",
        "ninja-build",
        "python3-pip",
    ],
}

# Builder images that download over TLS while they are built: pip's CUDA wheels from PyPI, and the nvidia/cuda
# image's apt repository (https). The Debian base's apt repository is plain http, signed by its keys.
TLS_DOWNLOADS = frozenset({"cuda", "cuda-wheels"})

# Top-level parts of a llama.cpp tree that a build with tests and examples off never reads (models/ alone holds
# about 75 MB of tokenizer GGUFs for the tests): left out of the copy into the builder container.
SOURCE_UNREAD = ("models", "docs", "media")

_TOOL_HINT = "install cmake, ninja-build and a C/C++ compiler, or use --executor docker"
HOST_TOOLS: tuple[HostTool, ...] = (
    HostTool("cmake", _TOOL_HINT),
    HostTool("ninja", _TOOL_HINT),
    HostTool("cc", _TOOL_HINT),
    HostTool("c++", _TOOL_HINT),
    HostTool("ccache", optional=True),
)
CUDA_HOST_TOOLS: tuple[HostTool, ...] = (
    HostTool("nvcc", "install a CUDA toolkit, or use --executor docker"),
)


def toolkit_kind(recipe: BuildRecipe, options: BuildOptions) -> str:
    """Where a CUDA build's toolkit comes from: ``wheels`` or ``image`` (``--cuda-toolkit`` over the recipe)."""
    return options.cuda_toolkit or recipe.cuda.toolkit


def _flavour(recipe: BuildRecipe, backend: Backend, options: BuildOptions) -> str:
    """The builder template: cpu, cuda (the nvidia/cuda image) or cuda-wheels (the local base + PyPI wheels)."""
    if backend == "cuda" and toolkit_kind(recipe, options) == "wheels":
        return "cuda-wheels"
    return backend


def base_image(recipe: BuildRecipe, backend: Backend, options: BuildOptions) -> ImageRef:
    """The base image of a builder: ``--base-image``, else the recipe's ``[images.<backend>]``."""
    if options.base_image:
        return ImageRef(tag=options.base_image)
    # The wheel toolkit goes onto the CPU base image (the local Debian one by default).
    images = "cpu" if _flavour(recipe, backend, options) == "cuda-wheels" else backend
    if images in recipe.images:
        return recipe.images[images]
    raise InvalidOption(
        f"recipe {recipe.name!r} names no base image for backend {backend!r}",
        hint=f"add [images.{images}] to the recipe or pass --base-image",
    )


def pinned(base: ImageRef) -> str:
    """The FROM reference of ``base``: by digest when the recipe pins one."""
    return base.tag if base.digest is None else f"{base.tag.split(':')[0]}@{base.digest}"


class LinuxPlatform:
    """Linux builds (CPU and CUDA) in a Docker builder image or on a Linux host."""

    name: PlatformName = "linux"
    template_dir: str | None = TEMPLATES
    preferred_backend: Backend | None = None

    def check(self, recipe: BuildRecipe, backend: Backend) -> None:
        """Linux has builder templates for the cpu and cuda backends."""
        if backend not in BACKENDS:
            raise InvalidOption(
                f"backend {backend!r} has no Linux builder template yet",
                hint="use --backend cpu or --arch 86",
            )

    def cmake(self, recipe: BuildRecipe, backend: Backend, options: BuildOptions) -> dict[str, str]:
        """Nothing beyond the recipe: its settings are written for Linux."""
        return {}

    def build(
        self,
        recipe: BuildRecipe,
        backend: Backend,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Render the builder Dockerfile and the bash build script."""
        base = base_image(recipe, backend, options)
        flavour = _flavour(recipe, backend, options)
        ca_bundle, ca_origin = image_ca_bundle(options, downloads_over_tls=flavour in TLS_DOWNLOADS)
        dockerfile = render_cached(
            f"{TEMPLATES}/Dockerfile.{flavour}.j2",
            base_image=pinned(base),
            packages=PACKAGES[flavour],
            ca_bundle=ca_bundle is not None,
            release=recipe.cuda.release,
            cuobjdump=recipe.cuda.cuobjdump,
            major=recipe.cuda.major,
        )
        script = render_cached(
            f"{TEMPLATES}/build.sh.j2",
            recipe_name=recipe.name,
            backend=backend,
            cmake_args=cmake_args,
            targets=recipe.targets,
            source_date_epoch=source_date_epoch,
            packages=PACKAGES[flavour],
        )
        image = BuilderImage(
            tag=builder_tag(flavour, dockerfile, base, ca_bundle),
            base=base,
            dockerfile=dockerfile,
            ca_bundle=ca_bundle,
            ca_bundle_origin=ca_origin,
        )
        tools = HOST_TOOLS + (CUDA_HOST_TOOLS if backend == "cuda" else ())
        return PlatformBuild(
            environment=BuildEnvironment(image=image, host_tools=tools),
            script=BuildScript(name="build.sh", text=script, interpreter=("bash",)),
            artifacts=tuple(f"bin/{target}" for target in recipe.targets),
            source_unread=SOURCE_UNREAD,
        )
