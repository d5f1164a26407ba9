"""Crashes named: the suite's real llama-bench, llama-server and llama-cli, each ended by a real signal once ggml's
loader has said which CPU module it loaded, are reported as "killed by SIGILL (illegal instruction)" with that
module and a hint that fits, never as "exit code -4".

The signal comes from the one fault this test adds: the runner is this host's own, and the line callback that
sees ggml's ``load_backend: loaded CPU backend from …`` line sends the program the signal (``os.kill``) before
it reads the model, where an AMX Xeon's SIGILL comes too or later. The module the report names is checked
against the program's own log, which the test reads itself.
"""

from __future__ import annotations

import os
import re
import resource
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke, sigill_copy
from llamaforge.core.errors import ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.models.verify import verify_model
from llamaforge.runners.process import LineCallback, LocalProcessRunner, ProcessHandle, ProcessResult
from llamaforge.serve.launcher import LlamaFlags, LlamaServer, ServerLaunch
from llamaforge.smoke.bench import run_llama_bench

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]

_LOADED = re.compile(r"load_backend: loaded CPU backend from \S*/(libggml-cpu-\S+\.so)")


def _children(name: str) -> list[int]:
    """This process's children called ``name`` (the kernel keeps 15 characters of it)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if comm == name[:15] and int(rest[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


class SignalAtLoad(LocalProcessRunner):
    """This host's runner; the program it runs gets ``sig`` once ggml's loader names the CPU module it loaded."""

    def __init__(self, sig: signal.Signals = signal.SIGILL) -> None:
        self.sig = sig
        self.killed: list[int] = []

    def _watch(self, argv: Sequence[str], on_line: LineCallback | None) -> LineCallback:
        def line(text: str) -> None:
            if on_line is not None:
                on_line(text)
            if _LOADED.search(text) and not self.killed:
                for pid in _children(Path(argv[0]).name):
                    os.kill(pid, self.sig)
                    self.killed.append(pid)

        return line

    def run(
        self, argv: Sequence[str], *, on_line: LineCallback | None = None, **options: Any
    ) -> ProcessResult:
        return super().run(argv, on_line=self._watch(argv, on_line), **options)

    def start(
        self, argv: Sequence[str], *, on_line: LineCallback | None = None, **options: Any
    ) -> ProcessHandle:
        return super().start(argv, on_line=self._watch(argv, on_line), **options)


@pytest.fixture(autouse=True)
def no_core_files() -> Iterator[None]:
    """The killed programs leave no core file behind (the limit is inherited by the programs started)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def _module_in(log: Path | Mapping[str, Any]) -> str:
    """The CPU module the program's own output names (read here, not by the code under test)."""
    text = log.read_text(encoding="utf-8") if isinstance(log, Path) else "\n".join(log["tail"])
    found = _LOADED.findall(text)
    assert found, f"no load_backend line in {log}"
    return str(found[-1])


def test_llama_bench_killed_by_sigill_names_the_signal_and_its_cpu_module(
    patched_build: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    runner = SignalAtLoad()
    with pytest.raises(ToolFailed) as caught:
        run_llama_bench(
            patched_build / "bin" / "llama-bench",
            tiny_qwen3,
            tmp_path,
            pp=8,
            tg=4,
            repetitions=1,
            threads=1,
            timeout_s=120,
            cancel=CancelToken(),
            runner=runner,
        )
    assert runner.killed, "the fault was never injected"
    error = caught.value
    module = _module_in(tmp_path / "bench.log")
    assert (patched_build / "bin" / module).is_file()
    assert error.message == f"llama-bench was killed by SIGILL (illegal instruction) with {module} loaded"
    assert error.returncode == -signal.SIGILL
    assert error.hint is not None and "invoke smoke.cpu-modules" in error.hint and "--repack 0" in error.hint
    assert module in error.hint and "model file" not in error.hint
    rendered = error.render()
    assert "exit: killed by SIGILL (illegal instruction)" in rendered and "exit code" not in rendered


@pytest.mark.parametrize(
    ("sig", "words", "hinted"),
    [
        (signal.SIGILL, "SIGILL (illegal instruction)", "smoke.cpu-modules"),
        (signal.SIGABRT, "SIGABRT (aborted)", "GGML_ASSERT"),
    ],
)
def test_llama_server_that_dies_before_it_is_ready_names_its_signal_and_shows_its_log(
    sig: signal.Signals, words: str, hinted: str, patched_build: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    # Level 4, as smoke and the fit measurements run it: llama-server logs the loader's lines from there only.
    flags = LlamaFlags(ctx=512, log_verbosity=4)
    launch = ServerLaunch(patched_build / "bin" / "llama-server", tiny_qwen3, flags, log)
    with pytest.raises(ToolFailed) as caught, LlamaServer(launch, runner=SignalAtLoad(sig)):
        pass
    error = caught.value
    module = _module_in(log)
    assert error.message == f"llama-server was killed by {words} before it was ready, with {module} loaded"
    assert error.hint is not None and hinted in error.hint and "model file" not in error.hint
    assert error.tail and error.log_path == str(log)
    # What a test failure or a traceback shows: the signal and the log's last lines, the module's among them.
    shown = str(error)
    assert f"exit: killed by {words}" in shown and "last lines of output:" in shown and module in shown


def test_load_check_killed_by_sigill_is_a_crash_finding(patched_build: Path, tiny_qwen3: Path) -> None:
    report = verify_model(tiny_qwen3, load_check_build=patched_build, runner=SignalAtLoad(), use_cache=False)
    load = report.load_check
    assert load is not None and not load["loaded"] and load["returncode"] == -signal.SIGILL
    module = _module_in(load)
    assert load["exit"] == "killed by SIGILL (illegal instruction)" and load["cpu_module"] == module
    assert load["crash"] == f"llama-cli was killed by SIGILL (illegal instruction) with {module} loaded"
    (finding,) = [finding for finding in report.findings if finding.check == "load"]
    assert (
        finding.status == "fail"
        and load["crash"] in finding.message
        and "smoke.cpu-modules" in finding.message
    )


def test_the_verify_command_ends_on_the_crash_and_its_hint(
    patched_build: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    """`invoke models.verify --load-check` with a build whose CPU modules fault: exit 9, the crash in the error
    line and the crash's hint, not the hint for a damaged file."""
    _key, build = sigill_copy(patched_build, tmp_path / "home")
    result = invoke("models.verify", str(tiny_qwen3), "--load-check", str(build), "--no-cache")
    assert result.returncode == 9, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    error = next(line for line in lines if line.startswith("failed:"))
    crash = re.search(
        r"FAILED verification: load \(llama-cli was killed by SIGILL \(illegal instruction\) with (\S+) loaded\)",
        error,
    )
    assert crash is not None, error
    assert (build / "bin" / crash[1]).is_file()
    hint = next(line for line in lines if line.strip().startswith("hint:"))
    assert (
        crash[1] in hint
        and "invoke smoke.cpu-modules" in hint
        and "--no-repack" in hint
        and "tensor" not in hint
    )
