"""The docker executor on a remote engine, the way users point it at one: DOCKER_HOST=tcp://HOST:2376 with
DOCKER_TLS_VERIFY and DOCKER_CERT_PATH. The remote engine is a second dockerd started here (its own data root,
its own bridge, a CA and server/client certificates made with openssl for this test), listening only on
127.0.0.1 with TLS verification; it gets the base and builder images by `docker save | docker load`, never from a
registry. The mini project is built there for real and its artifacts come back.

The second dockerd shares this machine's network namespace, so it gets a bridge of its own (made here, removed
after): dockerd with ``--bridge none`` deletes the host's ``docker0``, which would cut the first engine's
containers off the network."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require
from helpers import invoke, invoke_json, mini_recipe

pytestmark = pytest.mark.docker


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(directory: Path) -> tuple[Path, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate; (server dir, client dir)."""
    server, client = directory / "server", directory / "client"
    server.mkdir()
    client.mkdir()
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=llamaforge test CA",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        cwd=directory,
    )
    for name, where, extension in (
        ("server", server, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", client, "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(extension + "\n")
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(where / "key.pem"),
            "-out",
            f"{name}.csr",
            cwd=directory,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            str(where / "cert.pem"),
            cwd=directory,
        )
        shutil.copy(directory / "ca.pem", where / "ca.pem")
    return server, client


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def remote_engine(docker_engine: object, base_image: str) -> Iterator[dict[str, str]]:
    """DOCKER_* variables that reach the second engine over tcp + TLS on 127.0.0.1 (the engine is stopped and its
    data removed at the end)."""
    require(
        shutil.which("dockerd") is not None and shutil.which("openssl") is not None, "needs dockerd, openssl"
    )
    root = Path(tempfile.mkdtemp(prefix="lf-engine-"))
    server, client = _certificates(root)
    port = _free_port()
    had_docker0 = Path("/sys/class/net/docker0").exists()
    bridge = f"lfbr{port}"
    subprocess.run(["ip", "link", "add", "name", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.213.0.1/24", "dev", bridge], check=True)
    log = (root / "dockerd.log").open("w")
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
            "-H",
            f"tcp://127.0.0.1:{port}",
            "--tlsverify",
            "--tlscacert",
            str(server / "ca.pem"),
            "--tlscert",
            str(server / "cert.pem"),
            "--tlskey",
            str(server / "key.pem"),
            "--bridge",
            bridge,
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    env = {
        **os.environ,
        "DOCKER_HOST": f"tcp://127.0.0.1:{port}",
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(client),
    }
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, (root / "dockerd.log").read_text()[
                -2000:
            ]
            time.sleep(0.5)
        yield env
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        subprocess.run(["ip", "link", "delete", bridge], check=False)
        shutil.rmtree(root, ignore_errors=True)
    assert Path("/sys/class/net/docker0").exists() or not had_docker0, (
        "the first engine's docker0 must survive"
    )


def _copy_image(tag: str, env: dict[str, str]) -> None:
    """``docker save TAG`` on the local engine into ``docker load`` on the remote one."""
    local = {key: value for key, value in os.environ.items() if not key.startswith("DOCKER_")}
    with subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, env=local) as save:
        load = subprocess.run(["docker", "load"], stdin=save.stdout, env=env, capture_output=True, text=True)
    assert save.returncode == 0 and load.returncode == 0, load.stderr


def test_a_build_runs_on_a_remote_engine_over_tls(
    remote_engine: dict[str, str], base_image: str, tmp_path: Path, lf_home: Path
) -> None:
    from llamaforge.build.executors import make_executor
    from llamaforge.build.plan import plan_build
    from llamaforge.build.recipes import load_recipe

    recipe = mini_recipe(tmp_path, ["llama-cli"])
    plan = plan_build(load_recipe(str(recipe)))
    assert plan.environment.image is not None
    make_executor("docker").prepare_environment(plan, lambda event: None)  # the builder image, on this engine
    for tag in (base_image, plan.environment.image.tag):
        _copy_image(tag, remote_engine)
    env = {**remote_engine, "LLAMAFORGE_HOME": str(lf_home)}
    built = invoke_json("build", "--recipe", str(recipe), env=env)["build"]
    binary = Path(built["path"]) / "bin" / "llama-cli"
    assert "commit 0c1e570" in subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    manifest = invoke_json("builds.show", built["key"], env=env)["manifest"]
    inspect = ["docker", "image", "inspect", "-f", "{{.Id}}", plan.environment.image.tag]
    remote_id = subprocess.run(
        inspect, env=remote_engine, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert manifest["image"]["builder_id"] == remote_id, (
        "the manifest names the remote engine's builder image"
    )
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q"], env=remote_engine, capture_output=True, text=True
    )
    assert "llamaforge-ccache" in volumes.stdout.split(), "the remote engine keeps its own ccache volume"
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=org.llamaforge.owned"],
        env=remote_engine,
        capture_output=True,
        text=True,
    )
    assert leftovers.stdout.strip() == "", "the build container was removed on the remote engine"


def test_a_remote_engine_without_the_client_certificate_is_a_clear_error(
    remote_engine: dict[str, str], tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**remote_engine, "LLAMAFORGE_HOME": str(lf_home), "DOCKER_TLS_VERIFY": "", "DOCKER_CERT_PATH": ""}
    result = invoke("build", "--recipe", str(recipe), env=env)
    assert result.returncode == 5, result.stderr
    assert f"cannot reach the Docker engine at {remote_engine['DOCKER_HOST']}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (lf_home / "builds").exists() or not any((lf_home / "builds").iterdir())
