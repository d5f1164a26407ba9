"""The release layout (:class:`~llamaforge.deploy.release.Layout`) on one host, through its SSH runner.

Every step leaves the host on a whole release: a release is uploaded into ``releases/.<id>.tmp`` and renamed
into place only when complete (``release.json`` last); ``current`` is switched by a new symlink renamed over
the old one (``mv -T``, one ``rename(2)``); ``history`` is rewritten to a temporary file and renamed too. The
model is sent only when ``models/<sha256>.gguf`` is missing (the transfer module renames it into place only
after its sha256 matched, so its presence means it is whole), and a new release starts as hard links to the
current one's binaries and libraries, so the transfer skips every file that did not change (a changed file is
sent to a ``.part`` and renamed over its link: the older release keeps its own).
Pruning keeps the releases that were current most recently and removes the models no kept release links to
(and, for the docker target, the images no release left on the host runs).
A release that listens beyond loopback carries its API key as ``api-key`` (mode 0600, owned by the service
user, written as root from stdin: :func:`~llamaforge.deploy.hosts.access.as_root`): it reaches the host on no command
line and is read back (for the health gate) the same way.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.core.errors import ExitCode, LlamaforgeError
from llamaforge.core.events import CancelToken
from llamaforge.deploy.hosts.access import as_root
from llamaforge.deploy.release import (
    API_KEY_FILE,
    MODEL_LINK,
    PROBE_LINK,
    RELEASE_JSON,
    SERVICE_USER,
    Layout,
    ReleaseSpec,
)
from llamaforge.runners.ssh import SshProcessRunner
from llamaforge.runners.ssh.transfer import file_sha256

if TYPE_CHECKING:
    from llamaforge.deploy.hosts.prepared import ProbeModel
    from llamaforge.deploy.targets.base import Target

_STATE = r"""
cd "$1" 2>/dev/null || exit 0
link=$(readlink current 2>/dev/null) && echo "current ${link##*/}"
for dir in releases/*/; do [ -f "$dir/release.json" ] && dir=${dir%/} && echo "release ${dir##*/}"; done
[ -f history ] && sed 's/^/history /' history
[ -f current/release.json ] && { printf 'record '; tr -d '\n' < current/release.json; echo; }
exit 0
"""
_SWITCH = r"""
cd "$1" && ln -sfn "releases/$2" .current.tmp && mv -T .current.tmp current \
  && cat > .history.tmp && mv -T .history.tmp history
