"""How a program ended, said the way a person needs it: "killed by SIGILL (illegal instruction)", never
"exit code: -4"; the llama.cpp CPU module that was loaded when it crashed; a next step that fits the signal.

Every front and domain that reports a llama.cpp binary's end goes through :func:`describe_exit` and
:func:`crash_hint`, so smoke, ``models.verify --load-check``, the deploy gate and the RPC worker gate say the
same thing. Exit statuses come in three shapes: a negative code from a local ``Popen`` (``-4``), ``128 + N``
from a shell that ran the program (``132``; only when the caller knows a shell reported it) and systemd's
``code=killed, status=4/ILL``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from typing import Final

#: What each signal a crashing program gets means, in words.
SIGNAL_MEANINGS: Final[dict[signal.Signals, str]] = {
    signal.SIGILL: "illegal instruction",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "arithmetic error",
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
    signal.SIGINT: "interrupted",
    signal.SIGSYS: "bad system call",
    signal.SIGTRAP: "trap",
}

# ggml's loader: "load_backend: loaded CPU backend from /opt/llama/bin/libggml-cpu-haswell.so".
_LOADED_BACKEND = re.compile(r"load_backend: loaded (?P<kind>\S+) backend from (?P<path>\S+)")
_MODULE_NAME = re.compile(r"libggml-cpu-(?P<variant>[A-Za-z0-9_.-]+?)\.(so|dll|dylib)$")
# systemd: "Main process exited, code=killed, status=4/ILL", "code=dumped, status=11/SEGV" or, for a program that
# exited on its own, "code=exited, status=1/FAILURE"; systemd-run --wait: "code=killed/status=ILL".
_SYSTEMD_EXITED = re.compile(
    r"code=(?P<code>exited|killed|dumped)(, |/)status=((?P<number>\d+)|(?P<name>[A-Z0-9]+))"
)
# systemctl show's ExecMainCode: CLD_EXITED, CLD_KILLED, CLD_DUMPED (ExecMainStatus is then the signal).
_CLD_SIGNALLED = ("2", "3")


def exit_signal(code: int | None, *, shell: bool = False) -> signal.Signals | None:
    """The signal that ended a program with exit status ``code``: a negative code is ``-N``; with ``shell``
    (the status came from a shell or another reporter that says ``128 + N``), 129 to 192 count too."""
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if shell and 128 < code <= 192 else 0
    return _signal(number) if number else None


def signal_words(sig: signal.Signals) -> str:
    """``SIGILL (illegal instruction)``."""
    meaning = SIGNAL_MEANINGS.get(sig)
    return f"{sig.name} ({meaning})" if meaning else sig.name


def describe_exit(code: int | None, *, shell: bool = False) -> str:
    """``killed by SIGILL (illegal instruction)`` for a program a signal ended, else ``exit code N``."""
    sig = exit_signal(code, shell=shell)
    if sig is not None:
        return f"killed by {signal_words(sig)}"
    return "no exit status (the connection or the process was lost)" if code is None else f"exit code {code}"


def systemd_signal(lines: Iterable[str]) -> signal.Signals | None:
    """The signal that ended a unit's main process the last time, from the lines systemd wrote for it: the last
    ``code=killed`` / ``code=dumped`` line names it; None when there is none, or when the main process exited on
    its own after it (``code=exited``)."""
    found: signal.Signals | None = None
    for line in lines:
        match = _SYSTEMD_EXITED.search(line)
        if match:
            found = None if match["code"] == "exited" else _named_signal(match["number"], match["name"])
    return found


def systemd_crash(lines: Sequence[str]) -> tuple[signal.Signals | None, str | None]:
    """From a unit's journal: the signal that ended its main process the last time (:func:`systemd_signal`)
    and the CPU module that run had loaded (the last ``load_backend`` line before systemd's exit line)."""
    exits = [index for index, line in enumerate(lines) if _SYSTEMD_EXITED.search(line)]
    if not exits:
        return None, None
    return systemd_signal(lines), loaded_cpu_module(lines[: exits[-1]])


def exec_main_signal(code: str, status: str) -> signal.Signals | None:
    """The signal that ended a unit's main process, from ``systemctl show``'s ``ExecMainCode`` and
    ``ExecMainStatus`` (e.g. ``2`` and ``4``: killed by SIGILL); None when it exited or still runs."""
    return _signal(int(status)) if code in _CLD_SIGNALLED and status.isdigit() else None


def _named_signal(number: str | None, name: str | None) -> signal.Signals | None:
    if number:
        return _signal(int(number))
    return signal.Signals.__members__.get(f"SIG{name}")


def _signal(number: int) -> signal.Signals | None:
    try:
        return signal.Signals(number)
    except ValueError:
        return None


def loaded_backend_path(lines: Iterable[str]) -> str | None:
    """The path of the CPU backend module ggml's loader loaded (the last one named in ``lines``); None for a
    build with the CPU backend linked in."""
    found: str | None = None
    for line in lines:
        match = _LOADED_BACKEND.search(line)
        if match and match["kind"] == "CPU":
            found = match["path"]
    return found


def loaded_cpu_module(lines: Iterable[str]) -> str | None:
    """The file name of the CPU backend module ggml's loader loaded (the last one named in ``lines``), e.g.
    ``libggml-cpu-sapphirerapids.so``; None for a build with the CPU backend linked in."""
    path = loaded_backend_path(lines)
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else None


def cpu_variant(module: str) -> str | None:
    """``sapphirerapids`` for ``libggml-cpu-sapphirerapids.so``."""
    match = _MODULE_NAME.search(module)
    return match["variant"] if match else None


def crash_words(program: str, sig: signal.Signals, module: str | None, *, when: str = "") -> str:
    """``llama-server was killed by SIGILL (illegal instruction) before it was ready, with
    libggml-cpu-haswell.so loaded``: the program, the signal, ``when`` it happened and the CPU module it ran."""
    words = f"{program} was killed by {signal_words(sig)}" + (f" {when}" if when else "")
    if module:
        words += f"{',' if when else ''} with {module} loaded"
    return words


def crash_hint(sig: signal.Signals | None, module: str | None) -> str | None:
    """A next step that fits a llama.cpp binary killed by ``sig`` with the CPU ``module`` loaded; None when no
    signal ended it."""
    if sig is None:
        return None
    loaded = f"the CPU module {module}" if module else "the CPU code of this build"
    if sig == signal.SIGILL:
        return (
            f"{loaded} ran an instruction this CPU cannot: `invoke smoke.cpu-modules` runs every CPU module of "
            "the build here and names the ones that crash; build one CPU level this CPU has (`--cpu x86-64-v3`, "
            "`--cpu native`), or keep weights out of the repacked/AMX buffers (`--repack 0` for llama-bench, "
            "`--no-repack` for llama-server) to tell whether those kernels are at fault"
        )
    if sig == signal.SIGABRT:
        return (
            "llama.cpp stopped on a failed check (a GGML_ASSERT or an abort): the last lines of its log name it; "
            "`--no-repack` tells whether the CPU's extra buffer types (repack/AMX) are involved"
        )
    if sig in (signal.SIGSEGV, signal.SIGBUS):
        return (
            f"{loaded} touched memory it may not: a model file changed or truncated while mapped, not enough "
            "memory, or a kernel bug; `invoke smoke.cpu-modules` tells whether one CPU module is at fault"
        )
    if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        return (
            "something stopped it from outside: the kernel's out-of-memory killer (see `dmesg`) or a person"
        )
    return f"{loaded} crashed; the last lines of its log say how far it came"
