"""Build in Docker: a builder image from the rendered Dockerfile, a fresh container per build,
a persistent ccache volume (and, when one is configured, ccache's remote storage shared by builders), source
copied in, artifacts copied out; the container is always removed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from llamaforge.build.ccache import (
    CCACHE_RECORD,
    CONFIG_PATH,
    STATS_LOG,
    CacheStats,
    RemoteCache,
    probe_command,
    probe_verdict,
)
from llamaforge.build.executors.base import Executor, RunRequest
from llamaforge.build.plan import BuildPlan
from llamaforge.core.errors import ImageError, InvalidOption
from llamaforge.core.events import Event, Reporter
from llamaforge.core.paths import cache_lock, home
from llamaforge.platforms import BuilderImage
from llamaforge.runners.container import Container
from llamaforge.runners.engine import EngineConfig, build_image, docker_client, image_id, image_repo_digest
from llamaforge.runners.output import masker

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


_LOCAL_ENGINE = "unix:///var/run/docker.sock"


def _bootstrap_command(tag: str) -> str:
    """The ``images.bootstrap`` call that makes the llamaforge base image ``tag`` (its tag names the Debian suite:
    ``llamaforge/debian:trixie``)."""
    suite = tag.rpartition(":")[2]
    if tag == f"llamaforge/debian:{suite}" and suite != "bookworm":
        return f"invoke images.bootstrap --suite {suite} --tag {tag}"
    return "invoke images.bootstrap"


CCACHE_SETTINGS = ("ccache_remote", "ccache_password_file")


class DockerExecutor(Executor):
    """Executor that builds inside containers of the plan's builder image, on the engine ``engine`` names;
    with ``remote_cache``, ccache in the build container also reads and writes that shared storage."""

    name = "docker"
    settings = EngineConfig.SETTINGS + CCACHE_SETTINGS

    def __init__(self, engine: EngineConfig | None = None, remote_cache: RemoteCache | None = None) -> None:
        self.engine = engine or EngineConfig()
        self.remote_cache = remote_cache

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Self:
        """The executor on the engine the settings name: url (``DOCKER_HOST`` form: unix://, tcp://HOST:2376,
        ssh://USER@HOST), tls_verify, cert_path; none: the engine of this process's environment. ccache_remote
        (and ccache_password_file) name a remote compiler cache (:class:`RemoteCache`)."""
        engine = {key: value for key, value in settings.items() if key not in CCACHE_SETTINGS}
        remote = settings.get("ccache_remote")
        if settings.get("ccache_password_file") and not remote:
            raise InvalidOption(
                "--ccache-password-file is the password of a remote compiler cache",
                hint="add --ccache-remote redis://HOST:PORT, or drop --ccache-password-file",
            )
        cache = RemoteCache.parse(remote, settings.get("ccache_password_file")) if remote else None
        return cls(EngineConfig.from_settings(engine), cache)

    @property
    def _client(self) -> Any:
        return docker_client(self.engine)

    def peek_environment_id(self, plan: BuildPlan) -> str | None:
        """Id of the builder image if its tag exists on the engine, else None (builds nothing)."""
        return image_id(_builder_image(plan).tag, self.engine)

    def prepare_environment(self, plan: BuildPlan, reporter: Reporter) -> str:
        """Id of the builder image, built from the plan's Dockerfile when the tag does not exist yet.

        The image is built under a lock of its tag and engine: two builds started at once on a fresh machine
        would otherwise build it twice, get two image ids, so two cache keys, and compile the same tree twice."""
        image = _builder_image(plan)
        existing = image_id(image.tag, self.engine)
        if existing is not None:
            return existing
        place = hashlib.sha256(f"{self.location()}\n{image.tag}".encode()).hexdigest()[:16]
        lock = cache_lock(home() / "locks" / f"image-{place}.lock")
        if lock.is_locked:
            reporter(
                Event("info", f"builder image {image.tag} is being built elsewhere; waiting", stage="image")
            )
        with lock:
            existing = image_id(image.tag, self.engine)
            return existing if existing is not None else self._build_builder_image(image, reporter)

    def _build_builder_image(self, image: BuilderImage, reporter: Reporter) -> str:
        """Build the builder image (its base must be there) and return its id."""
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

    def location(self) -> str:
        """The engine's URL (``DOCKER_HOST`` form)."""
        return self.engine.environment().get("DOCKER_HOST", _LOCAL_ENGINE)

    def describe_environment(self, plan: BuildPlan, environment_id: str) -> dict[str, Any]:
        """Executor, engine, base image (tag, id, digest) and builder image (tag, id) for the manifest."""
        image = _builder_image(plan)
        # An engine the builder image was sent to (a builder of a fleet) may lack the base's tag: the builder
        # image's id pins the base's layers all the same.
        base_id = image_id(image.base.tag, self.engine)
        return {
            "executor": self.name,
            "engine": self.location(),
            "environment_id": environment_id,
            "base_tag": image.base.tag,
            "base_id": base_id,
            "base_digest": image.base.digest
            or (image_repo_digest(image.base.tag, self.engine) if base_id else None),
            "builder_tag": image.tag,
            "builder_id": environment_id,
        }

    def run(self, request: RunRequest) -> None:
        """Run the build script in a fresh container and copy ``/out`` back to ``request.out_dir``; with ccache
        on, its stats go beside the artifacts (``ccache.json``)."""
        plan = request.plan
        image = _builder_image(plan)
        environment = request.script_environment()
        if request.use_ccache:
            environment["CCACHE_STATSLOG"] = STATS_LOG
        remote = self.remote_cache if request.use_ccache else None
        volumes = {ccache_volume(): {"bind": "/ccache", "mode": "rw"}} if request.use_ccache else {}
        # The remote storage is reached the way the engine's host reaches it; otherwise no network at all.
        network = "host" if remote else "none"
        on_line = request.log if remote is None else _masked(request.log, remote.secrets())
        with Container(
            self._client, image.tag, volumes=volumes, environment=environment, network=network
        ) as box:
            remove = request.cancel.on_cancel(box.remove)
            try:
                if remote is not None:
                    _connect_remote_cache(box, remote, request)
                with tempfile.TemporaryDirectory(prefix="llamaforge-script-") as scratch:
                    script = Path(scratch) / plan.script.name
                    script.write_text(plan.script.text, encoding="utf-8")
                    box.copy_into(script, "/llamaforge")
                request.log.reporter(Event("stage", "copying source into the container", stage="build"))
                box.copy_into(request.source_tree, "/", skip=plan.source_unread)
                if request.source_tree.name != "src":
                    box.call(["mv", f"/{request.source_tree.name}", "/src"])
                command = plan.script.command(f"/llamaforge/{plan.script.name}")
                code = box.call(command, on_line=on_line)
                request.cancel.raise_if_cancelled()
                if code != 0:
                    raise request.failed(
                        "in container",
                        command,
                        code,
                        "read the full log; a compiler error usually points at a patch or a cmake option",
                    )
                box.copy_out("/out", request.out_dir)
                if request.use_ccache:
                    _record_cache_stats(box, remote, request)
            except Exception:
                request.cancel.raise_if_cancelled()
                raise
            finally:
                remove()


def _masked(sink: Callable[[str], None], secrets: list[str]) -> Callable[[str], None]:
    """``sink`` behind a mask of ``secrets`` (nothing should print them; a tool's error message might)."""
    mask = masker(secrets)
    return lambda line: sink(mask(line))


def _connect_remote_cache(box: Container, cache: RemoteCache, request: RunRequest) -> None:
    """Write ccache's configuration (the storage URL with its password) into the container, readable by root
    only, and probe the storage with one compilation: a storage ccache cannot use is a warning (ccache goes on
    with the local cache); a storage URL the image's ccache refuses stops the build before it starts."""
    reporter = request.log.reporter
    reporter(Event("stage", f"remote compiler cache {cache.url}", stage="ccache"))
    box.write_file(CONFIG_PATH, cache.config_text().encode(), mode=0o400)
    mask = masker(cache.secrets())
    lines: list[str] = []
    code = box.call(probe_command(cache), on_line=lambda line: lines.append(mask(line)))
    if code != 0:
        raise InvalidOption(
            f"the builder image's ccache refuses the remote storage {cache.url} ({cache.origin}): "
            + (" ".join(line for line in lines if line.startswith("ccache")) or f"exit code {code}"),
            hint="remote storage needs ccache >= 4.4 in the builder image (Debian bookworm has 4.7.5, which "
            "takes redis:// and http(s)://); fix the URL or drop the remote cache",
        )
    warning = probe_verdict(cache, lines)
    if warning:
        reporter(Event("warning", warning, stage="ccache"))


def _record_cache_stats(box: Container, cache: RemoteCache | None, request: RunRequest) -> None:
    """Read ccache's stats log of this build, write it beside the artifacts (the manifest's ``ccache``
    block) and say how many compilations it saved; failed remote lookups are a warning."""
    lines: list[str] = []
    if box.call(["cat", STATS_LOG], on_line=lines.append) != 0:
        lines = []  # no compilation went through ccache (a build with nothing to compile)
    stats = CacheStats.from_log(lines)
    record = {"remote_storage": cache.url if cache else None, **stats.to_json()}
    (request.out_dir / CCACHE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    request.log.reporter(Event("info", stats.summary(), stage="ccache"))
    if cache is not None and stats.remote_errors:
        request.log.reporter(
            Event(
                "warning",
                f"{stats.remote_errors} lookup(s) in the remote compiler cache {cache.url} failed: those "
                "compilations used the local cache only",
                stage="ccache",
            )
        )
