"""Test hosts: containers from the local base image that boot systemd as PID 1 and run sshd.

Each host generates its own sshd host keys at boot (``ssh-keygen -A`` before sshd starts, never baked into the
image), authorizes one ed25519 key made by the test session for the user ``lf`` (passwordless sudo, as a
deploy user has), and publishes port 22 only on 127.0.0.1 at a port the engine picks. The engine refuses
``--privileged``; ``SYS_ADMIN`` plus tmpfs on /run and a read-only /sys/fs/cgroup boots systemd. Containers carry
the ``org.llamaforge.owned`` label and a name of their own, and are removed by id when the session ends.

The ``docker`` flavour adds the Debian ``docker.io`` package: each such host runs a Docker engine of its own
(dockerd as the package's systemd unit), so a container the docker target starts there sees that host's
filesystem and loopback, not this machine's. Without ``--privileged`` it needs ``SYS_ADMIN``, ``NET_ADMIN`` and
``SYS_PTRACE`` (a health check execs into a container whose process runs as another uid, and runc's setns needs
it, as root on a real host has it), seccomp and AppArmor unconfined, a writable /sys/fs/cgroup and a volume of
its own on /var/lib/docker; dockerd runs with overlay2 on that volume, no iptables and no bridge
(``daemon.json``), so the containers it starts use ``--network host``. Only these hosts get those flags; the
volume goes with the container.

The published SSH port is on a bridge network the session creates (not the engine's default docker0); besides
it the hosts share a second network of their own, created ``internal`` (no route out of it): each host's
:attr:`TestHost.private_address` is its address there, the private address RPC workers bind. The tests never
use it from this side; it carries host-to-host traffic only. Both networks are removed with the hosts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import socket
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.runners.engine import LABEL, build_image, image_id
from llamaforge.runners.ssh.connection import SshHost

USER = "lf"
USER_UID = 1000

DOCKERFILE = f"""\
FROM {{base}}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      systemd systemd-sysv dbus openssh-server sudo procps \\
 && rm -rf /var/lib/apt/lists/* \\
 && rm -f /etc/ssh/ssh_host_*
RUN useradd --create-home --uid {USER_UID} --shell /bin/bash {USER} \\
 && install -d -m 0700 -o {USER} -g {USER} /home/{USER}/.ssh \\
 && echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER} && chmod 0440 /etc/sudoers.d/{USER} \\
 && printf 'PasswordAuthentication no\\nKbdInteractiveAuthentication no\\n' > /etc/ssh/sshd_config.d/keys-only.conf
COPY ssh-hostkeys.conf /etc/systemd/system/ssh.service.d/hostkeys.conf
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
"""

# Host keys are made when the host boots, so every container has its own.
HOSTKEYS_DROPIN = """\
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
"""


# The docker flavour: the systemd host plus Debian's docker.io, its dockerd without iptables, masquerading or a
# bridge (nothing of it reaches this machine's network namespace). Storage: overlay2 works on the host's
# /var/lib/docker volume (the outer engine's own file system, not an overlay); vfs works everywhere but copies
# the whole image for every container and layer. Measured here with the 335 MB runtime image: docker load
# 37 s and docker run 5-22 s on vfs, 11-18 s and under 1 s on overlay2; the live docker deploy file took 6m54s
# on vfs. Where overlay2 cannot work, put "vfs" here.
STORAGE_DRIVER = "overlay2"
DOCKER_DAEMON_JSON = f"""\
{{"storage-driver": "{STORAGE_DRIVER}", "iptables": false, "ip-masq": false, "bridge": "none"}}
"""
DOCKER_LAYER = """\
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io \\
 && rm -rf /var/lib/apt/lists/* \\
 && systemctl enable docker.service
COPY daemon.json /etc/docker/daemon.json
"""
FLAVOURS = ("systemd", "docker")


def _dockerfile(base: str, flavour: str) -> str:
    text = DOCKERFILE.format(base=base)
    if flavour == "docker":
        head, _, tail = text.partition("STOPSIGNAL")
        text = head + DOCKER_LAYER + "STOPSIGNAL" + tail
    return text


def image_tag(base: str, flavour: str = "systemd") -> str:
    """The test host image's tag: changes whenever its Dockerfile does (each flavour has its own)."""
    extra = DOCKER_DAEMON_JSON if flavour == "docker" else ""
    digest = hashlib.sha256((_dockerfile(base, flavour) + HOSTKEYS_DROPIN + extra).encode()).hexdigest()[:12]
    prefix = "" if flavour == "systemd" else f"{flavour}-"
    return f"llamaforge-testhost:{prefix}{digest}"


def ensure_image(base: str, flavour: str = "systemd") -> str:
    """The test host image of ``flavour`` (systemd, or docker: with a Docker engine of its own), built from
    ``base`` through the core's image builder unless it exists."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown test host flavour {flavour!r}")
    tag = image_tag(base, flavour)
    if image_id(tag) is not None:
        return tag
    with tempfile.TemporaryDirectory(prefix="llamaforge-testhost-") as context:
        Path(context, "Dockerfile").write_text(_dockerfile(base, flavour), encoding="utf-8")
        Path(context, "ssh-hostkeys.conf").write_text(HOSTKEYS_DROPIN, encoding="utf-8")
        if flavour == "docker":
            Path(context, "daemon.json").write_text(DOCKER_DAEMON_JSON, encoding="utf-8")
        build_image(Path(context), tag)
    return tag


def make_key(path: Path) -> Path:
    """A fresh ed25519 key pair in OpenSSH format at ``path`` (mode 0600) and ``path.pub``; returns ``path``.

    Made with ``cryptography`` (paramiko's own dependency), so the test machine needs no ssh-keygen.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path.touch(mode=0o600)
    path.write_bytes(private)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    Path(f"{path}.pub").write_text(f"{public.decode()} llamaforge-tests\n", encoding="utf-8")
    return path


def write_known_hosts(path: Path, hosts: Sequence[TestHost]) -> Path:
    """``path`` as a known_hosts file with the hosts' real keys (read out of band); returns ``path``."""
    path.write_text(
        "".join(f"{line}\n" for host in hosts for line in host.host_key_lines()), encoding="utf-8"
    )
    return path


def make_client_key(directory: Path) -> Path:
    """The session's client key pair in ``directory``; returns the private key's path (``.pub`` beside it)."""
    return make_key(directory / "id_ed25519")


@dataclass
class TestHost:
    """One booted host: its container, the SSH endpoint on 127.0.0.1 and the session's client key."""

    __test__ = False  # not a test class for pytest

    name: str
    container: Any
    port: int
    key_file: Path
    private_address: str = ""  # on the hosts' internal network
    network: Any = None  # that internal network
    networks: tuple[Any, ...] = ()  # every network the hosts' session created (removed with them)

    def ssh_host(self, known_hosts: Path | None = None) -> SshHost:
        """How the SSH runner reaches this host as the test user."""
        return SshHost(
            host="127.0.0.1", port=self.port, user=USER, key_file=self.key_file, known_hosts=known_hosts
        )

    def exec(self, command: Sequence[str], user: str = "root") -> tuple[int, str]:
        """Run ``command`` in the container out of band (docker exec, not SSH); exit code and output."""
        code, output = self.container.exec_run(list(command), user=user)
        return int(code), output.decode("utf-8", errors="replace")

    def host_key_lines(self) -> list[str]:
        """The host's public keys as known_hosts lines for ``[127.0.0.1]:PORT`` (read out of band)."""
        code, output = self.exec(["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"])
        assert code == 0, output
        lines = []
        for line in output.splitlines():
            kind, blob, *_ = line.split()
            lines.append(f"[127.0.0.1]:{self.port} {kind} {blob}")
        return lines

    def host_key(self, kind: str = "ssh-ed25519") -> str:
        """The base64 blob of the host key of type ``kind``."""
        return next(line.split()[2] for line in self.host_key_lines() if line.split()[1] == kind)


def _authorized_keys_archive(public_key: str) -> bytes:
    buffer = io.BytesIO()
    data = public_key.encode()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("authorized_keys")
        info.size, info.mode, info.uid, info.gid = len(data), 0o600, USER_UID, USER_UID
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _ssh_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            return conn.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def _wait_booted(host: TestHost, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        host.container.reload()
        if host.container.status != "running":
            logs = host.container.logs(tail=30).decode("utf-8", errors="replace")
            raise RuntimeError(f"test host {host.name} stopped while booting:\n{logs}")
        _code, state = host.exec(["systemctl", "is-system-running"])
        state = state.strip()
        if state in ("running", "degraded") and _ssh_answers(host.port):
            return
        time.sleep(0.5)
    _code, failed = host.exec(["systemctl", "--failed", "--no-pager"])
    raise RuntimeError(f"test host {host.name} did not boot in {timeout_s:g} s (state {state!r}):\n{failed}")


def _flavour_options(flavour: str) -> dict[str, Any]:
    """The container options of a host of ``flavour`` (the docker flavour's engine needs more, see above)."""
    from docker.types import Mount

    if flavour != "docker":
        return {
            "cap_add": ["SYS_ADMIN"],
            "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "ro"}},
        }
    return {
        "cap_add": ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"],
        "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
        "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
        "mounts": [Mount("/var/lib/docker", None, type="volume")],  # anonymous: removed with the container
    }


def _wait_engine(host: TestHost, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    output = ""
    while time.monotonic() < deadline:
        code, output = host.exec(["docker", "info", "--format", "{{.Driver}}"])
        if code == 0:
            return
        time.sleep(0.5)
    _code, journal = host.exec(["journalctl", "-u", "docker", "-n", "30", "--no-pager"])
    raise RuntimeError(f"the Docker engine of test host {host.name} did not start:\n{output}\n{journal}")


def start_hosts(
    client: Any,
    image: str,
    key_file: Path,
    count: int,
    boot_timeout_s: float = 120.0,
    flavour: str = "systemd",
    group: str = "",
) -> list[TestHost]:
    """Start ``count`` hosts of ``flavour`` from ``image`` authorizing ``key_file``'s public key; wait until all
    have booted (a docker host: until its engine answers too).

    ``group`` goes into the names of the containers and networks, so several groups can run in one session.
    On failure every host started so far is removed before the error propagates.
    """
    group = group and f"{group}-"
    public_key = Path(f"{key_file}.pub").read_text(encoding="utf-8")
    hosts: list[TestHost] = []
    labels = {LABEL: "1", "org.llamaforge.role": "testhost"}
    # A bridge of their own for the published SSH port too: nothing depends on the engine's default docker0.
    public = client.networks.create(
        f"llamaforge-testssh-{group}{os.getpid()}", driver="bridge", labels=labels
    )
    network = client.networks.create(
        f"llamaforge-testnet-{group}{os.getpid()}", driver="bridge", internal=True, labels=labels
    )
    try:
        for index in range(count):
            name = f"llamaforge-testhost-{group}{os.getpid()}-{index}"
            container = client.containers.create(
                image,
                command=["/lib/systemd/systemd"],
                name=name,
                hostname=f"host{index}",
                labels={LABEL: "1", "org.llamaforge.role": "testhost"},
                tmpfs={"/run": "", "/run/lock": ""},
                ports={"22/tcp": ("127.0.0.1", None)},
                network=public.name,
                detach=True,
                **_flavour_options(flavour),
            )
            hosts.append(TestHost(name, container, 0, key_file, network=network, networks=(public, network)))
            network.connect(container)
            container.put_archive(f"/home/{USER}/.ssh", _authorized_keys_archive(public_key))
            container.start()
        for host in hosts:
            host.container.reload()
            binding = host.container.attrs["NetworkSettings"]["Ports"]["22/tcp"][0]
            assert binding["HostIp"] == "127.0.0.1", binding
            host.port = int(binding["HostPort"])
            host.private_address = host.container.attrs["NetworkSettings"]["Networks"][network.name][
                "IPAddress"
            ]
        for host in hosts:
            _wait_booted(host, boot_timeout_s)
            if flavour == "docker":
                _wait_engine(host, boot_timeout_s)
    except BaseException:
        remove_hosts(hosts)
        for created in (network, public):
            with contextlib.suppress(Exception):
                created.remove()
        raise
    return hosts


def remove_hosts(hosts: Sequence[TestHost]) -> None:
    """Remove the hosts' containers by id (those already gone are skipped), then their internal network."""
    import docker.errors

    for host in hosts:
        with contextlib.suppress(docker.errors.NotFound):
            host.container.remove(force=True, v=True)  # v: a docker host's anonymous /var/lib/docker volume
    for network in {id(net): net for host in hosts for net in host.networks}.values():
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()


def restart_host(host: TestHost, boot_timeout_s: float = 120.0) -> None:
    """Start a stopped host again (its host keys and files stay), read the port the engine published it on
    this time, and wait until it has booted."""
    host.container.reload()
    if host.container.status != "running":
        host.container.start()
    host.container.reload()
    host.port = int(host.container.attrs["NetworkSettings"]["Ports"]["22/tcp"][0]["HostPort"])
    _wait_booted(host, boot_timeout_s)
