"""More smoke inputs refused, naming the option, the file or the run: a --build path that is no build directory,
thresholds files and values, and reports smoke.compare cannot compare. Each goes through ``invoke`` where the
user meets it; none runs a smoke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import invoke, stub_gguf

pytestmark = pytest.mark.quick


def _error(*args: str) -> tuple[int, dict[str, str], str]:
    """Exit code, the JSON error and stderr of ``invoke ARGS --json``."""
    result = invoke(*args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)["error"], result.stderr


@pytest.mark.usefixtures("lf_home")
def test_a_build_path_that_is_no_build_directory_is_named_before_the_model_is_written(
    tmp_path: Path, lf_home: Path
) -> None:
    # All three said "no build with key '…'" (or named no option), after the tiny model had been written and
    # llama.cpp's sources downloaded for its converter.
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hi\n", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    hint = "give a build's directory or its key (`invoke builds.list` shows them)"
    for op in ("smoke", "smoke.cpu-modules"):
        for build, message in (
            (str(tmp_path / "nope"), f"--build {tmp_path / 'nope'}: no such build directory"),
            ("./nope", "--build ./nope: no such build directory"),
            (str(a_file), f"--build {a_file} is a file, not a build directory"),
            (
                str(empty),
                f"--build {empty}: the directory holds neither a llamaforge build (manifest.json) nor llama.cpp "
                "binaries (llama-server, bin/llama-server)",
            ),
        ):
            code, error, _ = _error(op, "--build", build)
            assert code == 2, (op, build, error)
            assert error["message"] == message
            assert error["hint"] == hint
    assert not (lf_home / "models").exists() and not (lf_home / "smoke").exists()


THRESHOLDS_FILES = [
    # name, file text (bytes), the message's end after "… (from thresholds file PATH)" or the whole message
    (
        "wrong type",
        b'min_tg_tps = "fast"\n',
        "min_tg_tps: Input should be a valid number, unable to parse string as a number",
    ),
    ("true for a number", b"min_tg_tps = true\n", "min_tg_tps: Input should be a number, not true or false"),
    ("nan", b"min_tg_tps = nan\n", "min_tg_tps: Input should be a finite number"),
    ("inf", b"max_ttft_ms = inf\n", "max_ttft_ms: Input should be a finite number"),
    ("negative", b"min_tg_tps = -1\n", "min_tg_tps: Input should be greater than or equal to 0"),
    ("a list", b"max_ttft_ms = [1]\n", "max_ttft_ms: Input should be a valid number"),
]


@pytest.mark.usefixtures("lf_home")
@pytest.mark.parametrize(
    ("text", "problem"), [c[1:] for c in THRESHOLDS_FILES], ids=[c[0] for c in THRESHOLDS_FILES]
)
def test_a_bad_value_in_a_thresholds_file_names_the_file(tmp_path: Path, text: bytes, problem: str) -> None:
    # true was a threshold of 1 token/s, inf passed (max) or failed (min) every run, nan blamed ">= 0"; and no
    # message named the file, only "invalid thresholds", after the model was written and the build resolved.
    path = tmp_path / "t.toml"
    path.write_bytes(text)
    code, error, _ = _error("smoke", "--thresholds", str(path))
    assert code == 2
    assert error["message"] == f"invalid thresholds: {problem} (from thresholds file {path})", error
    assert error["hint"].startswith("known: min_tg_tps (tokens/s, >= 0), max_ttft_ms (ms, > 0)")


@pytest.mark.usefixtures("lf_home")
def test_thresholds_files_that_cannot_be_read_are_named(tmp_path: Path, lf_home: Path) -> None:
    example = "e.g. --thresholds min_tg_tps=20 --thresholds max_ttft_ms=500"
    binary, json_file, unknown = tmp_path / "bin.toml", tmp_path / "t.json", tmp_path / "unknown.toml"
    binary.write_bytes(b"\xff\xfe")
    json_file.write_text('{"min_tg_tps": 2}\n', encoding="utf-8")
    unknown.write_text("[smoke]\nmin_tg_tps = 2\n", encoding="utf-8")
    for item, message, hint in (
        (
            str(tmp_path),
            f"--thresholds {str(tmp_path)!r} is neither KEY=VALUE nor a TOML file: it is a directory",
            example,
        ),
        (
            str(tmp_path / "gone.toml"),
            f"--thresholds {str(tmp_path / 'gone.toml')!r} is neither KEY=VALUE nor a TOML file (no such file)",
            example,
        ),
        # a UnicodeDecodeError traceback
        (
            str(binary),
            f"cannot read thresholds file {binary}: it is not UTF-8 text (byte 0: invalid start byte)",
            "a TOML file is UTF-8 text: save it as such, or give the right file",
        ),
        (
            str(json_file),
            f"thresholds file {json_file} is JSON: thresholds files are TOML",
            "write KEY = VALUE lines (min_tg_tps = 20) in a .toml file, or --thresholds min_tg_tps=20 "
            "--thresholds max_ttft_ms=500",
        ),
        (
            str(unknown),
            f"unknown threshold 'smoke' (from thresholds file {unknown})",
            "known: min_tg_tps, max_ttft_ms, non_empty_answer",
        ),
        (
            "min_tg_tps=inf",
            "invalid thresholds: min_tg_tps: Input should be a finite number (from --thresholds "
            "min_tg_tps=inf)",
            None,
        ),
        (
            "max_ttft_ms=1e999",
            "invalid thresholds: max_ttft_ms: Input should be a finite number (from "
            "--thresholds max_ttft_ms=1e999)",
            None,
        ),
    ):
        code, error, _ = _error("smoke", "--thresholds", item)
        assert code == 2, error
        assert error["message"] == message
        if hint is not None:
            assert error["hint"] == hint
    assert not (lf_home / "models").exists()


def test_a_thresholds_file_with_a_byte_order_mark_reads_like_one_without(tmp_path: Path) -> None:
    # tomllib said "Invalid statement (at line 1, column 1)" of a file Notepad saved
    path = tmp_path / "t.toml"
    path.write_bytes(b"\xef\xbb\xbfmin_tg_tps = 2\nmax_ttft_ms = 700\n")
    result = invoke("smoke", "--thresholds", str(path), "--thresholds", "bogus=1", "--json")
    # the file was read: the refusal is the next item's, named as such
    assert result.returncode == 2, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["message"] == "unknown threshold 'bogus' (from --thresholds bogus=1)"


def _run(root: Path, name: str, **changes: object) -> Path:
    """A run directory with a report of the shape smoke writes (one tg test, one server level)."""
    level = {
        "concurrency": 1,
        "aggregate_tps": 20.0,
        **{key: {"p50": 10.0, "p95": 12.0} for key in ("ttft_ms", "itl_ms", "decode_tps", "e2e_ms")},
    }
    report = {
        "run_id": name,
        "host": {"platform": "Linux"},
        "build": {"key": "k" * 32, "recipe": "default", "backend": "cpu"},
        "model": {"label": "tiny-qwen3"},
        "bench": {"n_threads": 2, "tests": [{"name": "tg32", "avg_ts": 50.0}]},
        "server": {"levels": [level]},
        "roofline": None,
        **changes,
    }
    run = root / name
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return run


def test_compare_refuses_paths_that_are_no_runs_and_runs_with_no_metric_in_common(
    tmp_path: Path, lf_home: Path
) -> None:
    root = lf_home / "smoke"
    a = _run(root, "20260101T000000Z-a")
    bench_only = _run(root, "20260101T000001Z-b", server=None)
    server_only = _run(root, "20260101T000002Z-c", bench=None)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hi\n", encoding="utf-8")
    runs = "runs: 20260101T000000Z-a, 20260101T000001Z-b, 20260101T000002Z-c"
    for ref, message in (
        # both were "no smoke runs match '…'", as if a run id had been mistyped
        (str(tmp_path / "nope"), f"{tmp_path / 'nope'}: no such smoke run directory"),
        (str(a_file), f"{a_file} is a file, not a smoke run directory or its report.json"),
    ):
        code, error, _ = _error("smoke.compare", a.name, ref)
        assert code == 2
        assert error["message"] == message
        assert error["hint"] == f"give the directory `invoke smoke` printed, or a run id; {runs}"
    # an empty table, exit 0, was the comparison of a run without the server stage and one without llama-bench
    code, error, _ = _error("smoke.compare", bench_only.name, server_only.name)
    assert code == 2
    assert error["message"] == (
        f"smoke runs {bench_only.name} and {server_only.name} have no metric in common: A measured llama-bench, "
        "B llama-server"
    )
    assert "--skip-bench / --skip-server" in error["hint"]
    assert not (root / "compare").exists()
    # one run named twice (by id and by path) was a table of ratios 1.00, exit 0
    code, error, _ = _error("smoke.compare", a.name, str(a / "report.json"))
    assert code == 2
    assert (
        error["message"]
        == f"{a.name!r} and {str(a / 'report.json')!r} are the same smoke run ({a.name}): nothing to compare"
    )
    assert not (root / "compare").exists()
    # the directories other operations keep under the smoke root "did not finish" as runs
    (root / "compare").mkdir()
    (root / "cpu-modules").mkdir()
    for ref, owner in (("compare", "smoke.compare"), ("cpu-modules", "smoke.cpu_modules")):
        code, error, _ = _error("smoke.compare", a.name, ref)
        assert code == 2
        assert error["message"] == f"{ref!r} is where {owner} keeps its output, not a smoke run"


def test_compare_reads_a_report_with_a_byte_order_mark_and_leaves_out_metrics_that_are_no_numbers(
    lf_home: Path,
) -> None:
    root = lf_home / "smoke"
    a = _run(root, "20260101T000000Z-a")
    b = _run(
        root,
        "20260101T000001Z-b",
        bench={"n_threads": 2, "tests": [{"name": "tg32", "avg_ts": float("nan")}]},
    )
    text = (b / "report.json").read_text(encoding="utf-8")
    assert "NaN" in text
    # json.loads said "Unexpected UTF-8 BOM" of a report saved again by a Windows editor
    (b / "report.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    result = invoke("smoke.compare", a.name, b.name, "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["metric"]: row for row in json.loads(result.stdout)["rows"]}
    # a NaN tg was a row of ratio NaN, and compare.json held NaN, which is no JSON
    assert "llama-bench tg32" not in rows and rows["c=1 TTFT p50"]["ratio"] == 1.0
    assert "NaN" not in (root / "compare" / f"{a.name}--vs--{b.name}" / "compare.json").read_text(
        encoding="utf-8"
    )


@pytest.mark.usefixtures("lf_home")
def test_golden_files_that_cannot_be_used_are_refused_before_the_run(tmp_path: Path, lf_home: Path) -> None:
    # The golden stage comes last: a missing or foreign golden, or a directory to record to, failed after
    # llama-bench and the server's measurements (and a cold build of the default recipe) had run.
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hi\n", encoding="utf-8")
    no_request, a_list, foreign = tmp_path / "g1.json", tmp_path / "g2.json", tmp_path / "g3.json"
    no_request.write_text('{"schema": 1}', encoding="utf-8")
    a_list.write_text("[]", encoding="utf-8")
    foreign.write_text('{"schema": 1, "request": {"temperature": 1}, "tokens": []}', encoding="utf-8")
    golden_hint = "give a golden that smoke --record-golden PATH wrote (record one on a reference build)"
    for args, message, hint in (
        (
            ["--golden", str(tmp_path / "gone.json")],
            f"--golden {tmp_path / 'gone.json'} cannot be read: No such file or directory",
            golden_hint,
        ),
        (["--golden", str(tmp_path)], f"--golden {tmp_path} cannot be read: Is a directory", golden_hint),
        (
            ["--golden", str(no_request)],
            f"--golden {no_request} cannot be read: it has no 'request' field",
            golden_hint,
        ),
        (
            ["--golden", str(a_list)],
            f"--golden {a_list} cannot be read: it holds no JSON object",
            golden_hint,
        ),
        (
            ["--golden", str(foreign)],
            f"--golden {foreign} cannot be read: its request is not an object of n_predict, n_probs, prompt, seed",
            golden_hint,
        ),
        (
            ["--record-golden", str(tmp_path)],
            f"--record-golden {tmp_path} is a directory",
            "give the path of the JSON file to write",
        ),
        (
            ["--record-golden", str(a_file / "g.json")],
            f"--record-golden {a_file / 'g.json'}: {a_file} is a file, not a directory",
            "give a path in a directory (missing directories are made)",
        ),
    ):
        code, error, _ = _error("smoke", *args)
        assert code == 2, error
        assert error["message"] == message
        assert error["hint"] == hint
    assert not (lf_home / "models").exists() and not (lf_home / "smoke").exists()


@pytest.mark.usefixtures("lf_home")
def test_an_executor_smoke_cannot_build_with_is_refused_before_the_model(lf_home: Path) -> None:
    # --executor bogus was taken (a free string) and refused after the model was written; --executor ssh said
    # "pass --build-host", an option smoke does not have.
    for op in ("smoke", "smoke.cpu-modules"):
        code, error, _ = _error(op, "--executor", "bogus")
        assert code == 2
        assert error["message"] == "--executor: Input should be 'docker', 'local' or 'ssh'"
        code, error, _ = _error(op, "--executor", "ssh")
        assert code == 2
        assert error["message"] == (
            "--executor ssh: the ssh executor needs a build host (smoke takes no executor settings)"
        )
        assert error["hint"] == (
            "build first (`invoke build --executor ssh ...`), then smoke it with --build KEY "
            "(`invoke builds.list` shows the keys)"
        )
    assert not (lf_home / "models").exists()


@pytest.mark.usefixtures("lf_home")
def test_a_model_recipe_smoke_value_that_is_no_threshold_is_refused_before_the_build(tmp_path: Path) -> None:
    # A recipe's [smoke] values were checked after the build was resolved (a cold build, without --build), and
    # the message said only "(from model recipe)"; inf passed its load.
    model = stub_gguf(tmp_path / "m.gguf")
    recipe = tmp_path / "m.toml"
    recipe.write_text(f'source = "file://{model}"\n[smoke]\nmin_tg_tps = inf\n', encoding="utf-8")
    binaries = tmp_path / "bin"  # llama.cpp binaries, never run: the refusal comes first
    binaries.mkdir()
    (binaries / "llama-server").write_bytes(b"")
    code, error, _ = _error("smoke", "--model", str(recipe), "--build", str(binaries))
    assert code == 2
    assert error["message"] == (
        f"invalid thresholds: min_tg_tps: Input should be a finite number (from model recipe {recipe})"
    )
    # --thresholds overrides the recipe's value, as before: then the build is looked up
    code, error, _ = _error(
        "smoke", "--model", str(recipe), "--build", "0123abcd", "--thresholds", "min_tg_tps=3"
    )
    assert code == 7 and error["message"] == "no build with key '0123abcd'"


def test_compare_where_its_files_cannot_be_written_says_so_and_leaves_no_half_comparison(
    lf_home: Path,
) -> None:
    # A NotADirectoryError traceback
    root = lf_home / "smoke"
    a, b = _run(root, "20260101T000000Z-a"), _run(root, "20260101T000001Z-b")
    (root / "compare").write_text("", encoding="utf-8")
    result = invoke("smoke.compare", a.name, b.name, "--json")
    assert result.returncode == 7, result.stderr
    assert "Traceback" not in result.stderr
    error = json.loads(result.stdout)["error"]
    out = root / "compare" / f"{a.name}--vs--{b.name}"
    assert error["message"] == f"cannot write the comparison to {out}: {root / 'compare'} is not a directory"
    assert error["hint"] == f"make {root / 'compare'} a directory you can write (it is under LLAMAFORGE_HOME)"


def test_smoke_where_its_run_directory_cannot_be_made_says_so(tmp_path: Path, lf_home: Path) -> None:
    # A FileExistsError traceback. The binaries are empty files: nothing starts before the run directory.
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    for name in ("llama-bench", "llama-server"):
        (build / "bin" / name).write_bytes(b"")
    lf_home.mkdir(parents=True, exist_ok=True)
    (lf_home / "smoke").write_text("", encoding="utf-8")
    model = stub_gguf(tmp_path / "m.gguf")
    code, error, _ = _error(
        "smoke", "--build", str(build), "--model", str(model), "--skip-server", "--skip-cpu-modules"
    )
    assert code == 7, error
    assert error["message"].startswith(f"cannot create the smoke run directory {lf_home / 'smoke'}/")
    assert error["message"].endswith(f"-m-external: {lf_home / 'smoke'} is not a directory")
    assert (
        error["hint"] == f"make {lf_home / 'smoke'} a directory you can write (it is under LLAMAFORGE_HOME)"
    )


def test_a_cpu_module_sweep_where_its_directory_cannot_be_made_says_so(tmp_path: Path, lf_home: Path) -> None:
    # The same FileExistsError traceback as smoke's run directory, from a second copy of the loop
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    for name in ("llama-bench", "llama-server"):
        (build / "bin" / name).write_bytes(b"")
    (lf_home / "smoke").mkdir(parents=True)
    (lf_home / "smoke" / "cpu-modules").write_text("", encoding="utf-8")
    model = stub_gguf(tmp_path / "m.gguf")
    code, error, _ = _error("smoke.cpu-modules", "--build", str(build), "--model", str(model))
    sweeps = lf_home / "smoke" / "cpu-modules"
    assert code == 7, error
    assert error["message"].startswith(f"cannot create the CPU module sweep directory {sweeps}/")
    assert error["message"].endswith(f"-external: {sweeps} is not a directory")
    assert error["hint"] == f"make {sweeps} a directory you can write (it is under LLAMAFORGE_HOME)"


@pytest.mark.usefixtures("lf_home")
def test_a_concurrency_level_given_twice_is_refused(lf_home: Path) -> None:
    # It ran the level twice, and compare (which keys the levels by concurrency) read one of the two
    code, error, _ = _error("smoke", "--concurrency", "2", "--concurrency", "1", "--concurrency", "2")
    assert code == 2
    assert error["message"] == "--concurrency 2 given more than once"
    assert error["hint"] == "give each level once, e.g. --concurrency 1 --concurrency 4"
    assert not (lf_home / "models").exists()
