"""Build in Docker: a builder image from the rendered Dockerfile, a fresh container per build,
a persistent ccache volume, source copied in, artifacts copied out; the container is always removed."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import BuildFailed, ImageError
from llamaforge.core.events import Event, Reporter
from llamaforge.runners import RunRequest
from llamaforge.runners.container import Container
from llamaforge.runners.engine import docker_client

DEFAULT_CCACHE_VOLUME = "llamaforge-ccache"


def ccache_volume() -> str:
    """Name of the Docker volume that keeps ccache between builds (``LLAMAFORGE_CCACHE_VOLUME``)."""
    return os.environ.get("LLAMAFORGE_CCACHE_VOLUME", DEFAULT_CCACHE_VOLUME)


class DockerExecutor:
    """Executor that builds inside containers of the plan's builder image."""

    name = "docker"

    def __init__(self) -> None:
        self._client = docker_client()

    def environment_id(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Id of the builder image, built from the plan's Dockerfile when the tag does not exist yet."""
        import docker.errors

        try:
            return str(self._client.images.get(plan.builder_tag).id)
        except docker.errors.ImageNotFound:
            pass
        try:
            self._client.images.get(plan.base_image.tag)
        except docker.errors.ImageNotFound:
            hint = (
                "run `invoke images.bootstrap` to make it locally (debootstrap, no registry)"
                if plan.base_image.tag.startswith("llamaforge/")
                else f"`docker pull {plan.base_image.tag}` where a registry is reachable, or pass --base-image"
            )
            raise ImageError(f"base image {plan.base_image.tag} is not available", hint=hint) from None
        reporter(Event("stage", f"building builder image {plan.builder_tag}", stage="image"))
        with tempfile.TemporaryDirectory(prefix="llamaforge-context-") as context:
            (Path(context) / "Dockerfile").write_text(plan.dockerfile, encoding="utf-8")
            if plan.ca_bundle:
                shutil.copyfile(plan.ca_bundle, Path(context) / "ca-bundle.crt")
            tail: list[str] = []
            try:
                for chunk in self._client.api.build(
                    path=context, tag=plan.builder_tag, rm=True, forcerm=True, decode=True, pull=False
                ):
                    if "error" in chunk:
                        raise ImageError(
                            f"building {plan.builder_tag} failed: {chunk['error'].strip()}",
                            hint="last lines:\n" + "\n".join(tail[-15:]),
                        )
                    text = str(chunk.get("stream", "")).rstrip()
                    if text:
                        tail.append(text)
                        reporter(Event("log", text, stage="image"))
            except docker.errors.APIError as error:
                raise ImageError(f"building {plan.builder_tag} failed: {error}") from None
        return str(self._client.images.get(plan.builder_tag).id)

    def run(self, request: RunRequest) -> None:
        """Run the build script in a fresh container and copy ``/out`` back to ``request.out_dir``."""
        plan = request.plan
        environment = {"LLAMAFORGE_JOBS": str(request.jobs)} if request.jobs else {}
        if not request.use_ccache:
            environment["CCACHE_DISABLE"] = "1"
        volumes = {ccache_volume(): {"bind": "/ccache", "mode": "rw"}} if request.use_ccache else {}
        with Container(self._client, plan.builder_tag, volumes=volumes, environment=environment) as box:
            remove = request.cancel.on_cancel(box.remove)
            try:
                with tempfile.TemporaryDirectory(prefix="llamaforge-script-") as scratch:
                    script = Path(scratch) / "build.sh"
                    script.write_text(plan.build_script, encoding="utf-8")
                    box.copy_into(script, "/llamaforge")
                request.log.reporter(Event("stage", "copying source into the container", stage="build"))
                box.copy_into(request.source_tree, "/")
                if request.source_tree.name != "src":
                    box.call(["mv", f"/{request.source_tree.name}", "/src"])
                command = ["bash", "/llamaforge/build.sh"]
                code = box.call(command, on_line=request.log)
                request.cancel.raise_if_cancelled()
                if code != 0:
                    raise BuildFailed(
                        f"the build failed in container (exit code {code})",
                        command=command,
                        returncode=code,
                        tail=list(request.log.tail),
                        log_path=str(request.log.path),
                        hint="read the full log; a compiler error usually points at a patch or a cmake option",
                    )
                box.copy_out("/out", request.out_dir)
            except Exception:
                request.cancel.raise_if_cancelled()
                raise
            finally:
                remove()
