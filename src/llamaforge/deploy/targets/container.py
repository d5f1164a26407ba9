"""The docker target: llama-server from the build's runtime image (``invoke images.runtime``) in a container on
each host's OWN Docker engine, driven over SSH as root (``docker`` for the root user, ``sudo -n docker`` for
any other: :func:`~llamaforge.deploy.hosts.access.as_root`).

A release holds no binaries here: its service file is ``llama-server.docker.sh``, rendered from
``templates/deploy/llama-server.docker.sh.j2``, which (re)creates the container ``llamaforge-<name>`` from the
release ``current`` points at (run after the switch in the same host command, as the systemd unit's restart
is). The container runs the image by its id, as the host's service user (its uid), with ``--network host`` (so
llama-server binds the host's 127.0.0.1 unless ``--listen`` says otherwise, and the gate reaches it through
the SSH forward as for systemd), a read-only root, every capability dropped, ``no-new-privileges``, the
release and the model mounted read-only, the restart policy ``unless-stopped``, a health check on ``/health``
with the image's curl, and ``--gpus all`` for a CUDA build. An API key is the release's ``api-key`` file, read
by llama-server with ``--api-key-file``: never in argv, environment or labels.

The image is made here (:func:`~llamaforge.build.runtime_image.ensure_runtime_image`), saved once per image
id to ``$LLAMAFORGE_HOME/images/<id>.tar``, sent with the resumable, sha256-verified transfer and ``docker
load``-ed on the host, unless the host's engine already has that image id: a second deploy with other flags
sends no image bytes (and, as for every target, no model bytes). Only the archives used last stay here; on a
host, pruning releases removes each image no release left there runs (:meth:`DockerTarget.prune`).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llamaforge.backends import Devices, backend_devices
from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.exits import exit_signal
from llamaforge.core.templates import render
from llamaforge.deploy.hosts.access import as_root
from llamaforge.deploy.release import API_KEY_FILE, MODEL_LINK, SERVICE_USER, Layout, ReleaseSpec
from llamaforge.deploy.targets.base import ServiceState, Target
from llamaforge.deploy.targets.systemd import SystemdTarget
from llamaforge.serve.launcher import server_argv

if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping, Sequence

    from llamaforge.runners.ssh import SshProcessRunner

CONTAINER_FILE = "llama-server.docker.sh"
RELEASE_MOUNT = "/release"  # the release inside the container (its api-key)
HEALTH_INTERVAL_S = 5
HEALTH_TIMEOUT_S = 5
HEALTH_RETRIES = 3
KEEP_ARCHIVES = 2  # image archives kept in $LLAMAFORGE_HOME/images, the ones used last


class DockerMissing(LlamaforgeError):
    """A host has no Docker engine the deploy user can drive as root."""

    exit_code = ExitCode.DOCKER_MISSING


@dataclass(frozen=True)
class ContainerImage:
    """The runtime image a release runs: its id (what the container is made from), its tag, whether it needs GPUs."""

    id: str
    tag: str
    gpus: bool = False
    devices: tuple[str, ...] = ()  # host device nodes passed in (/dev/dri for a Vulkan build)


def container_name(layout: Layout) -> str:
    """The container's name on the host."""
    return f"llamaforge-{layout.name}"


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def container_args(spec: ReleaseSpec) -> list[str]:
    """llama-server's arguments in the container (after the image's entrypoint): the mounted model, ``listen``,
    the port, the flags, and beyond loopback ``--api-key-file`` of the mounted release."""
    from llamaforge.build.runtime_image import MODEL_PATH

    binary = Path("llama-server")  # the image's entrypoint
    argv = server_argv(binary, Path(MODEL_PATH), spec.flags, port=spec.port, host=spec.listen)[1:]
    return [*argv, "--api-key-file", posixpath.join(RELEASE_MOUNT, API_KEY_FILE)] if spec.api_key else argv


