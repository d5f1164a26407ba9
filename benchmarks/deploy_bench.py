"""Deploy benchmarks on three real systemd + sshd test hosts (tests/testhosts.py), side by side in one run.

D1: a changed-release rollout (new flags: release files seeded and checked by sha256, unit, switch, restart,
    health gate) ÷ the same release files sent with plain `scp` plus a `systemctl restart`, same hosts, same
    order (one host, then the other two); rounds interleaved so machine drift hits both sides (goal <= 1.2).
    Also printed: the same ÷ scp + restart + waiting until `/health` answers 200 on each host (polled over
    ssh with bash's /dev/tcp), what an operator who checks the service is up pays; our gate adds a real
    completion on top.
D2: deploying the release that is already current (a no-op): wall time, median (goal <= 2 s).
D3: model bytes sent when only the flags change (goal 0).
D4: what the probe adds: the same changed-release rollout with the probe (each host runs the release's llama-bench
    as the service user on the tiny Q4_0 model before its switch) and with --no-probe, rounds interleaved; and
    each host's probe seconds.

Needs Docker, the base image (`invoke images.bootstrap`), a CPU build in LLAMAFORGE_HOME and llama.cpp's
models/ggml-vocab-qwen2.gguf (LLAMAFORGE_TEST_VOCAB). Usage: python benchmarks/deploy_bench.py [--rounds 3]
[--build KEY]   (about two minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llamaforge.build.images import DEFAULT_TAG  # noqa: E402
from llamaforge.build.store import find_build, list_builds  # noqa: E402
from llamaforge.core.registry import OperationContext, operations  # noqa: E402
from llamaforge.deploy.release import DEFAULT_PORT, ReleaseSpec, release_files  # noqa: E402
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from llamaforge.runners.engine import docker_client  # noqa: E402
from testhosts import USER, ensure_image, make_client_key, remove_hosts, start_hosts, write_known_hosts  # noqa: E402

NAME = "bench"


def deploy(**arguments: Any) -> Any:
    op = operations()["deploy"]
    return op.run(op.params(**arguments), OperationContext())


# Polls llama-server's /health on the host's loopback until it answers 200 (60 s at most), with bash alone.
WAIT_HEALTHY = (
    "for _ in $(seq 600); do if { exec 3<>/dev/tcp/127.0.0.1/PORT; } 2>/dev/null; then "
    "printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3; read -r line <&3; exec 3>&-; "
    "case $line in *' 200 '*) exit 0;; esac; fi; sleep 0.1; done; exit 1"
)


def scp_and_restart(
    hosts: list[Any], key: Path, known: Path, files: list[tuple[Path, str]], *, wait_port: int | None = None
) -> float:
    """The plain way: scp the release's files to each host, then restart the unit; one host, then two. With
    ``wait_port``, each host's step ends only when its /health answers 200."""
    options = [
        "-i",
        str(key),
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
    ]
    target = f"/home/{USER}/{NAME}-scp"
    started = time.monotonic()

    def one(host: Any) -> subprocess.Popen[bytes]:
        ssh = shlex.join(["ssh", *options, "-p", str(host.port), f"{USER}@127.0.0.1"])
        steps = [f"{ssh} 'mkdir -p {target}/bin {target}/lib'"]
        for folder in ("bin", "lib"):
            sources = [str(path) for path, relative in files if relative.startswith(f"{folder}/")]
            if sources:
                scp = [
                    "scp",
                    "-q",
                    *options,
                    "-P",
                    str(host.port),
                    *sources,
                    f"{USER}@127.0.0.1:{target}/{folder}/",
                ]
                steps.append(shlex.join(scp))
        steps.append(f"{ssh} 'sudo systemctl restart llamaforge-{NAME}.service'")
        if wait_port is not None:
            steps.append(
                f"{ssh} {shlex.quote(shlex.join(['bash', '-c', WAIT_HEALTHY.replace('PORT', str(wait_port))]))}"
            )
        return subprocess.Popen(["sh", "-c", " && ".join(steps)])

    for group in ([hosts[0]], hosts[1:]):
        running = [one(host) for host in group]
        if any(process.wait() != 0 for process in running):
            sys.exit("scp baseline failed")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--build", help="build key (default: the newest CPU build in LLAMAFORGE_HOME)")
    args = parser.parse_args()
    build = (
        str(find_build(args.build)["key"])
        if args.build
        else next(str(b["key"]) for b in list_builds() if "cuda" not in str(b.get("backend", "cpu")))
    )  # a unique prefix of a key will do
    vocab = Path(os.environ.get("LLAMAFORGE_TEST_VOCAB", ""))
    if not vocab.is_file():
        sys.exit("set LLAMAFORGE_TEST_VOCAB to llama.cpp's models/ggml-vocab-qwen2.gguf")
    work = Path(tempfile.mkdtemp(prefix="llamaforge-deploy-bench-"))
    os.environ["HOME"] = str(work)  # never this machine's ~/.ssh/known_hosts
    model = write_tiny_model(work / "tiny.gguf", TinyModelSpec(arch="qwen3"), vocab).path
    key = make_client_key(work)
    hosts = start_hosts(docker_client(), ensure_image(DEFAULT_TAG), key, 3)
    try:
        known = write_known_hosts(work / "known_hosts", hosts)
        base = {
            "hosts": ",".join(f"{USER}@127.0.0.1:{host.port}" for host in hosts),
            "ssh_key": str(key),
            "known_hosts": str(known),
            "name": NAME,
            "build": build,
            "model": str(model),
            "batch": 2,
        }
        first = deploy(**base)  # the model and a first release on every host
        from llamaforge.build.store import build_dir

        files = release_files(ReleaseSpec(build, build_dir(build), "", model, "", 0))
        ours, plain, waited, unprobed, probes, model_bytes = [], [], [], [], [], 0
        for index in range(args.rounds):
            started = time.monotonic()
            changed = deploy(**base, ctx=1024 + 256 * index)
            ours.append(time.monotonic() - started)
            model_bytes += sum(host.model_bytes for host in changed.hosts)
            probes += [host.probe_s for host in changed.hosts if host.probe_s is not None]
            plain.append(scp_and_restart(hosts, key, known, files))
            waited.append(scp_and_restart(hosts, key, known, files, wait_port=DEFAULT_PORT))
            started = time.monotonic()
            deploy(**base, ctx=1024 + 256 * index + 128, probe=False)  # a changed release too
            unprobed.append(time.monotonic() - started)
        deploy(**base, ctx=1024 + 256 * (args.rounds - 1))  # the last release current again, healthy
        noop = []
        for _ in range(5):
            started = time.monotonic()
            report = deploy(**base, ctx=1024 + 256 * (args.rounds - 1))
            noop.append(time.monotonic() - started)
            assert [host.status for host in report.hosts] == ["unchanged"] * 3
    finally:
        remove_hosts(hosts)
    ratio = statistics.median(ours) / statistics.median(plain)
    size = sum(path.stat().st_size for path, _ in files) / 2**20
    print(f"first deploy (model + {size:.1f} MiB of release files to 3 hosts): {first.wall_s:.1f} s")
    print(
        f"D1 changed release: llamaforge {statistics.median(ours):.2f} s (runs {[round(v, 2) for v in ours]}) / "
        f"scp + restart {statistics.median(plain):.2f} s (runs {[round(v, 2) for v in plain]}) = {ratio:.2f}"
        f" (goal <= 1.2)"
    )
    healthy = statistics.median(ours) / statistics.median(waited)
    print(
        f"D1 beside scp + restart + waiting for /health 200: {statistics.median(waited):.2f} s (runs "
        f"{[round(v, 2) for v in waited]}) = {healthy:.2f}"
    )
    print(
        f"D2 already-current no-op: median {statistics.median(noop):.2f} s (runs {[round(v, 2) for v in noop]})"
        " (goal <= 2 s)"
    )
    print(f"D3 model bytes sent over {args.rounds} flag-only rollouts: {model_bytes} (goal 0)")
    added = statistics.median(ours) - statistics.median(unprobed)
    print(
        f"D4 the probe: rollout {statistics.median(ours):.2f} s with it, {statistics.median(unprobed):.2f} s with "
        f"--no-probe (runs {[round(v, 2) for v in unprobed]}): +{added:.2f} s; each host's probe median "
        f"{statistics.median(probes):.2f} s (runs {[round(v, 2) for v in probes]})"
    )


if __name__ == "__main__":
    main()