"""

_WRITE_KEY = r"""
umask 077 && cat > "$1.tmp" && chown "$2:$2" "$1.tmp" && chmod 0600 "$1.tmp" && mv -T "$1.tmp" "$1"
"""

_UNUSED_MODELS = r"""
cd "$1" || exit 1
for model in models/*.gguf; do
  [ -f "$model" ] || continue
  used=
  for link in releases/*/model.gguf releases/.*.tmp/model.gguf releases/*/probe.gguf releases/.*.tmp/probe.gguf; do
    [ "$(readlink "$link" 2>/dev/null)" = "$1/$model" ] && used=1 && break
  done
  [ -n "$used" ] || rm -f -- "$model"
done
"""


@dataclass(frozen=True)
class HostState:
    """A deployment's releases on one host."""

    current: str | None
    releases: tuple[str, ...]
    history: tuple[str, ...]
    record: dict[str, Any] | None  # current's release.json

    def previous(self) -> str | None:
        """The release that was current before ``current`` (the last other one in the history still there)."""
        for rid in reversed(self.history):
            if rid != self.current and rid in self.releases:
                return rid
        return None


def host_state(runner: SshProcessRunner, layout: Layout) -> HostState:
    """Read the deployment's state on the host (one command)."""
    output = runner.run(["sh", "-c", _STATE, "sh", layout.root]).stdout
    current, releases, history, record = None, [], [], None
    for line in output.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "current":
            current = value
        elif kind == "release":
            releases.append(value)
        elif kind == "history" and value:
            history.append(value)
        elif kind == "record":
            record = json.loads(value)
    return HostState(current, tuple(releases), tuple(history), record)


@dataclass(frozen=True)
class Upload:
    """What uploading a release sent: bytes in all, and of those the model's."""

    sent_bytes: int
    model_bytes: int


class HostDiskFull(LlamaforgeError):
    """A host lacks the disk space a release needs; nothing was sent and nothing switched."""

    exit_code = ExitCode.HOST_DISK_FULL


FREE_MARGIN = 16 << 20  # bytes left free beyond what a release needs: logs, the service's own files


def check_free_space(runner: SshProcessRunner, needs: Mapping[str, int]) -> None:
    """Refuse (HostDiskFull) when the file systems of ``needs``' directories lack the bytes asked for there
    (directories on one file system add up), plus :data:`FREE_MARGIN`."""
    wanted = {path: size for path, size in needs.items() if size > 0}
    if not wanted:
        return
    rows = runner.run(["df", "-B1", "--output=target,avail", *wanted]).stdout.splitlines()[1:]
    totals: dict[str, list[Any]] = {}
    for (path, size), row in zip(wanted.items(), rows, strict=True):
        mount, avail = row.split()
        entry = totals.setdefault(mount, [int(avail), 0, []])
        entry[1] += size
        entry[2].append(path)
    for _mount, (avail, size, paths) in totals.items():
        if size + FREE_MARGIN > avail:
            raise HostDiskFull(
                f"{runner.host.address}: {' and '.join(paths)} has {avail / 2**20:.1f} MiB free, the release needs "
                f"{size / 2**20:.1f} MiB (+{FREE_MARGIN >> 20} MiB kept free)",
                hint="free space on the host (or deploy with --keep 1 to prune old releases) and deploy again; "
                "nothing was sent or switched there",
            )


def _exists(runner: SshProcessRunner, path: str) -> bool:
    return runner.run(["test", "-e", path], warn=True).ok


def _write(runner: SshProcessRunner, path: str, text: str) -> None:
    runner.run(["sh", "-c", 'cat > "$1"', "sh", path], stdin=text)


def upload_release(
    runner: SshProcessRunner,
    layout: Layout,
    spec: ReleaseSpec,
    rid: str,
    files: Sequence[tuple[Path, str]],
    service_files: Mapping[str, str],
    record: Mapping[str, Any],
    *,
    api_key: str | None = None,
    probe: ProbeModel | None = None,
    cancel: CancelToken | None = None,
) -> Upload:
    """Put release ``rid`` on the host unless it is already there; returns what was sent. A release that
    listens beyond loopback gets ``api_key`` as its key file; the ``probe`` model goes to ``models/`` too (also
    for a release already there) and a new release links it as ``probe.gguf``."""
    model_path = layout.model(spec.model_sha256)
    target = layout.release(rid)
    # An RPC worker's release has no model: the head sends the tensors.
    has_model = not spec.model_sha256 or _exists(runner, model_path)
    # The probe model is often the release's model too (the default tiny model): sent once.
    needs_probe = (
        probe is not None
        and probe.sha256 != spec.model_sha256
        and not _exists(runner, layout.model(probe.sha256))
    )
    has_release = _exists(runner, posixpath.join(target, RELEASE_JSON))
    release_bytes = 0 if has_release else sum(local.stat().st_size for local, _ in files)
    models_bytes = (0 if has_model else spec.model_size) + (probe.size if probe and needs_probe else 0)
    check_free_space(runner, {layout.models: models_bytes, layout.releases: release_bytes})
    model_bytes = probe_bytes = 0
    if not has_model:
        model_bytes = runner.put(spec.model, model_path, cancel=cancel).sent_bytes
    if probe is not None and needs_probe:
        probe_bytes = runner.put(probe.path, layout.model(probe.sha256), cancel=cancel).sent_bytes
    if has_release:
        return Upload(model_bytes + probe_bytes, model_bytes)
    stage = posixpath.join(layout.releases, f".{rid}.tmp")
    seed = 'rm -rf "$1" && mkdir -p "$1" && { [ -d "$2/bin" ] && cp -al "$2/bin" "$2/lib" "$1/" 2>/dev/null; true; }'
    runner.run(["sh", "-c", seed, "sh", stage, layout.current])
    sent = model_bytes + probe_bytes
    # the files the seed already holds are read in one command, not one per file
    there = runner.sha256s([posixpath.join(stage, relative) for _local, relative in files])
    for local, relative in files:
        remote = posixpath.join(stage, relative)
        if there.get(remote) != file_sha256(local):
            sent += runner.put(local, remote, cancel=cancel).sent_bytes
    for name, text in service_files.items():
        _write(runner, posixpath.join(stage, name), text)
    if spec.model_sha256:
        runner.run(["ln", "-sfn", model_path, posixpath.join(stage, MODEL_LINK)])
    if probe is not None:
        runner.run(["ln", "-sfn", layout.model(probe.sha256), posixpath.join(stage, PROBE_LINK)])
    if spec.api_key:
        if not api_key:
            raise ValueError("a release listening beyond loopback needs its API key")
        write_key = ["sh", "-c", _WRITE_KEY, "sh", posixpath.join(stage, API_KEY_FILE), SERVICE_USER]
        runner.run(
            as_root(runner, write_key), stdin=api_key, what=f"writing the API key on {runner.host.host}"
        )
    _write(runner, posixpath.join(stage, RELEASE_JSON), json.dumps(dict(record), indent=2) + "\n")
    runner.run(["sh", "-c", 'rm -rf "$2" && mv -T "$1" "$2"', "sh", stage, target])
    return Upload(sent, model_bytes)


# The switch and the service's restart as ONE command on the host: it either never arrives (the host stays on
# its release) or runs to its end there, even when the connection drops half-way (hangups and a closed output
# are ignored), so a lost connection never leaves ``current`` on one release and the service on another.
_SWITCH_AND_ACTIVATE = f'trap "" HUP PIPE\n{_SWITCH.strip()} && shift 2 && exec "$@"'


def switch_and_activate(
    runner: SshProcessRunner, layout: Layout, target: Target, rid: str, history: Sequence[str]
) -> None:
    """Point ``current`` at release ``rid`` atomically (a new symlink renamed over it), record ``history`` (its
    last entry is ``rid``), then run the target's activation (install the service files of ``current``,
    restart): one command, which the host finishes even if the connection is lost."""
    activation = as_root(runner, target.activation(layout))
    runner.run(
        ["sh", "-c", _SWITCH_AND_ACTIVATE, "sh", layout.root, rid, *activation],
        stdin="".join(f"{item}\n" for item in history),
        what=f"switching {runner.host.host} to {rid}",
    )


def releases_to_prune(state: HostState, keep: int) -> list[str]:
    """The releases beyond the ``keep`` that were current most recently (``current`` always stays)."""
    kept: list[str] = [state.current] if state.current else []
    for rid in reversed(state.history):
        if len(kept) >= keep:
            break
        if rid not in kept:
            kept.append(rid)
    return [rid for rid in state.releases if rid not in kept]


def prune_releases(
    runner: SshProcessRunner, layout: Layout, target: Target, state: HostState, keep: int
) -> list[str]:
    """Remove :func:`releases_to_prune` from the host with what ``target`` put there for them alone
    (:meth:`~llamaforge.deploy.targets.Target.prune`), then every model no release left links to; returns the
    release ids removed."""
    removed = releases_to_prune(state, keep)
    if removed:
        target.prune(runner, layout, removed)
        runner.run(["sh", "-c", _UNUSED_MODELS, "sh", layout.root])
    return removed


def release_facts(runner: SshProcessRunner, layout: Layout, rid: str) -> tuple[dict[str, Any], int]:
    """Release ``rid``'s ``release.json`` and its model's size on the host."""
    directory = layout.release(rid)
    record = json.loads(runner.run(["cat", posixpath.join(directory, RELEASE_JSON)]).stdout)
    if not record.get("model_sha256"):  # an RPC worker's release
        return record, 0
    size = runner.run(["stat", "-L", "-c", "%s", posixpath.join(directory, MODEL_LINK)]).stdout.strip()
    return record, int(size)


def read_api_key(runner: SshProcessRunner, layout: Layout, rid: str) -> str | None:
    """Release ``rid``'s API key, read as root over SSH (None when the release has none)."""
    path = posixpath.join(layout.release(rid), API_KEY_FILE)
    result = runner.run(as_root(runner, ["cat", path]), warn=True)
    return (result.stdout.strip() or None) if result.ok else None


_WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 - addresses read from the host, nothing is bound here


def parse_listeners(text: str) -> set[tuple[str, int]]:
    """The (address, port) of every listening TCP socket in the text of ``/proc/net/tcp`` and ``/proc/net/tcp6``
    (the kernel writes each address as 32-bit words in host byte order, little-endian on the hosts llamaforge
    deploys to)."""
    found = set()
    for line in text.splitlines():
        fields = line.split()
        # the 4th field is the state, 0A for LISTEN; the header line has none
        if len(fields) < 4 or fields[3] != "0A" or ":" not in fields[1]:
            continue
        address, port = fields[1].split(":")
        if len(address) not in (8, 32):
            continue
        raw = b"".join(bytes.fromhex(address[start : start + 8])[::-1] for start in range(0, len(address), 8))
        ip = ipaddress.ip_address(raw)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        found.add((str(ip), int(port, 16)))
    return found


def port_clash(listeners: set[tuple[str, int]], address: str, port: int) -> str | None:
    """The listener (``address:port``) that would keep a server from binding ``address:port``: one on the same
    port at the same address, or where either is a wildcard; None when the port is free there."""
    for there, taken in sorted(listeners):
        if taken == port and (there == address or there in _WILDCARDS or address in _WILDCARDS):
            return f"[{there}]:{port}" if ":" in there else f"{there}:{port}"
    return None


def busy_port(runner: SshProcessRunner, state: HostState, bound: tuple[str, int]) -> str | None:
    """What already listens where a new release's service would bind (``bound``) on the host, unless it is the
    deployment's own current release on that port (its restart frees it); None when nothing does."""
    address, port = bound
    if state.record and int(state.record.get("port", -1)) == port:
        return None
    shown = runner.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], warn=True).stdout
    return port_clash(parse_listeners(shown), address, port)
