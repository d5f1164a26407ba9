"""The CPU module sweep: every CPU backend module of a build run on its own on this host, with llama-bench.

Per module it says whether this CPU can load it, whether it crashed (and with which signal), and its pp/tg
tokens/s; and which module ggml's loader picks when all are there. That table is what a build needs to show before
it is trusted on a new machine: the loader's default pick is only one of them, and a module that faults on a
quantized kernel fails only the models that reach that kernel.

How one module is isolated (ggml/src/ggml-backend-reg.cpp, b11312): ``ggml_backend_load_best`` lists the
``libggml-cpu-*.so`` of the executable's directory (``/proc/self/exe``, symlinks resolved) and of the current
directory, and loads the one whose ``ggml_backend_score()`` is highest (0: not for this CPU).
``GGML_BACKEND_PATH`` loads one more backend after that search, so on its own it keeps no module out. Each run
therefore gets a directory of its own, holding a hard link (or a copy) of llama-bench and symlinks to every
library of ``bin/`` but ggml's backend modules (a GPU backend would take the work away from the CPU); it runs
there and names its module in ``GGML_BACKEND_PATH``. ggml loads that path with ``load_backend(path,
silent=false)``, which says in its own words when the module is not for this CPU ("is not supported on this
system"), words that a release build's silent directory search never prints.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from llamaforge.core.errors import SmokeFailed, ToolFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.exits import cpu_variant, crash_hint, describe_exit, exit_signal, loaded_cpu_module
from llamaforge.core.paths import home
from llamaforge.runners.process import LOCAL, ProcessResult, ProcessRunner
from llamaforge.smoke.bench import bench_command, parse_llama_bench
from llamaforge.smoke.cpu_features import VARIANT_FEATURES, host_cpu
from llamaforge.smoke.report import cpu_modules_lines, fresh_directory

ModuleStatus = Literal["ran", "not_for_this_cpu", "crashed", "failed", "timed_out"]

#: The statuses that fail a sweep. A module this CPU does not load is not one of them.
FAILED: Final[frozenset[str]] = frozenset({"crashed", "failed", "timed_out"})
#: Each status in words.
STATUS_WORDS: Final[dict[str, str]] = {
    "ran": "ran",
    "not_for_this_cpu": "not for this CPU",
    "crashed": "crashed",
    "failed": "failed",
    "timed_out": "timed out",
}

_MODULE_GLOB = "libggml-cpu-*.so"
# A backend module ggml loads at run time: libggml-cpu-haswell.so, libggml-cuda.so (not libggml-base.so.0).
_BACKEND_MODULE = re.compile(r"^libggml-(?!base\.).+\.so$")
_NOT_SUPPORTED = "is not supported on this system"  # ggml's load_backend, for a module whose score is 0
_LOAD_FAILED = "failed to load"  # ggml's load_backend, for a module the dynamic loader refused


@dataclass(frozen=True)
class SweepOptions:
    """How much each module runs: a few tokens, once (a sweep of 14 modules stays under a minute)."""

    pp: int = 16
    tg: int = 8
    repetitions: int = 1
    threads: int | None = None  # None: llama.cpp's default
    timeout_s: float = 300.0


def cpu_modules(bin_dir: Path) -> list[Path]:
    """The CPU backend modules of a build's binaries directory (``libggml-cpu-<variant>.so``), by name; none for
    a build of one CPU level (ggml-cpu linked in, or one ``libggml-cpu.so``)."""
    return sorted(path for path in bin_dir.glob(_MODULE_GLOB) if path.is_file())


def stage_module_dir(bench: Path, into: Path) -> Path:
    """Make ``into``: llama-bench hard-linked (copied across file systems) and a symlink to every library beside
    it except ggml's backend modules (``libggml-<name>.so``: the CPU modules, and GPU or BLAS backends, which
    would take work away from the CPU module), so ggml's loader finds none there. Returns the llama-bench to run."""
    into.mkdir(parents=True)
    exe = into / bench.name
    try:
        os.link(bench.resolve(), exe)
    except OSError:  # another file system, or hard links refused
        shutil.copy2(bench.resolve(), exe)
    for entry in sorted(bench.parent.iterdir()):
        if entry.name != bench.name and ".so" in entry.name and not _BACKEND_MODULE.match(entry.name):
            (into / entry.name).symlink_to(entry.absolute())
    return exe


def _host_cpu(runner: ProcessRunner) -> dict[str, Any]:
    model, features = host_cpu(runner.run(["cat", "/proc/cpuinfo"], warn=True).stdout)
    return {"model": model, "features": features}


def _missing(variant: str, host_features: Sequence[str]) -> list[str]:
    return [feature for feature in VARIANT_FEATURES.get(variant, ()) if feature not in host_features]


def _last_words(result: ProcessResult) -> str:
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else describe_exit(result.exit_code)


