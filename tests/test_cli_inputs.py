"""The command line as a user meets it, through real processes of both entry points (``invoke`` with this
checkout's ``tasks.py``, and the ``llamaforge`` console script's ``main``): every task's ``--help``, bad inputs
refused in one line with their exit code and no traceback, ``--json`` errors on stdout, a closed pipe, and
whole output in a pipe. Only cheap tasks run: no build, no Docker."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rich.console import Console

from llamaforge.core.errors import CacheError, InvalidOption, PatchError, RecipeError
from llamaforge.core.events import Event
from llamaforge.core.registry import Operation, operations
from llamaforge.fronts.cli import ConsoleReporter, flag_help
from llamaforge.fronts.cli_index import spec_of
from llamaforge.fronts.cli_invoke import OUTPUT_CLOSED

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[1]
FRONTS = {
    "invoke": [sys.executable, "-m", "invoke"],
    "llamaforge": [sys.executable, "-c", "from llamaforge.fronts.cli import main; main()"],
}
PARSE_ERROR = 1  # Invoke's exit code for a command line it cannot parse


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fresh home (no builds, no models) and no COLUMNS: the processes' stdout is a pipe, as in CI."""
    home = tmp_path_factory.mktemp("cli-home")
    environ = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    return {**environ, "LLAMAFORGE_HOME": str(home)}


def run(front: str, args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FRONTS[front], *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def squeezed(text: str) -> str:
    """``text`` without any whitespace: Invoke wraps help columns (also after a hyphen)."""
    return "".join(text.split())


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


# --- TASK --help, for every task ------------------------------------------------------------------------------


def _check_help(front: str, op: Operation, env: dict[str, str]) -> None:
    done = run(front, [op.name.replace("_", "-"), "--help"], env)  # Invoke dashes names: smoke.cpu-modules
    no_traceback(done)
    assert done.returncode == 0, f"{front} {op.name} --help: {done.stderr}"
    out = squeezed(done.stdout)
    assert squeezed(f"Usage: {front}") in out.replace("inv[oke]", "invoke"), done.stdout
    assert squeezed(op.summary) in out, f"{op.name}: summary missing\n{done.stdout}"
    for flag in spec_of(op).flags:
        name = ("--[no-]" if flag.default is True else "--") + flag.name.replace("_", "-")
        assert name in out, f"{front} {op.name} --help: {name} missing"
        assert squeezed(flag_help(flag)) in out, f"{front} {op.name} --help: help of {name} missing"
        if flag.default not in (None, False, ""):
            assert "(default:" in flag_help(flag)


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_every_task_shows_its_help_before_anything_else(front: str, env: dict[str, str]) -> None:
    """``TASK --help`` prints the summary and every option with its default, exit code 0, for every operation
    of the registry, those with positional arguments included (there ``--help`` was taken for the argument, or
    the parameters were validated first)."""
    ops = list(operations().values())
    assert {"models.fit", "models.remap", "smoke.compare", "builds.show"} <= {op.name for op in ops}
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda op: _check_help(front, op, env), ops))


def test_help_after_arguments_and_the_whole_summary(env: dict[str, str]) -> None:
    build = run("invoke", ["build", "--help"], env)
    assert "every build of a matrix file" in " ".join(build.stdout.split())  # past the docstring's first line
    compare = run("llamaforge", ["smoke.compare", "RUN_A", "-h"], env)  # one of two positionals given
    assert compare.returncode == 0 and "--run-b" in compare.stdout, compare.stderr


# --- bad inputs: one line, the exit code, no traceback ---------------------------------------------------------

