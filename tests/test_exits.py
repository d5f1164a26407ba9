"""How a program's end is told (core/exits.py): signals in words, systemd's lines, ggml's CPU module, the hint.

The parsers read the lines real programs write: systemd's "Main process exited" lines as the journal keeps
them, ggml's load_backend line as llama.cpp b11312 prints it. The end-to-end checks (a real llama-bench,
llama-server and llama-cli killed by SIGILL) are in test_crashes.py.
"""

from __future__ import annotations

import signal

import pytest

from llamaforge.core.errors import ToolFailed
from llamaforge.core.exits import (
    cpu_variant,
    crash_hint,
    crash_words,
    describe_exit,
    exec_main_signal,
    exit_signal,
    loaded_cpu_module,
    systemd_crash,
    systemd_signal,
)

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    ("code", "shell", "words"),
    [
        (-4, False, "killed by SIGILL (illegal instruction)"),
        (-11, False, "killed by SIGSEGV (segmentation fault)"),
        (-7, False, "killed by SIGBUS (bus error)"),
        (-6, False, "killed by SIGABRT (aborted)"),
        (132, True, "killed by SIGILL (illegal instruction)"),  # a shell's 128 + 4
        (134, True, "killed by SIGABRT (aborted)"),
        (132, False, "exit code 132"),  # a program may exit 132 itself: only a shell's status means 128 + N
        (1, True, "exit code 1"),
        (128, True, "exit code 128"),
        (0, False, "exit code 0"),
        (None, False, "no exit status (the connection or the process was lost)"),
    ],
)
def test_describe_exit(code: int | None, shell: bool, words: str) -> None:
    assert describe_exit(code, shell=shell) == words


def test_exit_signal_ignores_numbers_no_signal_has() -> None:
    assert exit_signal(-4) is signal.SIGILL
    assert exit_signal(-200) is None and exit_signal(193, shell=True) is None and exit_signal(3) is None


def test_systemd_lines_name_the_signal_of_the_last_exit() -> None:
    journal = [
        "llamaforge-x.service: Main process exited, code=killed, status=4/ILL",
        "llamaforge-x.service: Failed with result 'signal'.",
        "llamaforge-x.service: Scheduled restart job, restart counter is at 1.",
    ]
    assert systemd_signal(journal) is signal.SIGILL
    assert systemd_signal(["x.service: Main process exited, code=dumped, status=11/SEGV"]) is signal.SIGSEGV
    # A later exit of its own replaces an older crash: the journal keeps earlier releases' lines too.
    assert systemd_signal([*journal, "x.service: Main process exited, code=exited, status=1/FAILURE"]) is None
    assert systemd_signal(["x.service: Deactivated successfully."]) is None
    # systemd-run --wait's summary of a transient unit
    assert systemd_signal(["Main processes terminated with: code=killed/status=ILL"]) is signal.SIGILL
    assert systemd_signal(["Main processes terminated with: code=dumped/status=SEGV"]) is signal.SIGSEGV
    assert systemd_signal(["Main processes terminated with: code=exited/status=3"]) is None


def test_the_journal_names_the_crash_and_the_module_of_the_run_that_crashed() -> None:
    journal = [
        "load_backend: loaded CPU backend from /opt/lf/x/releases/old/lib/libggml-cpu-haswell.so",
        "llamaforge-x.service: Main process exited, code=exited, status=1/FAILURE",
        "load_backend: loaded CPU backend from /opt/lf/x/releases/new/lib/libggml-cpu-sapphirerapids.so",
        "llamaforge-x.service: Main process exited, code=killed, status=4/ILL",
        "llamaforge-x.service: Scheduled restart job, restart counter is at 1.",
        "load_backend: loaded CPU backend from /opt/lf/x/releases/new/lib/libggml-cpu-zen4.so",  # the next run
    ]
    assert systemd_crash(journal) == (signal.SIGILL, "libggml-cpu-sapphirerapids.so")
    assert systemd_crash(journal[:2]) == (None, "libggml-cpu-haswell.so")
    assert systemd_crash(["load_backend: loaded CPU backend from /b/libggml-cpu-zen4.so"]) == (None, None)


