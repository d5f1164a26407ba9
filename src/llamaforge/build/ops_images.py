"""Operations ``images.*``: ``images.bootstrap``, a Debian base image made with debootstrap (see
:mod:`llamaforge.build.images`), and ``images.runtime``, a build's runtime image on the local Docker engine (see
:mod:`llamaforge.build.runtime_image`)."""

from __future__ import annotations

from pydantic import Field

from llamaforge.core.registry import OperationContext, Params, Result, operation
from llamaforge.core.validation import ImageReference


class BootstrapParams(Params):
    """Parameters of ``images.bootstrap``."""

    tag: str = Field("llamaforge/debian:bookworm", description="Tag of the image to create")
    suite: str = Field("bookworm", description="Debian suite")
    mirror: str | None = Field(None, description="Debian mirror (default: the one this machine's apt uses)")
    force: bool = Field(False, description="Recreate the image even if it exists")


class BootstrapResult(Result):
    """The imported base image (or the existing one, reused)."""

    tag: str
    image_id: str
    mirror: str
    suite: str
    reused: bool


@operation("images.bootstrap", BootstrapParams, read_only=False, long_running=True)
def images_bootstrap_op(params: BootstrapParams, ctx: OperationContext) -> BootstrapResult:
    """Make a local Debian base image with debootstrap + docker import (no registry needed)."""
    from llamaforge.build.images import bootstrap_image

    result = bootstrap_image(
        params.tag,
        suite=params.suite,
        mirror=params.mirror,
        force=params.force,
        reporter=ctx.reporter,
        cancel=ctx.cancel,
    )
    return BootstrapResult.model_validate(result.__dict__)


class RuntimeImageParams(Params):
    """Parameters of ``images.runtime``."""

    build: str = Field(
        description="Build key (or unique prefix) from the build store; the image is llamaforge/llama-server:KEY. "
        "Run it with the model read-only at /models/model.gguf and the port on loopback: docker run "
        "-p 127.0.0.1:8080:8080 -v $PWD/m.gguf:/models/model.gguf:ro IMAGE [llama-server flags]"
    )
    base: ImageReference | None = Field(
        None,
        description="Base image on the local engine (default: the one the build was made on); a RUN ldd "
        "step checks every library resolves on it",
    )
    force: bool = Field(
        False,
        description="Build again even when the engine has the image from the same plan (a cache hit otherwise)",
    )


class RuntimeImageResult(Result):
    """The runtime image: its tag and id, whether it was reused, what went into it, and its labels."""

    tag: str = Field(description="llamaforge/llama-server:<build key>")
    image_id: str = Field(description="The image id the engine reports")
    reused: bool = Field(description="The engine already had the image from the same plan (a cache hit)")
    base: str
    packages: list[str] = Field(description="Debian packages installed for the binaries' libraries")
    files: list[str] = Field(description="Files under /opt/llamaforge: the build's bin/ and lib/")
    copied_libraries: list[str] = Field(description="Libraries no package provides, copied into lib/")
    labels: dict[str, str] = Field(description="The image's labels, read back from the engine")


@operation("images.runtime", RuntimeImageParams, read_only=False, long_running=True)
def images_runtime_op(params: RuntimeImageParams, ctx: OperationContext) -> RuntimeImageResult:
    """Make a build's runtime image on the local engine (no registry): bin/ + lib/, non-root, HEALTHCHECK, labels.

    The image is the base image (no registry) plus the Debian packages the build's binaries need beyond its
    own lib/ (found with ldd, e.g. libvulkan1) and curl, every file of the build's bin/ and lib/ (where the
    compiler's runtime libraries travel) under /opt/llamaforge, a non-root
    user (uid 10001), a HEALTHCHECK on /health and OCI + llamaforge labels (build key, manifest sha256, recipe,
    llama.cpp commit and build number). Its tag is llamaforge/llama-server:<build key>; an image already made
    from the same plan is reused. Run it with the model mounted read-only at /models/model.gguf:
    ``docker run -p 127.0.0.1:8080:8080 -v $PWD/m.gguf:/models/model.gguf:ro TAG`` (LLAMA_ARG_PORT moves the
    port; other llama-server flags go after the tag).
    """
    from llamaforge.build.runtime_image import ensure_runtime_image

    made = ensure_runtime_image(params.build, base=params.base, force=params.force, reporter=ctx.reporter)
    return RuntimeImageResult(
        tag=made.tag,
        image_id=made.image_id,
        reused=made.reused,
        base=made.plan.base,
        packages=list(made.plan.packages),
        files=[name for _, name in made.plan.files],
        copied_libraries=list(made.plan.copied_libraries),
        labels=made.labels,
    )
