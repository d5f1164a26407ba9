"""The hosts of a deploy: ``user@host:port,...`` parsed into :class:`SshHost` (or an inventory's hosts, see
:mod:`~llamaforge.deploy.hosts.inventory`) as :class:`DeployHost`, one SSH runner each.

A deploy runs the service manager (or the Docker engine) of each host as root: directly when the deploy user
is root, through ``sudo -n`` otherwise (:func:`as_root`). :func:`check_root_access` refuses, while planning
and before anything changes, a host where a deploy user who is not root cannot use sudo without a password
(or has no sudo at all)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.runners.ssh import DEFAULT_KNOWN_HOSTS, SshHost, SshProcessRunner


@dataclass(frozen=True)
class DeployHost:
    """One host of a deploy: how to reach it, its name in reports, its GPU (for the fit plan) and labels."""

    ssh: SshHost
    name: str
    gpu: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def key_file_problem(key: Path) -> str | None:
    """Why ``key`` is no private key file SSH can read ("is a directory", "does not exist", …), or None."""
    problem = "is a directory" if key.is_dir() else None if key.is_file() else "does not exist"
    if problem is None:
        try:
            key.open("rb").close()
        except OSError as error:
            problem = f"cannot be read ({error.strerror})"
    return problem


def ssh_files(ssh_key: str | None, known_hosts: str | None) -> tuple[Path | None, Path | None]:
    """``--ssh-key`` and ``--known-hosts`` as paths, checked before any host is dialled (InvalidOption): the key
    a readable file, the known_hosts file none that is a directory (it need not exist yet: new keys go there)."""
    key = Path(ssh_key).expanduser() if ssh_key else None
    known = Path(known_hosts).expanduser() if known_hosts else None
    if key is not None and (problem := key_file_problem(key)):
        raise InvalidOption(
            f"--ssh-key {key} {problem}",
            hint="give the private key file that the hosts accept (e.g. ~/.ssh/id_ed25519), or leave "
            "--ssh-key out to use the SSH agent",
        )
    if known is not None and known.is_dir():
        raise InvalidOption(
            f"--known-hosts {known} is a directory",
            hint="give the known_hosts file of the hosts (e.g. ~/.ssh/known_hosts); it is read, and new keys "
            "are added to it with --accept-new-host-keys",
        )
    return key, known


def deploy_hosts(hosts: Sequence[SshHost]) -> list[DeployHost]:
    """``--hosts`` given as addresses: each named by its address, no GPU known."""
    return [DeployHost(ssh=host, name=host.address) for host in hosts]


@dataclass(frozen=True)
class Access:
    """How every host is reached: whether new host keys are recorded, and the user's known_hosts."""

    accept_new_host_keys: bool = False
    user_known_hosts: Path | None = DEFAULT_KNOWN_HOSTS
    connect_timeout_s: float = 15.0


@contextlib.contextmanager
def open_runners(hosts: Sequence[SshHost], access: Access) -> Iterator[list[SshProcessRunner]]:
    """One runner per host (each connects on first use), all closed when the block ends."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                SshProcessRunner(
                    host,
                    accept_new_host_keys=access.accept_new_host_keys,
                    user_known_hosts=access.user_known_hosts,
                    connect_timeout_s=access.connect_timeout_s,
                )
            )
            for host in hosts
        ]


class NoRootAccess(LlamaforgeError):
    """A host's deploy user is not root and cannot run commands as root through ``sudo -n`` (no sudo, or sudo
    asks for a password)."""

    exit_code = ExitCode.NO_ROOT_ACCESS


_WHO = "id -u && id -un"
_USERS: weakref.WeakKeyDictionary[SshProcessRunner, tuple[bool, str]] = weakref.WeakKeyDictionary()
_USERS_LOCK = threading.Lock()


def deploy_user(runner: SshProcessRunner) -> tuple[bool, str]:
    """Whether the deploy user on the runner's host is root, and its name (asked once per runner)."""
    with _USERS_LOCK:
        known = _USERS.get(runner)
    if known is None:
        uid, _, name = runner.run(["sh", "-c", _WHO]).stdout.strip().partition("\n")
        known = (uid.strip() == "0", name.strip())
        with _USERS_LOCK:
            _USERS[runner] = known
    return known


def as_root(runner: SshProcessRunner, argv: Sequence[str]) -> list[str]:
    """``argv`` as the host runs it as root: as it is for the root user, through ``sudo -n`` for any other."""
    return list(argv) if deploy_user(runner)[0] else ["sudo", "-n", *argv]


def check_root_access(runner: SshProcessRunner) -> None:
    """Refuse (:class:`NoRootAccess`, naming the host, the user and the fix) a host where the deploy user is not
    root and ``sudo -n true`` fails; it changes nothing there."""
    root, user = deploy_user(runner)
    if root:
        return
    result = runner.run(["sudo", "-n", "true"], warn=True, merge_stderr=True)
    if result.ok:
        return
    said = (result.stdout.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    missing = result.exit_code == 127 or "not found" in said
    how = "there is no sudo there" if missing else f"sudo -n true says: {said}"
    raise NoRootAccess(
        f"{runner.host.address}: the deploy user {user} is not root and cannot run commands as root without a "
        f"password ({how}); a deploy installs and restarts the service as root",
        hint=f"deploy as root@{runner.host.host} (root's SSH key there), or give {user} passwordless sudo there "
        f"(a sudoers line '{user} ALL=(ALL) NOPASSWD: ALL'); nothing was changed",
    )
