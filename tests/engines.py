"""Extra Docker engines for tests: each a dockerd of its own (its own data root, exec root and bridge) that listens
only on 127.0.0.1 over TCP with TLS verification, with a CA and server/client certificates made with openssl for
the session. They are reached the way users point llamaforge at a remote engine: DOCKER_HOST=tcp://HOST:PORT with
DOCKER_TLS_VERIFY and DOCKER_CERT_PATH (or a builder fleet's engine, tls_verify and cert_path). They get images by
`docker save | docker load` or from llamaforge itself, never from a registry.

An extra dockerd shares this machine's network namespace, so each gets a bridge of its own (made here, removed
after): dockerd with ``--bridge none`` deletes the host's ``docker0``, which would cut the first engine's
containers off the network. An engine can be stopped and started again (its data stays): a builder lost mid-build.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path, names: tuple[str, ...] = ("server", "client")) -> dict[str, Path]:
    """A CA in ``directory`` and, per name, a directory with ca.pem, cert.pem and key.pem signed by it: "server"
    (for 127.0.0.1), anything else a client certificate. Returns name -> directory."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=llamaforge test CA",
        "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=directory,
    )  # fmt: skip
    made = {}
    for name in names:
        where = directory / name
        where.mkdir()
        usage = (
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"
            if name == "server"
            else ("extendedKeyUsage=clientAuth")
        )
        (directory / f"{name}.ext").write_text(usage + "\n")
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(where / "key.pem"),
            "-out", f"{name}.csr", cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-days", "1", "-extfile", f"{name}.ext", "-out", str(where / "cert.pem"), cwd=directory,
        )  # fmt: skip
        shutil.copy(directory / "ca.pem", where / "ca.pem")
        made[name] = where
    return made


def free_port() -> int:
    """A TCP port nothing listens on now (on 127.0.0.1)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ExtraEngine:
    """One extra dockerd (see the module docstring)."""

    name: str
    root: Path
    port: int
    server: Path  # the engine's certificates
    client: Path  # the client's: DOCKER_CERT_PATH
    bridge: str
    subnet: str
    process: subprocess.Popen[bytes] | None = None
    log: IO[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``tcp://127.0.0.1:PORT``."""
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with the DOCKER_* variables that reach the engine."""
        return {
            **os.environ,
            "DOCKER_HOST": self.url,
            "DOCKER_TLS_VERIFY": "1",
            "DOCKER_CERT_PATH": str(self.client),
        }

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against this engine."""
        return subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, check=check)

    def start(self) -> None:
        """Start dockerd (again) and wait until it answers."""
        self.log = (self.root / "dockerd.log").open("a")
        self.process = subprocess.Popen(
            [
                "dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                "--pidfile", str(self.root / "dockerd.pid"), "-H", self.url, "--tlsverify",
                "--tlscacert", str(self.server / "ca.pem"), "--tlscert", str(self.server / "cert.pem"),
                "--tlskey", str(self.server / "key.pem"), "--bridge", self.bridge, "--iptables=false",
                "--ip6tables=false", "--ip-masq=false",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while self.docker("info", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd {self.name} did not start:\n" + self.tail())
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop dockerd (its containers stop with it); its data stays for :meth:`start`."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None

    @property
    def running(self) -> bool:
        """True while its dockerd runs."""
        return self.process is not None and self.process.poll() is None

    def tail(self) -> str:
        """The end of its dockerd log."""
        path = self.root / "dockerd.log"
        return path.read_text(errors="replace")[-3000:] if path.is_file() else ""

    def has_image(self, tag: str) -> bool:
        """True when the engine has ``tag``."""
        return self.docker("image", "inspect", tag, check=False).returncode == 0


def start_engine(name: str) -> ExtraEngine:
    """A started extra engine named ``name`` (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix=f"lf-engine-{name}-"))
    certificates = make_certificates(root / "tls")
    port = free_port()
    engine = ExtraEngine(
        name,
        root,
        port,
        certificates["server"],
        certificates["client"],
        f"lfbr{port}",
        f"10.213.{port % 250}.1/24",
    )
    subprocess.run(["ip", "link", "add", "name", engine.bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", engine.subnet, "dev", engine.bridge], check=True)
    try:
        engine.start()
    except BaseException:
        remove_engine(engine)
        raise
    return engine


def remove_engine(engine: ExtraEngine) -> None:
    """Stop the engine and remove its data and its bridge."""
    engine.stop()
    subprocess.run(["ip", "link", "delete", engine.bridge], check=False, capture_output=True)
    subprocess.run(["umount", "-R", str(engine.root / "data")], check=False, capture_output=True)
    shutil.rmtree(engine.root, ignore_errors=True)


def copy_image(tag: str, engine: ExtraEngine) -> None:
    """``docker save TAG`` on this machine's engine into ``docker load`` on ``engine`` (unless it has it)."""
    if engine.has_image(tag):
        return
    local = {key: value for key, value in os.environ.items() if not key.startswith("DOCKER_")}
    with subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, env=local) as save:
        load = subprocess.run(
            ["docker", "load"], stdin=save.stdout, env=engine.env, capture_output=True, text=True
        )
    assert save.returncode == 0 and load.returncode == 0, load.stderr


def engines(count: int) -> Iterator[list[ExtraEngine]]:
    """``count`` started engines (for a session fixture); all removed at the end, the first engine's docker0
    checked to survive."""
    had_docker0 = Path("/sys/class/net/docker0").exists()
    started: list[ExtraEngine] = []
    try:
        for index in range(count):
            started.append(start_engine(f"e{index + 1}"))
        yield started
    finally:
        # Each data root holds images of several hundred MB: remove them side by side.
        removers = [threading.Thread(target=remove_engine, args=(engine,)) for engine in started]
        for remover in removers:
            remover.start()
        for remover in removers:
            remover.join()
    assert Path("/sys/class/net/docker0").exists() or not had_docker0, (
        "the first engine's docker0 must survive"
    )
