"""A release proven on a host before it is switched on: the host runs the release's ``llama-bench`` as the service
would run it (the target's user, environment and sandbox: :meth:`~llamaforge.deploy.targets.Target.probe_command`)
on a tiny Q4_0 model, a few seconds before ``current`` moves.

The probe model is the tiny qwen3 model in Q4_0 (:data:`PROBE_DTYPE`), written here once; its file is
deterministic, so it goes to the host's content-addressed ``models/`` like a release's model, is sent once per
host and deployment, and each release links it as ``probe.gguf`` (pruning keeps it while a release does). Q4_0
reaches what a float model never does: the CPU's repacked Q4_0 kernels, AMX tiles on CPUs that have them
(``-p 16`` is a batch the AMX path takes), the quantized dot products, and on a GPU build the GPU's kernels.

Why not the release's own model: a host runs its current release while the probe runs, so a second load of a
real model needs its memory twice (VRAM on a GPU host, the repacked CPU weights in RAM) and its load time (tens
of seconds for a large file), where the tiny model needs a few MB and about a second. What the probe proves is
that the binaries, their libraries and the backend modules the loader picks on THIS host run a quantized model;
the health gate proves the model after the switch, and rolls back when it fails.

A crash (a signal, named with the CPU module from the ``load_backend`` line), a missing library or any non-zero
exit refuses the host: nothing is switched there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from llamaforge.core.errors import SmokeFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.exits import crash_hint, crash_words, describe_exit, loaded_cpu_module
from llamaforge.deploy.hosts.access import as_root
from llamaforge.deploy.hosts.prepared import ProbeModel
from llamaforge.deploy.release import SERVICE_USER, ReleaseCannotRun
from llamaforge.serve.launcher import LlamaFlags
from llamaforge.smoke.bench import parse_llama_bench

if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping, Sequence

    from llamaforge.deploy.hosts.prepared import Release
    from llamaforge.deploy.release import Layout
    from llamaforge.deploy.targets.base import Target
    from llamaforge.gguf.tiny.file import DType
    from llamaforge.runners.ssh import SshProcessRunner

PROBE_DTYPE: Final[DType] = "q4_0"
PROBE_BINARY: Final = "llama-bench"
PROBE_PROMPT: Final = 16  # tokens of the pp test: a batch the repacked and AMX kernels take
PROBE_GEN: Final = 4
PROBE_LIMIT_S: Final = 120  # the host's service manager stops a probe that runs longer
_SLACK_S: Final = 30.0  # beyond the limit, for the service manager to report it
PROBE_WAIT_S: Final = PROBE_LIMIT_S + _SLACK_S  # the longest a probe is waited for
TAIL_LINES: Final = 20


def probe_model(reporter: Reporter = null_reporter, cancel: CancelToken | None = None) -> ProbeModel:
    """The probe model, written once under ``home()/models/tiny/`` (the tiny qwen3 smoke model in Q4_0)."""
    from llamaforge.models.tiny import tiny_smoke_model
    from llamaforge.runners.ssh.transfer import file_sha256

    path = tiny_smoke_model(reporter, cancel, dtype=PROBE_DTYPE)
    return ProbeModel(path, file_sha256(path), path.stat().st_size)


def probe_args(model: str, flags: LlamaFlags) -> list[str]:
    """llama-bench's arguments: one short pp and tg test on ``model`` (a path on the host), with the service's
    threads, GPU layers and repack choice, results as JSON on stdout."""
    args = ["-m", model, "-p", str(PROBE_PROMPT), "-n", str(PROBE_GEN), "-r", "1", "-o", "json"]
    if flags.threads:
        args += ["-t", str(flags.threads)]
    if flags.n_gpu_layers is not None:
        args += ["-ngl", str(flags.n_gpu_layers)]
    if not flags.repack:
        args += ["--repack", "0"]
    return args


@dataclass(frozen=True)
class ProbeOutcome:
    """What the probe said on one host: in words, how long it took, its last log lines, and the refusal when the
    release cannot run there."""

    detail: str
    seconds: float
    logs: tuple[str, ...] = ()
    refusal: ReleaseCannotRun | None = None

    @property
    def passed(self) -> bool:
        """Whether the release ran there."""
        return self.refusal is None


def prove(
    runner: SshProcessRunner,
    release: Release,
    reporter: Reporter | None = None,
    cancel: CancelToken | None = None,
) -> ProbeOutcome | None:
    """Run ``release``'s probe on the host (:func:`probe_release`); None when the release has no probe model."""
    if release.probe is None:
        return None
    if reporter is not None:
        reporter(Event("stage", f"probing release on {runner.host.address}", stage="deploy"))
    return probe_release(
        runner,
        release.target,
        release.layout,
        release.id,
        release.service_files,
        release.spec.flags,
        release.probe,
        cancel,
    )