def _outcome(result: ProcessResult, module: Path) -> dict[str, Any]:
    """What one module's run says: its status, the signal and hint of a crash, its tokens/s."""
    text = result.stdout + result.stderr
    loaded = loaded_cpu_module(text.splitlines()) == module.name
    sig = None if result.timed_out else exit_signal(result.exit_code)
    outcome: dict[str, Any] = {
        "loaded": loaded,
        "signal": sig.name if sig else None,
        "exit": describe_exit(result.exit_code),
        "pp_tps": None,
        "tg_tps": None,
        "hint": None,
    }
    if result.timed_out:
        return {
            **outcome,
            "status": "timed_out",
            "exit": "timed out (killed)",
            "detail": "llama-bench did not finish in time; give fewer tokens or more time",
        }
    if sig is not None:
        phase = "after loading it" if loaded else "while loading it"
        return {
            **outcome,
            "status": "crashed",
            "hint": crash_hint(sig, module.name),
            "detail": f"{describe_exit(result.exit_code)} {phase}",
        }
    if _NOT_SUPPORTED in text:
        return {
            **outcome,
            "status": "not_for_this_cpu",
            "detail": "ggml's score for this CPU is 0: it needs instructions this CPU lacks",
        }
    if result.exit_code != 0:
        reason = next((line for line in text.splitlines() if _LOAD_FAILED in line), None)
        return {**outcome, "status": "failed", "detail": reason or _last_words(result)}
    try:
        bench = parse_llama_bench(result.stdout)
    except SmokeFailed as error:
        return {**outcome, "status": "failed", "detail": error.message}
    pp, tg = bench.test("pp"), bench.test("tg")
    threads = f"{bench.n_threads} thread{'s' if bench.n_threads != 1 else ''}" if bench.n_threads else ""
    return {
        **outcome,
        "status": "ran",
        "pp_tps": pp.avg_ts if pp else None,
        "tg_tps": tg.avg_ts if tg else None,
        "detail": threads,
    }


def _run_module(
    module: Path,
    bench: Path,
    model: Path,
    options: SweepOptions,
    staging: Path,
    logs: Path,
    cancel: CancelToken,
    runner: ProcessRunner,
) -> dict[str, Any]:
    variant = cpu_variant(module.name) or module.name
    exe = stage_module_dir(bench, staging / variant)
    log = logs / f"{variant}.log"
    command = bench_command(
        exe, model, pp=options.pp, tg=options.tg, repetitions=options.repetitions, threads=options.threads
    )
    started = time.monotonic()
    try:
        result = runner.run(
            command,
            env={"GGML_BACKEND_PATH": str(module.absolute())},
            cwd=exe.parent,
            timeout_s=options.timeout_s,
            cancel=cancel,
            warn=True,
            log_path=log,
            what=f"llama-bench with {module.name}",
        )
    except ToolFailed as error:  # it could not even start
        outcome = {
            "loaded": False,
            "signal": None,
            "exit": describe_exit(error.returncode),
            "pp_tps": None,
            "tg_tps": None,
            "hint": error.hint,
            "status": "failed",
            "detail": error.message,
        }
    else:
        outcome = _outcome(result, module)
    return {
        "module": module.name,
        "variant": variant,
        **outcome,
        "log": str(log),
        "wall_s": round(time.monotonic() - started, 2),
    }


def _default_pick(
    bench: Path, cwd: Path, logs: Path, cancel: CancelToken, runner: ProcessRunner
) -> dict[str, Any]:
    """The module ggml's loader picks with every module present: ``llama-bench --list-devices`` loads the
    backends (and initialises the CPU one) and exits, without a model."""
    log = logs / "default.log"
    result = runner.run(
        [str(bench), "--list-devices"],
        cwd=cwd,
        timeout_s=120,
        cancel=cancel,
        warn=True,
        log_path=log,
        what="llama-bench --list-devices",
    )
    module = loaded_cpu_module((result.stdout + result.stderr).splitlines())
    sig = None if result.timed_out else exit_signal(result.exit_code)
    if sig is not None:
        detail = f"the loader's pick was {describe_exit(result.exit_code)} while loading it"
    elif module is None:
        detail = f"no CPU module was loaded ({_last_words(result)})"
    else:
        detail = "what every llama.cpp binary of this build loads on this CPU"
    return {
        "module": module,
        "variant": cpu_variant(module) if module else None,
        "exit": describe_exit(result.exit_code),
        "signal": sig.name if sig else None,
        "detail": detail,
        "hint": crash_hint(sig, module),
        "log": str(log),
    }


def _summary(rows: Sequence[Mapping[str, Any]], default: Mapping[str, Any] | None) -> tuple[list[str], str]:
    problems = [
        f"{row['module']}: {STATUS_WORDS[row['status']]} ({row['detail']})"
        for row in rows
        if row["status"] in FAILED
    ]
    if default is not None and default["signal"]:
        problems.append(f"the loader's default pick: {default['detail']}")
    counts = {status: sum(row["status"] == status for row in rows) for status in STATUS_WORDS}
    parts = [f"{count} {STATUS_WORDS[status]}" for status, count in counts.items() if count]
    pick = f"; the loader picks {default['module']}" if default and default["module"] else ""
    return problems, f"{len(rows)} CPU modules: {', '.join(parts)}{pick}"