def render_container(
    spec: ReleaseSpec, layout: Layout, image: ContainerImage, *, user: str = SERVICE_USER
) -> str:
    """The script that (re)creates the container of ``spec`` (no release id in it: the id is a digest of it)."""
    from llamaforge.build.runtime_image import MODEL_PATH
    from llamaforge.deploy.hosts.health import gate_address
    from llamaforge.deploy.release import gate_timeout_s

    if any(char in layout.root for char in ',"'):  # the --mount value is comma-separated
        raise InvalidOption(
            f"--root {layout.base!r}: a comma or a quote cannot be in a docker --mount path",
            hint='use a root directory without , or "',
        )
    url = f"http://{_url_host(gate_address(spec.listen))}:{spec.port}/health"
    health = {
        "interval": f"{HEALTH_INTERVAL_S}s",
        "timeout": f"{HEALTH_TIMEOUT_S}s",
        "retries": HEALTH_RETRIES,
        "start_period": f"{int(gate_timeout_s(spec.model_size))}s",
    }
    return render(
        "deploy/llama-server.docker.sh.j2",
        name=layout.name,
        container=container_name(layout),
        image=image.id,
        tag=image.tag,
        current=layout.current,
        model_link=MODEL_LINK,
        user=user,
        listen=spec.listen,
        release_mount=RELEASE_MOUNT,
        model_mount=MODEL_PATH,
        health_cmd=f"curl -fsS {url} >/dev/null || exit 1",
        health=health,
        gpus=image.gpus,
        devices=image.devices,
        args=container_args(spec),
    )


def state_from_inspect(text: str) -> ServiceState:
    """A :class:`ServiceState` from ``docker inspect`` of the container (``status restarts health exit``; empty:
    no container): running and healthy (or without a check) is active, a health check still starting or a
    container being (re)started is activating, unhealthy or a non-zero exit is failed."""
    parts = text.split()
    if len(parts) != 4:
        return ServiceState("inactive", 0)
    status, restarts, health, exit_code = parts
    count = int(restarts) if restarts.isdigit() else 0
    if status == "running":
        active = {"starting": "activating", "unhealthy": "failed"}.get(health, "active")
    elif status in ("created", "restarting"):
        active = "activating"
    elif status in ("exited", "dead"):
        active = "failed" if exit_code != "0" or status == "dead" else "inactive"
    else:  # paused, removing
        active = "inactive"
    # Docker says 128 + N for a container whose llama-server a signal ended (it is the container's process).
    killed_by = exit_signal(int(exit_code), shell=True) if exit_code.isdigit() else None  # noqa: S604 - nothing runs
    return ServiceState(active, count, killed_by)


# The image id a container script runs (on its `docker run` line; older scripts also named it in a comment).
_IMAGE_ID = re.compile(r"\b(sha256:[0-9a-f]{64})\b")
_UNUSED_IMAGES = r"""
base=$1; shift
for id; do
  grep -qsF -- "$id" "$base"/*/releases/*/llama-server.docker.sh "$base"/*/releases/.*.tmp/llama-server.docker.sh \
    && continue
  docker image rm -- "$id" >/dev/null 2>&1 && echo "$id"
done
exit 0
"""

# A probe: the service's container options (user, read-only root, no capabilities, no new privileges) with the
# image's llama-bench as the entrypoint, the probe model mounted read-only, no network, removed when it ends.
_PROBE = r"""
user="$(id -u "$1"):$(id -g "$1")" && model=$2 && shift 2
exec docker run --rm --network none --user "$user" --read-only --cap-drop ALL --security-opt no-new-privileges \
  --mount "type=bind,source=$model,target=/models/probe.gguf,readonly" "$@"
"""
PROBE_MOUNT = "/models/probe.gguf"

_INSPECT = (
    "{{.State.Status}} {{.RestartCount}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} "
    "{{.State.ExitCode}}"
)


def saved_image(image: ContainerImage) -> Path:
    """The image's ``docker save`` archive here, made once per image id (``$LLAMAFORGE_HOME/images``); only the
    :data:`KEEP_ARCHIVES` archives used last stay (an archive is a few hundred MB, and it is made again in
    seconds)."""
    from llamaforge.core.paths import home
    from llamaforge.runners.image_archive import saved_image as saved

    return saved(image.id, home() / "images", keep=KEEP_ARCHIVES)


