"""Deploy with ``--target docker``: llama-server from the build's runtime image on each host's own Docker engine.

Unit tests (no host) cover the container script (golden), its mounts, the API key file, a CUDA build's GPUs and
the state mapping. The rest start two test hosts of the docker flavour (tests/testhosts.py: systemd, sshd and
a dockerd of their own) and one plain host without Docker, deploy the suite's real CPU build and a tiny model,
and query each host's llama-server through the SSH connection.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import tarfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import unloadable_model
from llamaforge.build import runtime_image
from llamaforge.core.errors import InvalidOption, OperationFailed
from llamaforge.core.events import CancelToken, Event
from llamaforge.deploy.release import Layout, ReleaseSpec, release_id
from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult
from llamaforge.deploy.targets import get_target
from llamaforge.deploy.targets.container import (
    ContainerImage,
    DockerTarget,
    render_container,
    saved_image,
    state_from_inspect,
)
from llamaforge.runners.engine import build_image, docker_client
from llamaforge.runners.ssh.forward import forward_local
from llamaforge.runners.ssh.transfer import CHUNK
from llamaforge.serve.launcher import LlamaFlags
from test_deploy_faults import deploy, post
from test_deploy_ssh import complete_through_ssh, listening, on_host, run, runner
from testhosts import USER, TestHost, write_known_hosts

pytestmark = pytest.mark.quick

GOLDEN = Path(__file__).parent / "golden" / "deploy-llama-server.docker.sh"
_PORTS = itertools.count(20100)  # the module's hosts are its own: its tests' ports need only differ
UPDATE = bool(os.environ.get("LLAMAFORGE_UPDATE_GOLDEN"))
IMAGE = ContainerImage("sha256:" + "e" * 64, "llamaforge/llama-server:0c746799120471183e5949a10bb9dc1e")


def spec(**changes: Any) -> ReleaseSpec:
    base = ReleaseSpec(
        build_key="0c746799120471183e5949a10bb9dc1e",
        build_dir=Path("/nowhere"),
        manifest_sha256="a" * 64,
        model=Path("/m.gguf"),
        model_sha256="b" * 64,
        model_size=1000,
    )
    return replace(base, **changes)


# No host needed


def test_the_container_script_matches_its_golden_and_passes_shellcheck(tmp_path: Path) -> None:
    import shutil
    import subprocess

    text = render_container(spec(flags=LlamaFlags(ctx=512, threads=2), port=8081), Layout("lab"), IMAGE)
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.read_text(encoding="utf-8") == text, "rerun with LLAMAFORGE_UPDATE_GOLDEN=1"
    for part in (
        "--network host",
        "--restart unless-stopped",
        "--read-only --cap-drop ALL",
        '--mount "type=bind,source=$release,target=/release,readonly"',
        '--mount "type=bind,source=$model,target=/models/model.gguf,readonly"',
        '--user "$user"',
        "curl -fsS http://127.0.0.1:8081/health",
        f"  {IMAGE.id} \\\n  -m /models/model.gguf --host 127.0.0.1 --port 8081",
    ):
        assert part in text
    command = text.split("exec docker run", 1)[1]
    assert "--gpus" not in command and "--api-key-file" not in command
    if shutil.which("shellcheck"):
        script = tmp_path / "run.sh"
        script.write_text(text, encoding="utf-8")
        checked = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stdout


def test_beyond_loopback_the_key_is_a_mounted_file_and_cuda_asks_for_gpus() -> None:
    text = render_container(spec(listen="0.0.0.0"), Layout("lab"), replace(IMAGE, gpus=True))
    assert "--host 0.0.0.0" in text and "--api-key-file /release/api-key" in text
    assert "--gpus all" in text
    assert "api-key=" not in text and "--api-key " not in text and "LLAMA_API_KEY" not in text
    assert "curl -fsS http://127.0.0.1:8080/health" in text  # a wildcard is checked on loopback
    assert "http://10.0.0.5:8080/health" in render_container(spec(listen="10.0.0.5"), Layout("lab"), IMAGE)
    with pytest.raises(InvalidOption):
        render_container(spec(), Layout("lab", "/opt/a,b"), IMAGE)


def test_the_release_id_follows_the_container_script_and_the_image() -> None:
    layout = Layout("lab")
    ids = {
        release_id(spec(), DockerTarget(image).service_files(spec(), layout))
        for image in (IMAGE, replace(IMAGE, id="sha256:" + "f" * 64), replace(IMAGE, gpus=True))
    }
    systemd = release_id(spec(), get_target("systemd").service_files(spec(), layout))
    assert len(ids | {systemd}) == 4
    assert DockerTarget(IMAGE).files(spec()) == []  # the binaries are in the image
    with pytest.raises(InvalidOption) as unknown:
        get_target("dockr")
    assert "did you mean 'docker'" in (unknown.value.hint or "")


def test_a_deployment_keeps_its_target() -> None:
    from llamaforge.deploy.hosts.remote import HostState
    from llamaforge.deploy.hosts.rollout import other_target

    state = HostState("r1", ("r1",), ("r1",), {"target": "systemd"})
    assert other_target(state, get_target("systemd"), "lf@h:22", Layout("lab")) == ""
    refused = other_target(state, DockerTarget(IMAGE), "lf@h:22", Layout("lab"))
    assert "lf@h:22" in refused and "--target systemd" in refused and "another --name" in refused
    assert other_target(HostState(None, (), (), None), DockerTarget(), "lf@h:22", Layout("lab")) == ""


def test_docker_states_map_to_service_states() -> None:
    assert state_from_inspect("running 0 healthy 0\n") == state_from_inspect("running 0 none 0")
    assert state_from_inspect("running 0 healthy 0").active == "active"
    assert state_from_inspect("running 0 starting 0").active == "activating"
    assert state_from_inspect("running 2 unhealthy 0") == type(state_from_inspect(""))("failed", 2)
    assert state_from_inspect("restarting 3 starting 1").restarts == 3
    assert state_from_inspect("exited 1 none 1").active == "failed"
    assert state_from_inspect("exited 0 none 0").active == "inactive"
    assert state_from_inspect("").active == "inactive"  # no container
    # llama-server is the container's process: Docker says 128 + N when a signal ended it.
    assert state_from_inspect("restarting 1 none 132").killed_by is signal.SIGILL
    assert state_from_inspect("exited 0 none 1").killed_by is None


# On test hosts with their own Docker engine


@pytest.fixture(scope="module")
def docker_hosts(docker_engine: object, base_image: str, ssh_client_key: Path) -> Iterator[list[TestHost]]:
    """Two docker-flavour hosts and, last, one plain host without Docker (removed by id afterwards)."""
    import docker.errors

    from conftest import require
    from llamaforge.core.errors import LlamaforgeError
    from testhosts import ensure_image, remove_hosts, start_hosts

    started: list[TestHost] = []
    try:
        started += start_hosts(
            docker_engine,
            ensure_image(base_image, "docker"),
            ssh_client_key,
            2,
            flavour="docker",
            group="docker",
        )
        started += start_hosts(docker_engine, ensure_image(base_image), ssh_client_key, 1, group="nodocker")
    except (LlamaforgeError, RuntimeError, docker.errors.DockerException) as error:
        remove_hosts(started)
        require(False, f"docker test hosts could not start: {error}")
        raise
    yield started
    remove_hosts(started)


@pytest.fixture
def fleet(
    docker_hosts: list[TestHost],
    patched_build: Path,
    build_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """Access to the two docker hosts (their keys trusted), a deployment name and port of this test's own; the
    deployment's container is removed afterwards."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LLAMAFORGE_HOME", build_env["LLAMAFORGE_HOME"])
    known = write_known_hosts(tmp_path / "known_hosts", docker_hosts)
    name = f"d{os.getpid() % 10000}-{len(list(tmp_path.parent.iterdir()))}"
    port = next(_PORTS)  # never the port of another test's deployment, whatever its teardown did
    access = {
        "hosts": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in docker_hosts[:2]),
        "ssh_key": str(docker_hosts[0].key_file),
        "known_hosts": str(known),
        "name": name,
        "target": "docker",
    }
    base = {**access, "build": patched_build.name, "port": port, "gate_timeout_s": 120}
    yield {"access": access, "base": base, "known": known, "name": name, "port": port}
    for host in docker_hosts[:2]:
        host.exec(["docker", "rm", "--force", f"llamaforge-{name}"])