RENDER = ["deploy.render", "--target", "kubernetes", "--build", "none"]
BAD_INPUTS: list[tuple[list[str], int, str]] = [
    (["biuld"], PARSE_ERROR, "no task 'biuld': did you mean 'build'?"),
    (["smoke.compre", "a", "b"], PARSE_ERROR, "did you mean 'smoke.compare'?"),
    (["build", "--arhc", "86"], PARSE_ERROR, "no flag '--arhc': did you mean '--arch'?"),
    (["build", "--zzzz"], PARSE_ERROR, "no flag '--zzzz' (build --help lists its flags)"),
    (["build", "--arch"], PARSE_ERROR, "--arch needs a value"),
    (["build", "--arch", "86", "--arch", "89"], PARSE_ERROR, "--arch is given twice: give it once"),
    (["models.fit"], PARSE_ERROR, "did not receive required positional arguments: 'model'"),
    ([*RENDER, "--port", "abc"], InvalidOption.exit_code, "--port: Input should be a valid integer"),
    ([*RENDER, "--replicas", "x"], InvalidOption.exit_code, "--replicas: Input should be a valid integer"),
    ([*RENDER, "--parallel", "abc"], InvalidOption.exit_code, "--parallel: Input should be a valid integer"),
    ([*RENDER, "--port", "0"], InvalidOption.exit_code, "--port: Input should be greater than or equal to 1"),
    (["topology.plan", "--parallel", "abc"], InvalidOption.exit_code, "--parallel: Input should be a valid"),
    # llama.cpp holds at most 256 sequences: a plan for 257 slots is one no llama-server starts with
    (
        ["models.fit", "m.gguf", "--ctx", "512", "--parallel", "257"],
        InvalidOption.exit_code,
        "or equal to 256",
    ),
    (
        ["models.split", "m.gguf", "--devices", "gpu=8GiB", "--ctx", "512", "--parallel", "257"],
        InvalidOption.exit_code,
        "--parallel: Input should be less than or equal to 256",
    ),
    (
        ["models.fit", "m.gguf", "--ctx", "lots"],
        InvalidOption.exit_code,
        "--ctx: Input should be a valid integer",
    ),
    (
        [*RENDER, "--parallel", "257"],
        InvalidOption.exit_code,
        "--parallel: Input should be less than or equal to 256",
    ),
    (["builds.show", "0123abcd"], CacheError.exit_code, "error: no build with key '0123abcd'"),
    (["builds.show", "nosuchkey"], CacheError.exit_code, "error: 'nosuchkey' is not a build key"),
    (["recipes.show", "nosuch"], RecipeError.exit_code, "error: unknown build recipe 'nosuch'"),
    (["patches.check", "--series", "/etc"], PatchError.exit_code, "error: /etc is no patch series"),
]


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize(
    ("args", "code", "words"), BAD_INPUTS, ids=[" ".join(a[:3]) for a, _c, _w in BAD_INPUTS]
)
def test_bad_inputs_are_refused_in_one_line(
    front: str, args: list[str], code: int, words: str, env: dict[str, str]
) -> None:
    done = run(front, args, env)
    no_traceback(done)
    assert done.returncode == code, done.stderr
    lines = done.stderr.splitlines()
    assert lines and words in lines[0], done.stderr
    assert all(line.startswith("  hint: ") for line in lines[1:]), done.stderr  # the one error, then its hint
    assert done.stdout == ""


def test_a_required_flag_left_out_is_named_with_what_it_is_for(env: dict[str, str]) -> None:
    done = run("invoke", ["models.fit", "m.gguf", "--vram", "24GiB"], env)
    assert done.returncode == InvalidOption.exit_code, done.stderr
    assert done.stderr.splitlines() == [
        "error: --ctx: Field required",
        "  hint: give --ctx (Context (tokens) of each slot); `models.fit --help` lists the flags",
    ]