def test_systemctl_show_exec_main_code_and_status() -> None:
    assert exec_main_signal("2", "4") is signal.SIGILL  # CLD_KILLED
    assert exec_main_signal("3", "6") is signal.SIGABRT  # CLD_DUMPED
    assert exec_main_signal("1", "4") is None  # CLD_EXITED: status 4 is an exit code
    assert exec_main_signal("0", "0") is None and exec_main_signal("", "") is None


def test_the_cpu_module_ggml_loaded() -> None:
    lines = [
        "load_backend: loaded RPC backend from /opt/llamaforge/x/current/lib/libggml-rpc.so",
        "load_backend: loaded CPU backend from /opt/llamaforge/x/current/lib/libggml-cpu-haswell.so",
        "build: 1 (abc) with cc",
    ]
    assert loaded_cpu_module(lines) == "libggml-cpu-haswell.so"
    assert cpu_variant("libggml-cpu-sapphirerapids.so") == "sapphirerapids"
    assert cpu_variant("libggml-cpu-x64.so") == "x64"
    assert (
        loaded_cpu_module([r"load_backend: loaded CPU backend from C:\b\ggml-cpu-zen4.dll"])
        == "ggml-cpu-zen4.dll"
    )
    assert loaded_cpu_module(["system_info: n_threads = 2"]) is None  # a build with the CPU backend linked in


def test_crash_words_and_hints_fit_the_signal() -> None:
    module = "libggml-cpu-sapphirerapids.so"
    assert crash_words("llama-bench", signal.SIGILL, module) == (
        "llama-bench was killed by SIGILL (illegal instruction) with libggml-cpu-sapphirerapids.so loaded"
    )
    assert crash_words("llama-server", signal.SIGABRT, None, when="before it was ready") == (
        "llama-server was killed by SIGABRT (aborted) before it was ready"
    )
    illegal = crash_hint(signal.SIGILL, module)
    assert illegal is not None
    assert module in illegal and "invoke smoke.cpu-modules" in illegal and "--cpu" in illegal
    assert "--repack 0" in illegal and "model file" not in illegal
    aborted = crash_hint(signal.SIGABRT, module)
    assert aborted is not None and "GGML_ASSERT" in aborted
    assert crash_hint(None, module) is None


def test_tool_failed_told_as_the_crash_it_was() -> None:
    output = ["load_backend: loaded CPU backend from /b/bin/libggml-cpu-zen4.so", "main: loading model"]
    failed = ToolFailed(
        "llama-bench failed",
        command=["llama-bench"],
        returncode=-4,
        tail=["main: loading model"],
        log_path="/r/bench.log",
        hint="e.g. a model file llama.cpp cannot load",
    )
    crash = failed.as_crash("llama-bench", output)
    assert (
        crash.message
        == "llama-bench was killed by SIGILL (illegal instruction) with libggml-cpu-zen4.so loaded"
    )
    assert crash.hint is not None and "model file" not in crash.hint and "libggml-cpu-zen4.so" in crash.hint
    assert (crash.returncode, crash.tail, crash.log_path) == (-4, ["main: loading model"], "/r/bench.log")
    rendered = str(crash)  # a traceback shows the end and the last lines too
    assert "exit: killed by SIGILL (illegal instruction)" in rendered and "| main: loading model" in rendered
    # An exit of its own, and the runner's kill at a timeout, stay as they were.
    exited = ToolFailed("llama-bench failed", command=["llama-bench"], returncode=1, tail=[])
    assert exited.as_crash("llama-bench", output) is exited
    timed_out = ToolFailed(
        "llama-bench did not finish within 5 s",
        command=["llama-bench"],
        returncode=-9,
        tail=[],
        timed_out=True,
    )
    assert timed_out.as_crash("llama-bench", output) is timed_out