def sweep_cpu_modules(
    bench: Path,
    model: Path,
    logs: Path,
    options: SweepOptions = SweepOptions(),
    *,
    cpu_level: str | None = None,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> dict[str, Any]:
    """Run llama-bench on ``model`` with each CPU module beside ``bench``, one at a time, then once with all of
    them for the loader's pick; per-module logs go to ``logs``. A crash in one module ends that run only.

    The module directories are made on this host, so ``runner`` must run here (it is a seam for tests)."""
    cancel = cancel or CancelToken()
    started = time.monotonic()
    modules = cpu_modules(bench.parent)
    sweep: dict[str, Any] = {
        "bin_dir": str(bench.parent),
        "model": str(model),
        "cpu": None,
        "modules": [],
        "default": None,
        "options": {
            "pp": options.pp,
            "tg": options.tg,
            "repetitions": options.repetitions,
            "threads": options.threads,
        },
        "note": None,
        "problems": [],
        "passed": True,
        "summary": "",
        "logs": str(logs),
        "wall_s": 0.0,
    }
    if not modules:
        level = f" ({cpu_level})" if cpu_level else ""
        sweep["note"] = (
            f"this build has one CPU level{level}: no libggml-cpu-*.so modules in {bench.parent}, so there is "
            'nothing to sweep; a cpu = "variants" build has one module per CPU family'
        )
        sweep["summary"] = "no CPU modules: a build of one CPU level"
        return sweep
    logs.mkdir(parents=True, exist_ok=True)
    sweep["cpu"] = _host_cpu(runner)
    staging = Path(tempfile.mkdtemp(prefix=".cpu-modules-", dir=logs))
    try:
        for index, module in enumerate(modules):
            cancel.raise_if_cancelled()
            reporter(
                Event(
                    "progress",
                    f"CPU module {module.name}",
                    stage="cpu-modules",
                    completed=index,
                    total=len(modules),
                )
            )
            row = _run_module(module, bench, model, options, staging, logs, cancel, runner)
            row["missing"] = _missing(row["variant"], sweep["cpu"]["features"])
            row["outcome"] = _outcome_words(row)
            sweep["modules"].append(row)
            reporter(Event("info", _row_line(row), stage="cpu-modules"))
        reporter(
            Event(
                "progress",
                "the loader's default pick",
                stage="cpu-modules",
                completed=len(modules),
                total=len(modules),
            )
        )
        sweep["default"] = _default_pick(bench, staging, logs, cancel, runner)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for row in sweep["modules"]:
        row["default"] = row["module"] == sweep["default"]["module"]
    sweep["problems"], sweep["summary"] = _summary(sweep["modules"], sweep["default"])
    sweep["passed"] = not sweep["problems"]
    sweep["wall_s"] = round(time.monotonic() - started, 2)
    return sweep


def _outcome_words(row: Mapping[str, Any]) -> str:
    """``ran``, ``not for this CPU (lacks AMX_INT8)``, ``crashed: killed by SIGILL (illegal instruction)``."""
    if row["signal"]:
        return f"crashed: {row['exit']}"
    if row["status"] == "not_for_this_cpu" and row["missing"]:
        return f"not for this CPU (lacks {', '.join(row['missing'])})"
    return STATUS_WORDS[row["status"]]


def _row_line(row: Mapping[str, Any]) -> str:
    if row["status"] == "ran":
        return f"{row['module']}: pp {row['pp_tps'] or 0:.1f} t/s, tg {row['tg_tps'] or 0:.1f} t/s"
    return f"{row['module']}: {STATUS_WORDS[row['status']]} ({row['detail']})"


def new_sweep_dir(build_key: str) -> Path:
    """A fresh ``smoke/cpu-modules/<UTC time>-<build key prefix>/`` for a sweep's logs and files."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return fresh_directory(home() / "smoke" / "cpu-modules", f"{stamp}-{build_key[:8]}", "CPU module sweep")


def write_sweep_files(sweep: Mapping[str, Any], directory: Path) -> dict[str, str]:
    """Write summary.md (the table) and sweep.json into ``directory``; returns name -> path."""
    files = {name: str(directory / name) for name in ("sweep.json", "summary.md")}
    title = f"# CPU modules of build {sweep.get('build_key', '')[:12]} with {sweep.get('model_label', '')}"
    (directory / "summary.md").write_text(
        "\n".join([title, "", *cpu_modules_lines(sweep)]) + "\n", encoding="utf-8"
    )
    (directory / "sweep.json").write_text(
        json.dumps({**sweep, "files": files}, indent=2) + "\n", encoding="utf-8"
    )
    return files
