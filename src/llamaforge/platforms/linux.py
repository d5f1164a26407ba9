"""Linux: a Debian/Ubuntu builder image from ``templates/linux/Dockerfile.<backend>.j2`` and a bash script
that runs unchanged in that image and on a Linux host; artifacts are ``bin/<target>``, the shared libraries
and backend modules the script copies beside them, and in ``lib/`` the compiler's runtime libraries the binaries
need (found once the build has run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from llamaforge.backends import LinuxBuilder, get_backend
from llamaforge.build.names import BackendName, PlatformName
from llamaforge.build.recipes import BuildRecipe, ImageRef
from llamaforge.core.errors import InvalidOption
from llamaforge.core.templates import render_cached
from llamaforge.platforms.base import (
    BuildEnvironment,
    BuilderImage,
    BuildScript,
    HostTool,
    Platform,
    PlatformBuild,
    builder_tag,
    image_ca_bundle,
)

if TYPE_CHECKING:
    from llamaforge.build.options import BuildOptions

TEMPLATES = "linux"  # templates/linux/

# Top-level parts of a llama.cpp tree that a build with tests and examples off never reads (models/ alone holds
# about 75 MB of tokenizer GGUFs for the tests): left out of the copy into the builder container.
SOURCE_UNREAD = ("models", "docs", "media")

#: The compiler's runtime libraries (GCC's) that a build copies into its ``lib/`` from the system it was made on,
#: when its binaries need them: each must be the version the build was compiled against.
COMPILER_RUNTIME = ("libstdc++.so.6", "libgcc_s.so.1", "libgomp.so.1", "libatomic.so.1")

_TOOL_HINT = "install cmake, ninja-build and a C/C++ compiler, or use --executor docker"
HOST_TOOLS: tuple[HostTool, ...] = (
    HostTool("cmake", _TOOL_HINT),
    HostTool("ninja", _TOOL_HINT),
    HostTool("cc", _TOOL_HINT),
    HostTool("c++", _TOOL_HINT),
    HostTool("ccache", optional=True),
)


def base_image(recipe: BuildRecipe, builder: LinuxBuilder, options: BuildOptions) -> ImageRef:
    """The base image of a builder: ``--base-image``, else the recipe's ``[images.<X>]`` (X the builder's),
    else the builder's default."""
    if options.base_image:
        return ImageRef(tag=options.base_image)
    images = builder.images or builder.flavour
    if images in recipe.images:
        return recipe.images[images]
    if builder.default_base:
        return ImageRef(tag=builder.default_base)
    raise InvalidOption(
        f"recipe {recipe.name!r} names no base image for {images!r} builds",
        hint=f"add [images.{images}] to the recipe or pass --base-image",
    )


def pinned(base: ImageRef) -> str:
    """The FROM reference of ``base``: by digest when the recipe pins one."""
    return base.tag if base.digest is None else f"{base.tag.split(':')[0]}@{base.digest}"


class LinuxPlatform(Platform):
    """Linux builds in a Docker builder image (the backend's) or on a Linux host."""

    name: ClassVar[PlatformName] = "linux"
    title: ClassVar[str] = "Linux"
    template_dir: ClassVar[str | None] = TEMPLATES

    def backend_hint(self, backend: BackendName) -> str:
        """Linux builds the backends whose builder it has."""
        return "use --backend cpu, --backend vulkan or --arch 86 (CUDA)"

    def build(
        self,
        recipe: BuildRecipe,
        backend: BackendName,
        options: BuildOptions,
        cmake_args: tuple[str, ...],
        source_date_epoch: int,
    ) -> PlatformBuild:
        """Render the backend's builder Dockerfile and the bash build script."""
        chosen = get_backend(backend)
        builder = chosen.linux_builder(recipe, options)
        base = base_image(recipe, builder, options)
        ca_bundle, ca_origin = image_ca_bundle(options, downloads_over_tls=builder.downloads_over_tls)
        dockerfile = render_cached(
            f"{TEMPLATES}/{builder.dockerfile}",
            base_image=pinned(base),
            packages=builder.packages,
            ca_bundle=ca_bundle is not None,
            **builder.variables,
        )
        script = render_cached(
            f"{TEMPLATES}/build.sh.j2",
            recipe_name=recipe.name,
            cmake_args=cmake_args,
            targets=recipe.targets,
            source_date_epoch=source_date_epoch,
            packages=builder.packages,
            script_steps=chosen.script_steps(),
            tool_versions=chosen.tool_versions,
            runtime_libraries=COMPILER_RUNTIME,
        )
        image = BuilderImage(
            tag=builder_tag(builder.flavour, dockerfile, base, ca_bundle),
            base=base,
            dockerfile=dockerfile,
            ca_bundle=ca_bundle,
            ca_bundle_origin=ca_origin,
        )
        tools = HOST_TOOLS + tuple(HostTool(name, hint) for name, hint in chosen.host_tools)
        return PlatformBuild(
            environment=BuildEnvironment(image=image, host_tools=tools),
            script=BuildScript(name="build.sh", text=script, interpreter=("bash",)),
            artifacts=tuple(f"bin/{target}" for target in recipe.targets),
            source_unread=SOURCE_UNREAD,
        )