@dataclass(frozen=True)
class DockerTarget(Target):
    """llama-server in a container on the host's Docker engine (see the module docstring). Made without an image
    it can stop, inspect and restart what a release on the host describes; :meth:`for_spec` binds the runtime
    image a new release runs."""

    image: ContainerImage | None = None
    reporter: Reporter = field(default=null_reporter, compare=False, repr=False)
    name = "docker"
    summary = "a container from the build's runtime image on each host's own Docker engine"

    def for_spec(self, spec: ReleaseSpec, reporter: Reporter = null_reporter) -> DockerTarget:
        """This target with the runtime image of ``spec``'s build (made on the local engine when missing)."""
        from llamaforge.build.runtime_image import ensure_runtime_image

        made = ensure_runtime_image(spec.build_key, reporter=reporter)
        devices = backend_devices(made.labels.get("org.llamaforge.build.backend"))
        return DockerTarget(
            ContainerImage(made.image_id, made.tag, devices.gpus > 0, devices.paths), reporter
        )

    def _image(self) -> ContainerImage:
        if self.image is None:
            raise ValueError("a release of the docker target needs its image (DockerTarget.for_spec)")
        return self.image

    def files(self, spec: ReleaseSpec) -> list[tuple[Path, str]]:
        """None: the binaries are in the image."""
        return []

    def listens(self, spec: ReleaseSpec) -> tuple[str, int] | None:
        """llama-server's ``--host`` and ``--port`` on the host's network (``--network host``)."""
        return spec.listen, spec.port

    def service_files(self, spec: ReleaseSpec, layout: Layout) -> dict[str, str]:
        """The container script, as ``llama-server.docker.sh`` inside the release."""
        return {CONTAINER_FILE: render_container(spec, layout, self._image())}

    def check(self, runner: SshProcessRunner) -> None:
        """Refuse (DockerMissing, naming the host and what to do) a host whose Docker engine the deploy user
        cannot drive as root."""
        result = runner.run(
            as_root(runner, ["docker", "version", "--format", "{{.Server.Version}}"]),
            warn=True,
            merge_stderr=True,
        )
        if result.ok and result.stdout.strip():
            return
        said = (result.stdout.strip().splitlines() or ["no answer"])[-1]
        if "password" in said:
            hint = f"let {runner.host.user or 'the deploy user'} run docker with sudo without a password (sudoers)"
        elif "not found" in said:
            hint = "install Docker there (Debian: apt-get install docker.io) or deploy with --target systemd"
        else:
            hint = "start its Docker engine (systemctl start docker) and deploy again"
        raise DockerMissing(
            f"{runner.host.address}: --target docker needs a Docker engine there: {said}",
            hint=f"{hint}; nothing was sent or switched there",
        )

    def prepare(self, runner: SshProcessRunner, layout: Layout) -> None:
        """The service user (its uid runs the container) and the deployment's directories, as for systemd."""
        SystemdTarget().prepare(runner, layout)

    def prune(self, runner: SshProcessRunner, layout: Layout, removed: Sequence[str]) -> None:
        """Remove the releases, then each image they ran that no release of any deployment under the same base
        directory still runs (``docker image rm``, never forced: an image a container still uses stays)."""
        scripts = [posixpath.join(layout.release(rid), CONTAINER_FILE) for rid in removed]
        shown = runner.run(["cat", "--", *scripts], warn=True).stdout
        images = sorted(set(_IMAGE_ID.findall(shown)))
        SystemdTarget().prune(runner, layout, removed)
        if not images:
            return
        unused = ["sh", "-c", _UNUSED_IMAGES, "sh", layout.base, *images]
        gone = runner.run(as_root(runner, unused), warn=True).stdout.split()
        if gone:
            what = ", ".join(image[:19] for image in gone)
            self.reporter(
                Event(
                    "stage",
                    f"{runner.host.address}: removed the image {what} (no release there runs it)",
                    stage="deploy",
                )
            )

    def deliver(self, runner: SshProcessRunner, layout: Layout, cancel: CancelToken | None = None) -> int:
        """Load the runtime image into the host's engine unless it has that image id; returns the bytes sent.
        The archive goes with the resumable transfer to ``<root>/images/`` and is removed once loaded."""
        from llamaforge.deploy.hosts.remote import check_free_space

        image = self._image()
        if self._on_host(runner, image):
            return 0
        self.reporter(Event("stage", f"{runner.host.address}: sending the image {image.tag}", stage="deploy"))
        archive = saved_image(image)
        remote = posixpath.join(layout.root, "images", archive.name)
        # room for the archive and for the image it loads
        check_free_space(runner, {layout.root: 2 * archive.stat().st_size})
        sent = runner.put(archive, remote, cancel=cancel).sent_bytes
        runner.run(
            as_root(runner, ["docker", "load", "--quiet", "--input", remote]),
            what=f"loading {image.tag} on {runner.host.host}",
        )
        runner.run(["rm", "-f", "--", remote])
        if not self._on_host(runner, image):
            raise DockerMissing(
                f"{runner.host.address}: the engine loaded {archive.name} but has no image {image.id}",
                hint="see `docker images` there; deploy again",
            )
        return sent

    def pending(self, runner: SshProcessRunner) -> str:
        """The runtime image, unless the host's engine has its id."""
        image = self._image()
        return "" if self._on_host(runner, image) else f"the image {image.tag} ({image.id[:19]})"

    @staticmethod
    def _on_host(runner: SshProcessRunner, image: ContainerImage) -> bool:
        inspect = as_root(runner, ["docker", "image", "inspect", "--format", "{{.Id}}", image.id])
        return runner.run(inspect, warn=True).stdout.strip() == image.id

    def activation(self, layout: Layout) -> list[str]:
        """Run ``current``'s container script (a command for root): the container is replaced."""
        return ["sh", posixpath.join(layout.current, CONTAINER_FILE)]

    def activate(self, runner: SshProcessRunner, layout: Layout) -> None:
        """Run :meth:`activation` on the host, as root."""
        runner.run(
            as_root(runner, self.activation(layout)),
            what=f"starting {container_name(layout)} on {runner.host.host}",
        )

    def stop(self, runner: SshProcessRunner, layout: Layout) -> None:
        """``docker stop`` the container (it stays, and ``unless-stopped`` keeps it stopped)."""
        runner.run(as_root(runner, ["docker", "stop", container_name(layout)]), warn=True)

    def state(self, runner: SshProcessRunner, layout: Layout) -> ServiceState:
        """The container's state, health and restart count (:func:`state_from_inspect`)."""
        shown = runner.run(
            as_root(
                runner,
                ["docker", "inspect", "--type", "container", "--format", _INSPECT, container_name(layout)],
            ),
            warn=True,
        )
        return state_from_inspect(shown.stdout if shown.ok else "")

    def logs(self, runner: SshProcessRunner, layout: Layout, lines: int = 20) -> list[str]:
        """The container's last log lines (llama-server logs to stderr)."""
        result = runner.run(
            as_root(runner, ["docker", "logs", "--tail", str(lines), container_name(layout)]),
            warn=True,
            merge_stderr=True,
        )
        return result.stdout.splitlines()

    def probe_command(
        self, layout: Layout, rid: str, service_files: Mapping[str, str], model: str, args: Sequence[str]
    ) -> list[str]:
        """``docker run --rm`` of the release's image with its llama-bench as the entrypoint, as the service
        user with the container's restrictions, the probe ``model`` mounted read-only (``args`` name it by its
        host path; inside it is :data:`PROBE_MOUNT`), and the GPUs for a CUDA build (a command for root)."""
        from llamaforge.build.runtime_image import PREFIX
        from llamaforge.deploy.hosts.probe import PROBE_BINARY

        image = self._image()
        inside = [PROBE_MOUNT if arg == model else arg for arg in args]
        gpus = Devices(gpus=int(image.gpus), paths=image.devices).docker_args()
        entrypoint = posixpath.join(PREFIX, "bin", PROBE_BINARY)
        return [
            "sh",
            "-c",
            _PROBE,
            "sh",
            SERVICE_USER,
            model,
            *gpus,
            "--entrypoint",
            entrypoint,
            image.id,
            *inside,
        ]

    def probe_signal(self, code: int, stderr: Sequence[str]) -> signal.Signals | None:
        """``docker run`` exits 128 + N when a signal ended the container's process."""
        return exit_signal(code, shell=True)  # noqa: S604 - nothing runs