def test_json_errors_are_on_stdout_too(env: dict[str, str]) -> None:
    missing = run("invoke", ["builds.show", "nosuchkey", "--json"], env)
    assert missing.returncode == CacheError.exit_code
    error = json.loads(missing.stdout)["error"]
    assert error["exit_code"] == CacheError.exit_code and "nosuchkey" in error["message"] and error["hint"]
    assert "is not a build key: keys are lower-case hex digits" in missing.stderr
    bad = run("llamaforge", [*RENDER, "--port", "abc", "--json"], env)
    error = json.loads(bad.stdout)["error"]
    assert error["exit_code"] == 2 and "--port" in error["message"]
    assert error["hint"].startswith("give --model (Model recipe name")  # RENDER leaves the model out


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_json_errors_of_a_command_line_that_does_not_parse(front: str, env: dict[str, str]) -> None:
    for args, words in (
        (["recipes.show", "--json"], "'recipes.show' did not receive required positional arguments: 'name'"),
        (["build", "--arhc", "86", "--json"], "no flag '--arhc': did you mean '--arch'?"),
        (["build", "--json", "--arch"], "--arch needs a value"),
        (["build", "--arch", "86", "--json", "--arch", "89"], "--arch is given twice: give it once"),
    ):
        done = run(front, args, env)
        assert done.returncode == PARSE_ERROR, done.stderr
        assert json.loads(done.stdout) == {
            "error": {"exit_code": PARSE_ERROR, "hint": None, "message": words}
        }
        assert words in done.stderr and "Traceback" not in done.stderr


# --- output: a closed pipe, whole lines in a pipe --------------------------------------------------------------


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize(
    "args",
    [["--list"], ["build", "--dry-run"], ["build", "--dry-run", "--json"], ["models.fit", "--help"]],
    ids=" ".join,
)
def test_a_reader_that_went_away_ends_the_program_quietly(
    front: str, args: list[str], env: dict[str, str]
) -> None:
    """``| head -1``: the reader of stdout is gone before the first write; the program ends with 141 (128 +
    SIGPIPE) and says nothing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*FRONTS[front], *args],
            cwd=REPO,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == OUTPUT_CLOSED, done.stderr
    assert done.stderr == ""


def test_a_pipe_gets_whole_lines_and_whole_tables(env: dict[str, str]) -> None:
    """rich assumed 80 columns for a pipe and cut the dry run's files and the tables' columns."""
    plan = json.loads(run("invoke", ["build", "--dry-run", "--json"], env).stdout)["plan"]
    human = run("invoke", ["build", "--dry-run"], env)
    assert human.returncode == 0, human.stderr
    for name, text in plan["files"].items():
        assert text in human.stdout, f"{name} is not printed whole"
    long = [line for text in plan["files"].values() for line in text.splitlines() if len(line) > 120]
    assert long  # lines a narrow console cuts
    assert "cmake: " + " ".join(plan["cmake_args"]) in human.stdout.splitlines()
    table = run("llamaforge", ["recipes.list"], env)
    row = next(line for line in table.stdout.splitlines() if "default" in line)
    assert "with the llamaforge patch series" in row, table.stdout  # the description on its row, whole


def test_countable_work_in_a_log_prints_a_line_every_30_s_or_10_percent() -> None:
    """Where no bar can be drawn (CI, nohup, a pipe), a cold build said "» build" and then nothing for minutes."""
    out = io.StringIO()
    now = [0.0]
    reporter = ConsoleReporter(Console(file=out, width=80), verbose=False, clock=lambda: now[0])
    assert not reporter.console.is_terminal
    for done in range(1, 475):  # ninja's [n/474], one step a second
        now[0] = float(done)
        reporter(Event("progress", f"[{done}/474] compiling", stage="build", completed=done, total=474))
    lines = out.getvalue().splitlines()
    assert lines[0] == "build [1/474] 0% 0s"
    assert lines[1].startswith("build [31/474] 7% 30s, ~")  # 30 s after the first
    assert lines[-1] == "build [474/474] 100% 7m53s"
    assert 16 <= len(lines) <= 17  # one per 30 s over 474 s, and the end; none longer than a line
    middle = next(line for line in lines if line.startswith("build [241/474]"))
    assert middle == "build [241/474] 51% 4m, ~3m52s left"
    reporter(Event("progress", "fetching", stage="fetch", completed=5, total=10))  # another count starts
    assert out.getvalue().splitlines()[-1] == "fetch [5/10] 50% 0s"
