"""llama.cpp's own figures: load a model in a real llama-server and read the buffers it reports, to compare
with a plan (:mod:`llamaforge.serve.fit`) field by field."""

from __future__ import annotations

import tempfile
from pathlib import Path

from llamaforge.core.errors import ToolFailed
from llamaforge.runners.process import LOCAL, ProcessRunner
from llamaforge.serve.launcher import LlamaFlags, LlamaServer, ServerLaunch
from llamaforge.serve.loadlog import LoadLog, parse_load_log
from llamaforge.serve.memory import N_BATCH, Settings


def measure_with_llamacpp(
    llama_server: Path,
    model: Path,
    settings: Settings,
    *,
    timeout_s: float = 120.0,
    threads: int = 1,
    runner: ProcessRunner = LOCAL,
    fit_projection: bool = False,
) -> LoadLog:
    """Load ``model`` in ``llama_server`` with ``settings`` and return the buffers it reports (CPU builds
    report everything as host buffers). The server is stopped as soon as it serves the model. With
    ``fit_projection`` llama.cpp's ``--fit`` runs first and its projection is in the result
    (:attr:`~llamaforge.serve.loadlog.LoadLog.projection`; it changes nothing when the model fits).
    ``settings.cpu_buffers == "plain"`` runs it with ``--no-repack``; any other value lets the CPU module
    choose its extra buffer types, so the figures are those of this host's CPU."""
    flags = LlamaFlags(
        ctx=settings.ctx * settings.parallel,
        parallel=settings.parallel,
        cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v,
        flash_attn="on" if settings.flash_attn else "off",
        ubatch=settings.ubatch,
        batch=max(N_BATCH, settings.ubatch),
        threads=threads,
        fit="on" if fit_projection else "off",
        warmup=False,
        kv_unified=settings.kv_unified,
        swa_full=settings.swa_full,
        log_verbosity=4,
        repack=settings.cpu_buffers != "plain",
    )
    with tempfile.TemporaryDirectory(prefix="llamaforge-fit-") as scratch:
        launch = ServerLaunch(
            llama_server, model, flags, Path(scratch) / "server.log", load_timeout_s=timeout_s
        )
        with LlamaServer(launch, runner=runner) as server:
            lines = server.load_log
    reported = parse_load_log(lines)
    if not reported.buffers.get("compute"):
        raise ToolFailed(
            f"llama-server did not report its buffers loading {model.name}",
            command=server.command,
            returncode=0,
            tail=lines[-15:],
        )
    return reported