def container(host: TestHost, name: str) -> dict[str, Any]:
    """``docker inspect`` of the deployment's container on the host (read out of band)."""
    shown: list[dict[str, Any]] = json.loads(on_host(host, f"docker inspect llamaforge-{name}"))
    return shown[0]


def settled_status(access: dict[str, Any]) -> DeployStatusResult:
    """deploy.status once the engines' own health checks (every 5 s) have run since the last restart."""
    deadline = time.monotonic() + 30
    while True:
        shown = run("deploy.status", **access)
        assert isinstance(shown, DeployStatusResult)
        if all(host.active == "active" for host in shown.hosts) or time.monotonic() > deadline:
            return shown
        time.sleep(1)


@pytest.mark.docker
@pytest.mark.llamacpp
def test_docker_deploy_query_redeploy_and_rollback(
    fleet: dict[str, Any], docker_hosts: list[TestHost], tiny_qwen3: Path
) -> None:
    access, base, known, name, port = (fleet[key] for key in ("access", "base", "known", "name", "port"))
    hosts = docker_hosts[:2]
    started = time.monotonic()
    plan = run("deploy.plan", **base, model=str(tiny_qwen3))  # makes the runtime image here when missing
    plan_s = time.monotonic() - started
    assert isinstance(plan, DeployPlanResult) and plan.target == "docker"
    assert [item.action for item in plan.hosts] == ["upload"] * 2

    started = time.monotonic()
    first = run("deploy", **base, model=str(tiny_qwen3))
    first_s = time.monotonic() - started
    assert isinstance(first, DeployResult) and first.passed, first
    assert [item.status for item in first.hosts] == ["updated"] * 2
    # each host ran the image's llama-bench as the container would, on the probe model, before the switch
    assert all(
        item.probe and item.probe.startswith("llama-bench ran as llamaforge: pp16 ") for item in first.hosts
    )
    size = tiny_qwen3.stat().st_size
    # each host's engine lacked the image (unless an earlier test of this module loaded it there)
    assert all(
        item.model_bytes == size and item.sent_bytes >= size + item.image_bytes for item in first.hosts
    )
    # the plan said which hosts would get the image, and now none would
    assert [bool(item.delivery) for item in plan.hosts] == [item.image_bytes > 0 for item in first.hosts]
    assert all(
        item.delivery.startswith("the image llamaforge/llama-server:") for item in plan.hosts if item.delivery
    )
    again = run("deploy.plan", **base, model=str(tiny_qwen3), ctx=1024)
    assert isinstance(again, DeployPlanResult) and [item.delivery for item in again.hosts] == ["", ""]
    root = f"/opt/llamaforge/{name}"
    user = on_host(hosts[0], "echo $(id -u llamaforge):$(id -g llamaforge)")
    for host in hosts:
        assert len(complete_through_ssh(host, known, port)) == 6
        assert on_host(host, f"readlink {root}/current") == f"releases/{first.release}"
        assert host.exec(["test", "-e", f"{root}/current/bin"])[0] != 0  # no binaries: they are in the image
        shown = container(host, name)
        assert shown["HostConfig"]["NetworkMode"] == "host" and shown["HostConfig"]["ReadonlyRootfs"]
        assert shown["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
        assert shown["Config"]["User"] == user and not user.startswith("0:")
        assert shown["Image"] == on_host(
            host, f"docker image inspect --format '{{{{.Id}}}}' {shown['Image']}"
        )
        assert {(mount["Destination"], mount["RW"]) for mount in shown["Mounts"]} == {
            ("/release", False),
            ("/models/model.gguf", False),
        }
        assert listening(host, port) == ["0100007F"]  # the host's 127.0.0.1 only
    status = settled_status(access)
    assert [(item.current, item.active, item.healthy) for item in status.hosts] == [
        (first.release, "active", True)
    ] * 2

    before = [container(host, name)["Id"] for host in hosts]
    second = run("deploy", **base, model=str(tiny_qwen3), ctx=1024, batch=2)
    assert second.passed and second.release != first.release
    assert [item.status for item in second.hosts] == ["updated"] * 2
    assert [(item.image_bytes, item.model_bytes) for item in second.hosts] == [(0, 0)] * 2
    assert all(item.sent_bytes < 100_000 for item in second.hosts)  # the container script and release.json
    for host, old in zip(hosts, before, strict=True):
        shown = container(host, name)
        assert shown["Id"] != old and shown["Args"][-2:] == ["-c", "1024"]
        assert len(complete_through_ssh(host, known, port)) == 6

    back = run("deploy.rollback", **access, gate_timeout_s=120)
    assert back.passed and [item.status for item in back.hosts] == ["rolled back"] * 2
    for host in hosts:
        assert on_host(host, f"readlink {root}/current") == f"releases/{first.release}"
        assert "-c" not in container(host, name)["Args"]
        assert len(complete_through_ssh(host, known, port)) == 6
    with pytest.raises(OperationFailed) as caught:  # the systemd target cannot take this deployment over
        run("deploy", **{**base, "target": "systemd"}, model=str(tiny_qwen3))
    assert [item.status for item in caught.value.result.hosts] == ["failed"] * 2
    assert "runs with --target docker" in caught.value.result.hosts[0].detail
    assert on_host(hosts[0], f"readlink {root}/current") == f"releases/{first.release}"
    print(
        f"\ndocker: plan (runtime image ready) {plan_s:.1f} s; deploy 2 hosts {first_s:.1f} s "
        f"(image bytes {[item.image_bytes for item in first.hosts]}); rollback {back.wall_s:.1f} s"
    )


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_docker_release_whose_model_does_not_load_is_rolled_back_on_the_canary_only(
    fleet: dict[str, Any], docker_hosts: list[TestHost], tiny_qwen3: Path, tmp_path: Path
) -> None:
    base, known, name, port = fleet["base"], fleet["known"], fleet["name"], fleet["port"]
    good = run("deploy", **base, model=str(tiny_qwen3), batch=2)
    assert good.passed
    broken = unloadable_model(tmp_path / "unknown-arch.gguf")
    with pytest.raises(OperationFailed) as caught:
        run("deploy", **base, model=str(broken))
    report = caught.value.result
    assert isinstance(report, DeployResult)
    assert [item.status for item in report.hosts] == ["rolled back", "untouched"], report
    canary = report.hosts[0]
    assert canary.release == good.release and canary.logs and "restarted" in canary.detail
    root = f"/opt/llamaforge/{name}"
    for host in docker_hosts[:2]:
        assert on_host(host, f"readlink {root}/current") == f"releases/{good.release}"
        assert len(complete_through_ssh(host, known, port)) == 6
    assert on_host(docker_hosts[1], f"ls {root}/releases") == good.release  # nothing reached it


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_docker_release_beyond_loopback_reads_its_key_from_the_mounted_file(
    fleet: dict[str, Any], docker_hosts: list[TestHost], tiny_qwen3: Path
) -> None:
    host, known, name, port = docker_hosts[0], fleet["known"], fleet["name"], fleet["port"]
    one = fleet["access"]["hosts"].split(",")[0]
    report = run("deploy", **{**fleet["base"], "hosts": one}, model=str(tiny_qwen3), listen="0.0.0.0")
    assert report.passed, report
    key_file = report.hosts[0].api_key_file
    assert key_file == f"/opt/llamaforge/{name}/releases/{report.release}/api-key"
    assert on_host(host, f"stat -c '%a %U' {key_file}") == "600 llamaforge"
    key = on_host(host, f"cat {key_file}")
    shown = json.dumps(container(host, name))
    assert "--api-key-file" in shown and "/release/api-key" in shown
    assert key not in shown and key not in on_host(host, f"cat /opt/llamaforge/{name}/current/*.sh")
    assert key not in on_host(host, "ps -eo args")
    assert listening(host, port) == ["00000000"]  # 0.0.0.0, as asked
    with runner(host, known) as opened, forward_local(opened, port) as local:
        body = {"prompt": "hi", "n_predict": 2}
        assert post(local, "/completion", body) == 401  # no key: refused
        assert post(local, "/completion", body, key=key) == 200  # the container read the mounted file


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_host_without_docker_is_refused_before_anything_changes(
    fleet: dict[str, Any], docker_hosts: list[TestHost], tiny_qwen3: Path
) -> None:
    plain = docker_hosts[2]
    known: Path = fleet["known"]
    known.write_text(known.read_text() + "".join(f"{line}\n" for line in plain.host_key_lines()))
    hosts = f"{fleet['access']['hosts'].split(',')[0]},{USER}@127.0.0.1:{plain.port}"
    with pytest.raises(OperationFailed) as caught:
        run("deploy", **{**fleet["base"], "hosts": hosts}, model=str(tiny_qwen3))
    report = caught.value.result
    assert [item.status for item in report.hosts] == ["untouched", "failed"], report
    refused = report.hosts[1].detail
    assert f"127.0.0.1:{plain.port}" in refused and "needs a Docker engine" in refused
    assert "install Docker" in refused and "nothing was sent or switched" in refused
    for host in (docker_hosts[0], plain):
        assert host.exec(["test", "-e", f"/opt/llamaforge/{fleet['name']}"])[0] != 0


@contextlib.contextmanager
def scratch_images(directory: Path, tags: list[str], size: int = 0) -> Iterator[list[str]]:
    """Small images of one file each (``FROM scratch``, nothing pulled; the tag, then ``size`` random bytes) on
    the local engine, removed after: images that run nothing. Their ids, in the order of ``tags``."""
    ids: list[str] = []
    try:
        for tag in tags:
            context = directory / tag.replace("/", "-").replace(":", "-")
            context.mkdir()
            (context / "note.txt").write_bytes(tag.encode() + os.urandom(size))
            (context / "Dockerfile").write_text("FROM scratch\nCOPY note.txt /note.txt\n", encoding="utf-8")
            ids.append(build_image(context, tag))
        yield ids
    finally:
        for tag in tags:
            with contextlib.suppress(Exception):
                docker_client().images.remove(tag)


@pytest.mark.docker
def test_only_the_image_archives_used_last_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFORGE_HOME", str(tmp_path / "home"))
    tags = [f"llamaforge-test/archive-{os.getpid()}:{letter}" for letter in "abc"]
    with scratch_images(tmp_path, tags) as ids:
        a, b, c = (ContainerImage(image, tag) for image, tag in zip(ids, tags, strict=True))
        first = saved_image(a)
        with tarfile.open(first) as archive:  # a real `docker save` archive, with its tag
            manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == [tags[0]]
        for image in (b, a):  # b saved, then a used again: b is the one used longest ago
            time.sleep(0.05)
            saved_image(image)
        assert saved_image(a) == first and first.stat().st_size > 0
        time.sleep(0.05)
        saved_image(c)
        left = sorted(path.name for path in (tmp_path / "home" / "images").iterdir())
        assert left == sorted(f"{image.id.removeprefix('sha256:')}.tar" for image in (a, c))


class CancelAtImageChunk(CancelToken):
    """Ctrl-C as the image's third chunk is about to be sent (the transfer checks once per chunk)."""

    def __init__(self) -> None:
        super().__init__()
        self.sending, self.checks = False, 0

    def on_event(self, event: Event) -> None:
        self.sending = self.sending or "sending the image" in event.message

    def raise_if_cancelled(self) -> None:
        if self.sending:
            self.checks += 1
            if self.checks == 3:
                self.cancel()
        super().raise_if_cancelled()


def engine_has(host: TestHost, image: str) -> bool:
    """Whether the host's own engine has ``image`` (read out of band)."""
    return host.exec(["docker", "image", "inspect", image])[0] == 0


@pytest.mark.docker
@pytest.mark.llamacpp
def test_an_image_upload_resumes_and_pruning_removes_the_image_only_its_release_ran(
    fleet: dict[str, Any], docker_hosts: list[TestHost], tiny_qwen3: Path, tmp_path: Path
) -> None:
    host, name = docker_hosts[0], fleet["name"]
    one = {**fleet["base"], "hosts": fleet["access"]["hosts"].split(",")[0], "model": str(tiny_qwen3)}
    good = run("deploy", **one)
    assert good.passed, good
    runtime = container(host, name)["Image"]
    real = runtime_image.ensure_runtime_image
    tag = f"llamaforge-test/empty:{name}"
    with scratch_images(tmp_path, [tag], size=4 * CHUNK) as (empty,), pytest.MonkeyPatch.context() as patch:
        # the next release's build comes with an image that runs nothing: it cannot run llama-bench either
        patch.setattr(
            runtime_image,
            "ensure_runtime_image",
            lambda key, **options: replace(real(key, **options), image_id=empty),
        )
        cancel = CancelAtImageChunk()
        with pytest.raises(OperationFailed) as caught:
            deploy(**one, ctx=1024, cancel=cancel, on_event=cancel.on_event)
        stopped = caught.value.result
        assert caught.value.exit_code == 130 and [item.status for item in stopped.hosts] == ["interrupted"]
        assert stopped.hosts[0].release == good.release and not engine_has(host, empty)
        archive = saved_image(ContainerImage(empty, tag))
        part = f"/opt/llamaforge/{name}/images/{archive.name}.part"
        assert on_host(host, f"stat -c %s {part}") == str(2 * CHUNK)  # two chunks arrived before Ctrl-C

        with pytest.raises(OperationFailed) as caught:
            run("deploy", **one, ctx=1024)
        failed = caught.value.result
        # the image is delivered, then the probe runs it as the container would and refuses it: never switched
        assert [item.status for item in failed.hosts] == ["failed"], failed
        assert "cannot run there: llama-bench ended with exit code" in failed.hosts[0].detail, failed
        assert failed.hosts[0].image_bytes == archive.stat().st_size - 2 * CHUNK  # resumed from the part
        assert (
            engine_has(host, empty) and host.exec(["test", "-e", part])[0] != 0
        )  # loaded; nothing left over
    releases = f"/opt/llamaforge/{name}/releases"
    assert sorted(on_host(host, f"ls {releases}").split()) == sorted([good.release, failed.release])
    assert container(host, name)["Image"] == runtime  # still on the good release's image

    kept = run("deploy", **one, ctx=2048)  # passes: the failed release (in no history) is pruned
    assert kept.passed and kept.hosts[0].image_bytes == 0, kept
    assert sorted(on_host(host, f"ls {releases}").split()) == sorted([good.release, kept.release])
    assert not engine_has(host, empty)  # no release there runs it any more
    assert engine_has(host, runtime)  # the releases left run this one
    last = run("deploy", **one, ctx=3072, keep=1)  # prunes both older releases, which ran the current's image
    assert last.passed, last
    assert on_host(host, f"ls {releases}").split() == [last.release]
    assert engine_has(host, runtime)  # still named by the release left: not removed
    assert len(complete_through_ssh(host, fleet["known"], fleet["port"])) == 6
