"""The process runner with real processes: streamed lines, env, cwd, stdin, timeout, cancel, failures, secrets."""

from __future__ import annotations

import ast
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from llamaforge.core.errors import Cancelled, InvalidOption, ToolFailed
from llamaforge.core.events import CancelToken
from llamaforge.runners.process import LOCAL, LocalProcessRunner, ProcessRunner

pytestmark = pytest.mark.quick

SRC = Path(__file__).resolve().parents[1] / "src" / "llamaforge"
PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_local_runner_is_a_process_runner() -> None:
    runner: ProcessRunner = LocalProcessRunner()
    assert isinstance(LOCAL, LocalProcessRunner) and runner is not LOCAL


def test_run_streams_lines_as_they_arrive(tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    script = "import sys, time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
    started = time.monotonic()
    result = LOCAL.run(
        [PY, "-c", script], on_line=lambda line: seen.append((line, time.monotonic() - started))
    )
    assert [line for line, _ in seen] == ["line 0", "line 1", "line 2"]
    assert seen[0][1] < 0.25 < seen[-1][1]  # the first line came before the process ended
    assert result.ok and result.exit_code == 0 and result.stdout == "line 0\nline 1\nline 2\n"
    assert result.argv == [PY, "-c", script] and result.duration_s >= 0.6


def test_run_keeps_stdout_and_stderr_apart_or_merged(tmp_path: Path) -> None:
    script = "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
    apart = LOCAL.run([PY, "-c", script])
    assert (apart.stdout, apart.stderr) == ("out\n", "err\n") and apart.lines == ["out", "err"]
    merged = LOCAL.run([PY, "-c", script], merge_stderr=True)
    assert sorted(merged.stdout.splitlines()) == ["err", "out"] and merged.stderr == ""
    log = tmp_path / "tool.log"
    LOCAL.run([PY, "-c", script], log_path=log)
    assert log.read_text(encoding="utf-8") == "err\n"  # the log gets the diagnostics, stdout is the product


def test_run_passes_env_cwd_and_stdin(tmp_path: Path) -> None:
    script = "import os, sys\nprint(os.environ['LF_TEST_VALUE'], os.environ.get('PATH') is not None)\n"
    script += "print(os.getcwd())\nprint(sys.stdin.read().upper())\n"
    result = LOCAL.run([PY, "-c", script], env={"LF_TEST_VALUE": "forty two"}, cwd=tmp_path, stdin="hello")
    assert result.stdout.splitlines() == ["forty two True", str(tmp_path), "HELLO"]
    assert "LF_TEST_VALUE" not in os.environ


def test_failed_exit_raises_with_command_code_and_tail() -> None:
    script = "import sys\nfor i in range(30):\n    print(f'step {i}', file=sys.stderr)\nsys.exit(3)\n"
    with pytest.raises(ToolFailed) as caught:
        LOCAL.run([PY, "-c", script], what="the step tool", hint="look at step 29")
    error = caught.value
    assert error.message == "the step tool failed" and error.returncode == 3
    assert error.command == [PY, "-c", script]
    assert error.tail[-1] == "step 29" and len(error.tail) == 20
    rendered = error.render()
    assert "exit: exit code 3" in rendered and "| step 29" in rendered and "hint: look at step 29" in rendered


def test_warn_returns_the_failed_result() -> None:
    result = LOCAL.run([PY, "-c", "print('nope'); raise SystemExit(5)"], warn=True)
    assert not result.ok and result.exit_code == 5 and result.stdout == "nope\n"


def test_missing_binary_is_a_tool_failure(tmp_path: Path) -> None:
    with pytest.raises(ToolFailed, match="could not be started") as caught:
        LOCAL.run([str(tmp_path / "no-such-tool"), "--version"])
    assert caught.value.returncode == 127


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # A child of the child: the whole process group goes, not just the direct child.
    script = f"import subprocess, sys, time\np = subprocess.Popen(['sleep', '30'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\nprint('started', flush=True)\ntime.sleep(30)\n"  # noqa: E501
    started = time.monotonic()
    with pytest.raises(ToolFailed, match="did not finish within 1 s") as caught:
        LOCAL.run([PY, "-c", script], timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert caught.value.tail == ["started"]
    grandchild = int(pid_file.read_text(encoding="utf-8"))
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    timed_out = LOCAL.run(["sleep", "30"], timeout_s=0.3, warn=True)
    assert timed_out.timed_out and not timed_out.ok


def test_cancel_kills_the_process_and_raises_cancelled() -> None:
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        LOCAL.run(["sleep", "30"], cancel=cancel)
    assert time.monotonic() - started < 5
    with pytest.raises(Cancelled):  # already cancelled: nothing starts
        LOCAL.run(["sleep", "30"], cancel=cancel)


def test_secrets_stay_out_of_argv_and_output() -> None:
    env = {"HF_TOKEN": "hf_abcdefgh12345"}
    with pytest.raises(InvalidOption, match="contains a secret"):
        LOCAL.run(["echo", "hf_abcdefgh12345"], env=env)
    seen: list[str] = []
    result = LOCAL.run(["sh", "-c", 'echo "token is $HF_TOKEN"'], env=env, on_line=seen.append)
    assert result.stdout == "token is ****\n" and seen == ["token is ****"]
    with pytest.raises(ToolFailed) as caught:
        LOCAL.run(["sh", "-c", 'echo "$HF_TOKEN" >&2; exit 1'], env=env)
    assert "hf_abcdefgh12345" not in caught.value.render()
    plain = LOCAL.run(["echo", "false"], env={"TOKENIZERS_PARALLELISM": "false"})  # not a secret's name
    assert plain.stdout == "false\n"


def test_start_streams_lines_and_terminates(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    script = "import time\nfor i in range(3):\n    print(f'ready {i}', flush=True)\ntime.sleep(30)\n"
    handle = LOCAL.start([PY, "-c", script], log_path=log)
    assert handle.pid > 0 and _alive(handle.pid) and handle.poll() is None
    assert list(handle.lines(timeout_s=2)) == ["ready 0", "ready 1", "ready 2"]  # ends at the timeout
    assert handle.wait(timeout_s=0.1) is None
    code = handle.terminate(grace_s=2)
    assert code != 0 and not _alive(handle.pid) and handle.poll() == code
    assert handle.tail() == ["ready 0", "ready 1", "ready 2"]
    assert log.read_text(encoding="utf-8") == "ready 0\nready 1\nready 2\n"


def test_start_lines_end_with_the_process_and_cancel_kills_it() -> None:
    handle = LOCAL.start([PY, "-c", "print('one'); print('two')"])
    assert list(handle.lines()) == ["one", "two"] and handle.wait() == 0
    cancel = CancelToken()
    sleeper = LOCAL.start(["sleep", "30"], cancel=cancel)
    cancel.cancel()
    assert sleeper.wait(timeout_s=5) is not None


def test_nothing_outside_runners_imports_subprocess() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "runners":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] in {"subprocess", "pty", "multiprocessing"} for name in names):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
            spawns = (
                isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
            )
            if spawns and (
                node.attr in {"system", "popen", "fork", "posix_spawn"}
                or node.attr.startswith(("exec", "spawn"))
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == [], "start processes through llamaforge.runners.process"