def has_probe_model(runner: SshProcessRunner, release: Release) -> bool:
    """Whether the host has ``release``'s probe model (a release uploaded before probes were made lacks it)."""
    probe = release.probe
    return probe is not None and runner.run(["test", "-e", release.layout.model(probe.sha256)], warn=True).ok


def probe_release(
    runner: SshProcessRunner,
    target: Target,
    layout: Layout,
    rid: str,
    service_files: Mapping[str, str],
    flags: LlamaFlags,
    model: ProbeModel,
    cancel: CancelToken | None = None,
) -> ProbeOutcome:
    """Run release ``rid``'s llama-bench on the host as its service would, on the probe ``model`` (already in the
    host's ``models/``), and say whether it ran; ``current`` is not touched."""
    address = runner.host.address
    command = as_root(
        runner,
        target.probe_command(
            layout,
            rid,
            service_files,
            layout.model(model.sha256),
            probe_args(layout.model(model.sha256), flags),
        ),
    )
    started = time.monotonic()
    result = runner.run(
        command,
        warn=True,
        timeout_s=PROBE_WAIT_S,
        cancel=cancel,
        what=f"{PROBE_BINARY} of release {rid} on {runner.host.host}",
    )
    seconds = time.monotonic() - started
    logs = result.stderr.splitlines()
    return judge_probe(
        f"{address}: release {rid} cannot run there",
        target.probe_signal(result.exit_code, logs),
        result.exit_code,
        result.stdout,
        logs,
        seconds,
        timed_out=result.timed_out,
    )


def judge_probe(
    where: str,
    sig: signal.Signals | None,
    exit_code: int,
    stdout: str,
    logs: Sequence[str],
    seconds: float,
    *,
    timed_out: bool = False,
    user: str = SERVICE_USER,
) -> ProbeOutcome:
    """What a probe's llama-bench said: ended by ``sig``, or with ``exit_code`` (-1: it never started), its JSON
    on ``stdout`` and its log ``logs``, run as ``user``; a refusal starts with ``where``."""
    tail = list(logs[-TAIL_LINES:])
    module = loaded_cpu_module(logs)
    refusal = None
    if sig is not None:
        said = crash_words(PROBE_BINARY, sig, module, when=f"as {user} on the Q4_0 probe model")
        refusal = ReleaseCannotRun(f"{where}: {said}", hint=crash_hint(sig, module), logs=tail)
    elif timed_out or exit_code != 0:
        how = f"ran past {PROBE_LIMIT_S} s" if timed_out else _ended(exit_code)
        last = _last_words(logs)
        refusal = ReleaseCannotRun(
            f"{where}: {PROBE_BINARY} {how} as {user} on the Q4_0 probe model"
            + (f": {last}" if last else ""),
            hint="the lines below are its log; a missing library means the release lacks it (`ldd` of the build's "
            "binaries there), a library's version 'not found' means the release carries a library of a newer "
            "system than the host's, a start failure names the service manager's complaint",
            logs=tail,
        )
    else:
        try:
            bench = parse_llama_bench(stdout)
        except SmokeFailed as failed:
            refusal = ReleaseCannotRun(
                f"{where}: {PROBE_BINARY} exited 0 but {failed.message}", hint=failed.hint, logs=tail
            )
    if refusal is not None:
        return ProbeOutcome(refusal.render(), seconds, tuple(tail), refusal)
    figures = ", ".join(f"{test.name} {test.avg_ts:.0f} t/s" for test in bench.tests)
    loaded = f", {module}" if module else ""
    detail = f"{PROBE_BINARY} ran as {user}: {figures} ({bench.backends or 'CPU'}{loaded}) in {seconds:.1f} s"
    return ProbeOutcome(detail, seconds, tuple(tail))


def _ended(code: int) -> str:
    return "could not start" if code == -1 else f"ended with {describe_exit(code)}"


_LOADER_WORDS: Final = (
    "error while loading shared libraries",
    "cannot open shared object",
    "' not found (required by",
)


def _last_words(lines: Sequence[str]) -> str:
    """The line that says most: the dynamic loader's complaint (a library missing, or one too new for the host's
    C library: "version `GLIBC_2.38' not found"), else the last error line."""
    for line in reversed(lines):
        if any(words in line for words in _LOADER_WORDS):
            return line.strip()
    for line in reversed(lines):
        lowered = line.lower()
        if "error" in lowered or "failed" in lowered:
            return line.strip()
    return ""
