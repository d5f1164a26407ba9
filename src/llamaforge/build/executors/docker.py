"""Build in Docker: a builder image from the rendered Dockerfile, a fresh container per build,
a persistent ccache volume, source copied in, artifacts copied out; the container is always removed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from llamaforge.build.executors.base import Executor, RunRequest
from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import ImageError, InvalidOption
from llamaforge.core.events import Event, Reporter
from llamaforge.platforms import BuilderImage
from llamaforge.runners.container import Container
from llamaforge.runners.engine import EngineConfig, build_image, docker_client, image_id, image_repo_digest

DEFAULT_CCACHE_VOLUME = "llamaforge-ccache"


def ccache_volume() -> str:
    """Name of the Docker volume that keeps ccache between builds (``LLAMAFORGE_CCACHE_VOLUME``)."""
    return os.environ.get("LLAMAFORGE_CCACHE_VOLUME", DEFAULT_CCACHE_VOLUME)


def _builder_image(plan: BuildPlan) -> BuilderImage:
    image = plan.environment.image
    if image is None:
        raise InvalidOption(
            f"platform {plan.recipe.platform!r} has no builder image: it builds on a host, not in Docker",
            hint="build on a host of that platform: --executor ssh --build-host user@host:port (or --executor "
            "local on that host itself)",
        )
    return image


def _copy_ca_bundle(image: BuilderImage, context: Path, reporter: Reporter) -> None:
    """Put the image's CA bundle beside its Dockerfile, where its COPY finds it."""
    assert image.ca_bundle is not None
    reporter(
        Event(
            "info",
            f"CA bundle {image.ca_bundle} (from {image.ca_bundle_origin}) goes into the image",
            stage="image",
        )
    )
    try:
        shutil.copyfile(image.ca_bundle, context / "ca-bundle.crt")
    except OSError as error:
        raise ImageError(
            f"cannot copy the CA bundle {image.ca_bundle} into the builder image: {error.strerror or error}",
            hint="check the file (it was read when the build was planned), or pass --no-ca-bundle",
        ) from None


def _bootstrap_command(tag: str) -> str:
    """The ``images.bootstrap`` call that makes the llamaforge base image ``tag`` (its tag names the Debian suite:
    ``llamaforge/debian:trixie``)."""
    suite = tag.rpartition(":")[2]
    if tag == f"llamaforge/debian:{suite}" and suite != "bookworm":
        return f"invoke images.bootstrap --suite {suite} --tag {tag}"
    return "invoke images.bootstrap"


class DockerExecutor(Executor):
    """Executor that builds inside containers of the plan's builder image, on the engine ``engine`` names."""

    name = "docker"
    settings = EngineConfig.SETTINGS

    def __init__(self, engine: EngineConfig | None = None) -> None:
        self.engine = engine or EngineConfig()

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Self:
        """The executor on the engine the settings name: url (``DOCKER_HOST`` form: unix://, tcp://HOST:2376,
        ssh://USER@HOST), tls_verify, cert_path; none: the engine of this process's environment."""
        return cls(EngineConfig.from_settings(settings))

    @property
    def _client(self) -> Any:
        return docker_client(self.engine)

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        """Id of the builder image if its tag exists on the engine, else None (builds nothing)."""
        return image_id(_builder_image(plan).tag, self.engine)

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Id of the builder image, built from the plan's Dockerfile when the tag does not exist yet."""
        image = _builder_image(plan)
        existing = image_id(image.tag, self.engine)
        if existing is not None:
            return existing
        if image_id(image.base.tag, self.engine) is None:
            hint = (
                f"run `{_bootstrap_command(image.base.tag)}` to make it locally (debootstrap, no registry)"
                if image.base.tag.startswith("llamaforge/")
                else f"`docker pull {image.base.tag}` where a registry is reachable, or pass --base-image"
            )
            raise ImageError(f"base image {image.base.tag} is not available", hint=hint)
        reporter(Event("stage", f"building builder image {image.tag}", stage="image"))
        with tempfile.TemporaryDirectory(prefix="llamaforge-context-") as context:
            (Path(context) / "Dockerfile").write_text(image.dockerfile, encoding="utf-8")
            if image.ca_bundle:
                _copy_ca_bundle(image, Path(context), reporter)
            return build_image(
                Path(context),
                image.tag,
                on_line=lambda text: reporter(Event("log", text, stage="image")),
                config=self.engine,
            )

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        """Executor, base image (tag, id, digest) and builder image (tag, id) for the manifest."""
        image = _builder_image(plan)
        # An engine the builder image was sent to (a builder of a fleet) may lack the base's tag: the builder
        # image's id pins the base's layers all the same.
        base_id = image_id(image.base.tag, self.engine)
        return {
            "executor": self.name,
            "environment_id": environment_id,
            "base_tag": image.base.tag,
            "base_id": base_id,
            "base_digest": image.base.digest
            or (image_repo_digest(image.base.tag, self.engine) if base_id else None),
            "builder_tag": image.tag,
            "builder_id": environment_id,
        }

    def run(self, request: RunRequest) -> None:
        """Run the build script in a fresh container and copy ``/out`` back to ``request.out_dir``."""
        plan = request.plan
        image = _builder_image(plan)
        environment = request.script_environment()
        volumes = {ccache_volume(): {"bind": "/ccache", "mode": "rw"}} if request.use_ccache else {}
        with Container(self._client, image.tag, volumes=volumes, environment=environment) as box:
            remove = request.cancel.on_cancel(box.remove)
            try:
                with tempfile.TemporaryDirectory(prefix="llamaforge-script-") as scratch:
                    script = Path(scratch) / plan.script.name
                    script.write_text(plan.script.text, encoding="utf-8")
                    box.copy_into(script, "/llamaforge")
                request.log.reporter(Event("stage", "copying source into the container", stage="build"))
                box.copy_into(request.source_tree, "/", skip=plan.source_unread)
                if request.source_tree.name != "src":
                    box.call(["mv", f"/{request.source_tree.name}", "/src"])
                command = plan.script.command(f"/llamaforge/{plan.script.name}")
                code = box.call(command, on_line=request.log)
                request.cancel.raise_if_cancelled()
                if code != 0:
                    raise request.failed(
                        "in container",
                        command,
                        code,
                        "read the full log; a compiler error usually points at a patch or a cmake option",
                    )
                box.copy_out("/out", request.out_dir)
            except Exception:
                request.cancel.raise_if_cancelled()
                raise
            finally:
                remove()
