"""Inputs that used to succeed wrongly (or end in a traceback) are refused with one clear error; outputs say
what happened.

Each bad input runs through the real Invoke front in a private LLAMAFORGE_HOME: exit code 2, one ``error:``
line (a hint may follow), no traceback. None of them reaches a build: the refusals come before any build
starts, and the smoke cases name a build key the store does not hold, so a refusal that stopped working
fails on that key instead of building. The accepted spellings are checked against the plan, the fit and the
split they produce. The doctor test starts one short-lived container from the local base image, labelled as
a build container, and removes it by its id.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest

from helpers import invoke, write_mini_vocab
from llamaforge.backends.cuda.arch import parse_cuda_archs
from llamaforge.build.ops import BuildParams, _plan_from_params
from llamaforge.core.errors import CacheError, InvalidOption, ModelError
from llamaforge.core.events import Event
from llamaforge.core.registry import OperationContext
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.serve.fit import plan_fit, synthetic_header
from llamaforge.serve.fit_chart import _figure, fit_chart_png, save_fit_chart
from llamaforge.serve.split import parse_devices
from llamaforge.smoke.report import compare_runs, resolve_run

pytestmark = pytest.mark.quick

VOCAB_ENV = "LLAMAFORGE_TEST_VOCAB"
ABSENT_BUILD = "0000deadbeef"  # a key prefix no store holds: a smoke that got past its refusal stops here


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny dense qwen3 GGUF (real qwen2 vocabulary) and a vocab-only GGUF (no tensors)."""
    vocab = os.environ.get(VOCAB_ENV, "")
    if not Path(vocab).is_file():
        pytest.skip(f"set {VOCAB_ENV} to llama.cpp's models/ggml-vocab-qwen2.gguf")
    root = tmp_path_factory.mktemp("models")
    dense = write_tiny_model(root / "tiny-qwen3.gguf", TinyModelSpec(arch="qwen3"), Path(vocab)).path
    vocab_only = root / "vocab-only.gguf"
    writer = gguf.GGUFWriter(vocab_only, "qwen3")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return {"dense": dense, "vocab_only": vocab_only}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The front's environment with a private, empty LLAMAFORGE_HOME."""
    return {**os.environ, "LLAMAFORGE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}


def _refused(args: list[str], env: dict[str, str], message: str) -> str:
    """Run ``invoke ARGS``; it must exit 2 with one error line holding ``message`` and no traceback."""
    result = invoke(*args, env=env, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, f"exit {result.returncode}: {output[-3000:]}"
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert message in errors[0], result.stderr
    return result.stderr


# --- bad inputs, through the front ---------------------------------------------------------------------------

FIT = ["--vram", "8GiB", "--ctx", "512"]
ABSENT_TINY = ["--build", ABSENT_BUILD, "--model", "tiny"]
SPLIT = ["--ctx", "512", "--devices"]

BAD_INPUTS: list[tuple[str, list[str], str]] = [
    (
        "smoke measuring nothing",
        ["smoke", "--skip-bench", "--skip-server", "--build", ABSENT_BUILD],
        "--skip-bench and --skip-server together leave nothing to measure",
    ),
    (
        "smoke of a vocab-only file",
        ["smoke", "--model", "{vocab_only}", "--build", "{binaries}"],
        "has no tensors: a vocab-only file cannot be served",
    ),
    (
        "smoke --concurrency 0",
        ["smoke", "--concurrency", "2", "--concurrency", "0", "--build", ABSENT_BUILD],
        "--concurrency (value 2): Input should be greater than or equal to 1",
    ),
    (
        "a wait of a century",  # it overflowed the clock threads wait on
        ["smoke.cpu-modules", "--timeout-s", "3153600000", "--build", ABSENT_BUILD],
        "--timeout-s: Input should be less than or equal to 604800",
    ),
    (
        "deploy gate of 1e12 s",
        [
            "deploy.plan",
            "--hosts",
            "root@127.0.0.1:2222",
            "--build",
            ABSENT_BUILD,
            "--model",
            "tiny",
            "--gate-timeout-s",
            "1e12",
        ],
        "--gate-timeout-s: Input should be less than or equal to 604800",
    ),
    ("fetch of file://relative", ["models.fetch", "file://relative/x.gguf"], "names the host 'relative'"),
    ("fetch over ftp://", ["models.fetch", "ftp://host/model.gguf"], "source must start with one of hf://"),
    (
        "fetch of a hub repository",
        ["models.fetch", "hf://org/repo"],
        "hub sources look like hf://owner/repo/",
    ),
    (
        "build --jobs 0",
        ["build", "--dry-run", "--jobs", "0"],
        "--jobs: Input should be greater than or equal to 1",
    ),
    (
        "build --jobs -3",
        ["build", "--dry-run", "--jobs", "-3"],
        "--jobs: Input should be greater than or equal",
    ),
    ("build --arch ''", ["build", "--dry-run", "--arch", ""], "empty CUDA arch list"),
    (
        "lock --recipe ''",
        ["models.lock", "--recipe", ""],
        "--recipe: an empty path names nothing",
    ),  # not "all"
    (
        "verify --load-check ''",
        ["models.verify", "{dense}", "--load-check", ""],
        "--load-check: an empty path names nothing",
    ),
    (
        "build --cpu ''",
        ["build", "--dry-run", "--cpu", ""],
        "--cpu: unknown CPU level ''",
    ),  # not the recipe's
    ("build --arch rtx4909", ["build", "--dry-run", "--arch", "rtx4909"], "invalid CUDA arch 'rtx4909'"),
    ("build --arch 'RTX 4909'", ["build", "--dry-run", "--arch", "RTX 4909"], "invalid CUDA arch 'RTX 4909'"),
    (
        "split port out of range",
        ["models.split", "{dense}", *SPLIT, "10.0.0.2:99999=1GiB"],
        "port 99999 is out of range (1-65535)",
    ),
    (
        "split port not a number",
        ["models.split", "{dense}", *SPLIT, "10.0.0.2:abc=1GiB"],
        "port 'abc' is not a number",
    ),
    ("split without a host", ["models.split", "{dense}", *SPLIT, ":50052=1GiB"], "has no valid host"),
    ("split port in other digits", ["models.split", "{dense}", *SPLIT, "10.0.0.2:²=1GiB"], "is not a number"),
    (
        "split naming one worker twice",
        ["models.split", "{dense}", *SPLIT, "10.0.0.2=1GiB,10.0.0.2:50052=1GiB"],
        "RPC workers given twice: 10.0.0.2:50052",
    ),
    (
        "split weighted by inf",
        ["models.split", "{dense}", *SPLIT, "10.0.0.2=1GiB,10.0.0.3=1GiB", "--tensor-split", "inf,1"],
        "is not a list of proportions",
    ),
    ("a port in other digits", ["deploy.status", "--hosts", "127.0.0.1:²"], "has no valid port"),
    ("a host that is a command", ["deploy.status", "--hosts", "127.0.0.1;id"], "is not a DNS name or an IP"),
    ("one host twice", ["deploy.status", "--hosts", "127.0.0.1:9,lf@127.0.0.1:9"], "hosts given twice"),
    (
        "a gate that never ends",
        ["deploy.status", "--hosts", "127.0.0.1:9", "--gate-timeout-s", "inf"],
        "--gate-timeout-s: Input should be a finite number",
    ),
    ("rollback to ''", ["deploy.rollback", "--hosts", "127.0.0.1:9", "--release", ""], "is no release id"),
    (
        "replicas for systemd",
        ["deploy", "--hosts", "127.0.0.1:9", "--build", ABSENT_BUILD, "--model", "tiny", "--replicas", "3"],
        "--replicas is read by --target swarm only, not by --target systemd",
    ),
    (
        "listen for systemd",
        [
            "deploy.render",
            "--target",
            "systemd",
            "--build",
            ABSENT_BUILD,
            "--model",
            "tiny",
            "--listen",
            "0.0.0.0",
        ],
        "--listen is read by --target compose only",
    ),
    (
        "compose beyond loopback without a key file",
        [
            "deploy.render",
            "--target",
            "compose",
            "--build",
            ABSENT_BUILD,
            "--model",
            "tiny",
            "--listen",
            "0.0.0.0",
            "--api-key-file",
            "",
        ],
        "is not a file beside compose.yaml",
    ),
    (
        "a topology file that is not there",
        ["topology.plan", "--topology", "{tmp}/nothing.toml", "--build", ABSENT_BUILD, "--model", "tiny"],
        "nothing.toml does not exist",
    ),
    (
        "an SSH key that is not there",
        ["deploy.status", "--hosts", "lf@127.0.0.1:1", "--ssh-key", "{tmp}/no-key"],
        "no-key does not exist",
    ),
    (
        "a known_hosts that is a directory",
        ["topology.plan", "--rpc-workers", "lf@127.0.0.1:1", "--known-hosts", "{tmp}", *ABSENT_TINY],
        "is a directory",
    ),
    (
        "a topology file that is a directory",
        ["topology.plan", "--topology", "{tmp}", "--build", ABSENT_BUILD, "--model", "tiny"],
        "is a directory",
    ),
    (
        "fit of a vocab-only file",
        ["models.fit", "{vocab_only}", *FIT],
        "vocab-only.gguf has no tensors: a vocab-only file cannot be served",
    ),
    (
        "split of a vocab-only file",
        ["models.split", "{vocab_only}", *SPLIT, "gpu=8GiB"],
        "has no tensors: a vocab-only file cannot be served",
    ),
    (
        "--n-cpu-moe on a dense model",
        ["models.fit", "{dense}", *FIT, "--n-cpu-moe", "1"],
        "is a dense model, it has no experts to keep on the CPU",
    ),
    ("--margin over the GPU", ["models.fit", "{dense}", *FIT, "--margin", "30GiB"], "keeps all of the GPU's"),
    (
        "a GPU of no memory",
        ["models.fit", "{dense}", "--ctx", "4096", "--vram", "0"],
        "--vram 0.0 GiB: a GPU has",
    ),
    (
        "fit --cache-type ''",
        ["models.fit", "{dense}", *FIT, "--cache-type", ""],
        "'' is not a KV cache type llama.cpp knows",
    ),
    ("fit --vram ''", ["models.fit", "{dense}", "--ctx", "512", "--vram", ""], "cannot read the size ''"),
    ("--plot DIR/", ["models.fit", "{dense}", *FIT, "--plot", "{tmp}/"], "is a directory"),
    (
        "--plot x.bmp",
        ["models.fit", "{dense}", *FIT, "--plot", "{tmp}/x.bmp"],
        "the chart is written as PNG, SVG or PDF, not .bmp",
    ),
    (
        "compare absolute paths that are no runs",
        ["smoke.compare", "{tmp}", "{tmp}/nothing-here"],
        "is not a smoke run directory (it has no report.json)",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"), [case[1:] for case in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_is_refused_with_one_error_line(
    args: list[str], message: str, models: dict[str, Path], env: dict[str, str], tmp_path: Path
) -> None:
    # llama.cpp binaries that are never run: a build that exists, for refusals that come after its lookup
    binaries = tmp_path / "binaries"
    binaries.mkdir()
    (binaries / "llama-server").write_bytes(b"")
    names = {
        "dense": str(models["dense"]),
        "vocab_only": str(models["vocab_only"]),
        "tmp": str(tmp_path),
        "binaries": str(binaries),
    }
    stderr = _refused([arg.format(**names) for arg in args], env, message)
    assert not (tmp_path / "x.bmp").exists()
    assert not (Path(env["LLAMAFORGE_HOME"]) / "builds").exists()  # nothing was built
    assert "pydantic" not in stderr and "input_value" not in stderr, stderr
    if "--arch" in args:
        hint = next(line for line in stderr.splitlines() if "hint:" in line)
        assert len(hint) < 400, hint  # a few names, not the ~80 of the whole table
        if "rtx4909" in args or "RTX 4909" in args:
            assert "did you mean 'rtx4090'" in hint


@pytest.mark.parametrize("operation", ["smoke", "smoke.cpu-modules"])
def test_a_missing_model_is_refused_before_any_build(
    operation: str, env: dict[str, str], tmp_path: Path
) -> None:
    """The model is resolved before a build can start: with no --build, a model checked after the build would
    come after a cold build. A --build key no store holds is named first: looking it up costs nothing, and the
    model may take minutes to write or download."""
    for build, code, message in (
        ([], ModelError.exit_code, f"model file {tmp_path / 'absent.gguf'} does not exist"),
        (["--build", ABSENT_BUILD], CacheError.exit_code, f"no build with key '{ABSENT_BUILD}'"),
    ):
        result = invoke(operation, "--model", str(tmp_path / "absent.gguf"), *build, env=env, timeout=300)
        assert result.returncode == code, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert errors == [f"error: {message}"], result.stderr
        assert not (Path(env["LLAMAFORGE_HOME"]) / "builds").exists()  # nothing was built


# --- what is accepted, and what it means ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "cmake"),
    [
        ("8.6", "86"),
        ("sm_86", "86"),
        ("compute_86", "86"),
        ("8.6,8.9", "86;89"),
        ("12.0", "120"),
        ("9.0a-real", "90a-real"),
        ("RTX 4090", "89"),
        ("a10", "86"),
        ("l40", "89"),
        ("h100-nvl", "90"),
        ("NVIDIA A10", "86"),
        ("86 89", "86;89"),
    ],
)
def test_arch_spellings_reach_the_plan(arch: str, cmake: str) -> None:
    plan, _options = _plan_from_params(BuildParams(arch=arch, dry_run=True))
    assert plan.backend == "cuda"
    assert f"-DCMAKE_CUDA_ARCHITECTURES={cmake}" in plan.cmake_args


def test_every_fit_gpu_is_a_build_arch() -> None:
    """`models.fit --gpu NAME` and `build --arch NAME` read one table: the same names, the same cards."""
    from llamaforge.serve.gpus import find_gpu, load_gpus

    for key, gpu in load_gpus().gpus.items():
        assert find_gpu(key) is gpu
        assert parse_cuda_archs(key) == [gpu.cuda_arch], key


def test_jobs_and_ports_at_their_bounds_are_accepted() -> None:
    assert BuildParams(jobs=1).jobs == 1
    devices = parse_devices("10.0.0.2:65535=1GiB,host-b.lan:1=1GiB,10.0.0.4=1GiB,gpu=1GiB")
    assert [device.endpoint for device in devices] == [
        "10.0.0.2:65535",
        "host-b.lan:1",
        "10.0.0.4:50052",
        None,
    ]


def test_n_cpu_moe_on_a_moe_model_is_planned() -> None:
    header = synthetic_header(TinyModelSpec(arch="qwen3moe", n_layer=4), n_vocab=1024)
    plan = plan_fit(header, vram_bytes=8 << 30, ctx=512, n_cpu_moe=2)
    assert plan.n_cpu_moe == 2 and "--n-cpu-moe" in plan.flags
    dense = synthetic_header(TinyModelSpec(arch="qwen3", n_layer=4), n_vocab=1024)
    assert plan_fit(dense, vram_bytes=8 << 30, ctx=512, n_cpu_moe=0).n_cpu_moe == 0


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def test_fit_chart_keeps_the_legend_and_label_and_writes_the_suffix(tmp_path: Path) -> None:
    plan = plan_fit(
        synthetic_header(TinyModelSpec(arch="qwen3", n_layer=2), n_vocab=1024), gpu="rtx4090", ctx=4096
    ).to_json()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = _figure([plan], None)
    drawn = figure.get_tightbbox(FigureCanvasAgg(figure).get_renderer())  # legend and y label included
    assert drawn.x1 > figure.get_figwidth()  # the legend reaches past the figure's own width ...
    width, height = _png_size(fit_chart_png([plan], dpi=100))
    assert width >= drawn.width * 100 and height >= drawn.height * 100  # ... and the image holds all of it
    assert save_fit_chart([plan], tmp_path / "fit.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert save_fit_chart([plan], tmp_path / "fit.pdf").read_bytes()[:5] == b"%PDF-"
    assert save_fit_chart([plan], tmp_path / "sub" / "fit.PNG").read_bytes()[:4] == b"\x89PNG"


def test_fit_says_where_the_plot_went(models: dict[str, Path], env: dict[str, str], tmp_path: Path) -> None:
    plot = tmp_path / "charts" / "fit.svg"
    result = invoke("models.fit", str(models["dense"]), *FIT, "--plot", str(plot), env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"memory chart written to {plot}" in result.stdout
    assert plot.read_bytes().lstrip().startswith(b"<?xml")


# --- smoke.compare with paths ---------------------------------------------------------------------------------


def _run(directory: Path, run_id: str, tg: float) -> Path:
    report: dict[str, Any] = {
        "run_id": run_id,
        "host": {"platform": "Linux"},
        "build": {"key": "k" * 32},
        "model": {"label": "tiny"},
        "bench": {"tests": [{"name": "tg32", "avg_ts": tg}]},
    }
    directory.mkdir(parents=True)
    (directory / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return directory


def test_compare_takes_absolute_paths_outside_the_store(tmp_path: Path) -> None:
    root = tmp_path / "home" / "smoke"
    a = _run(tmp_path / "elsewhere" / "run-a", "20260101T000000Z-a", 50.0)
    b = _run(tmp_path / "elsewhere" / "run-b", "20260101T000001Z-b", 55.0)
    data = compare_runs(str(a.resolve()), str(b / "report.json"), root)
    assert (data["a"]["run_dir"], data["b"]["run_dir"]) == (str(a.resolve()), str(b))
    assert data["rows"][0]["ratio"] == pytest.approx(1.1)
    for ref in (str(tmp_path / "missing"), str(tmp_path / "elsewhere"), "/", "2026*", "[a-z]*"):
        with pytest.raises(InvalidOption):
            resolve_run(ref, root)


def test_a_run_that_never_wrote_its_report_is_named_as_such(tmp_path: Path) -> None:
    """A run directory left without report.json (a smoke stopped or crashed) was "no smoke runs match", as if
    the id were mistyped."""
    root = tmp_path / "smoke"
    _run(root / "20260101T000000Z-a", "20260101T000000Z-a", 50.0)
    (root / "20260101T000001Z-b").mkdir()
    (root / "20260101T000001Z-b" / "server.log").write_text("loading\n", encoding="utf-8")
    with pytest.raises(
        InvalidOption, match=r"smoke run 20260101T000001Z-b has no report\.json: it did not finish"
    ):
        compare_runs("20260101T000000Z-a", "20260101T000001Z-b", root)
    with pytest.raises(InvalidOption, match="no smoke runs match '20260101T000001Z-c'"):
        resolve_run("20260101T000001Z-c", root)


# --- builds.list with a damaged entry -------------------------------------------------------------------------


def _manifest(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "recipe": {"name": "default"},
        "backend": "cpu",
        "cuda_architectures": [],
        "patches": [{"name": "0001-example.patch"}],
        "finished_at": "2026-01-01T00:00:00Z",
        "image": {"executor": "docker"},
    }


def test_builds_list_names_a_damaged_entry_and_lists_the_others(env: dict[str, str]) -> None:
    builds = Path(env["LLAMAFORGE_HOME"]) / "builds"
    good, not_json, incomplete, copied = "a" * 32, "b" * 32, "c" * 32, "d" * 32
    for key, text in (
        (good, json.dumps(_manifest(good))),
        (not_json, '{"key": "bbb'),
        (incomplete, json.dumps({"key": incomplete, "backend": "cpu"})),
        (copied, json.dumps(_manifest(good))),  # another build's manifest: listed once, under its own key
    ):
        (builds / key).mkdir(parents=True)
        (builds / key / "manifest.json").write_text(text, encoding="utf-8")
    shown = invoke("builds.list", env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert good in shown.stdout and "Traceback" not in shown.stdout + shown.stderr
    warnings = [line for line in shown.stdout.splitlines() if line.startswith("warning: damaged store entry")]
    assert len(warnings) == 3 and all(key in "".join(warnings) for key in (not_json, incomplete, copied))
    data = json.loads(invoke("builds.list", "--json", env=env, timeout=120).stdout)
    assert [item["key"] for item in data["builds"]] == [good]
    errors = {Path(item["path"]).name: item["error"] for item in data["broken"]}
    assert "manifest.json is not JSON" in errors[not_json]
    assert "manifest.json has no 'recipe' field" in errors[incomplete]
    assert f"manifest.json names build {good}, not the directory's {copied}" in errors[copied]
    assert invoke("builds.show", "aaaa", env=env, timeout=120).returncode == 0  # one build starts with aaaa
    show = invoke("builds.show", "bbbb", env=env, timeout=120)
    assert show.returncode == CacheError.exit_code and f"build {not_json} is damaged" in show.stderr


def test_a_prefix_of_several_damaged_entries_is_ambiguous(lf_home: Path) -> None:
    """`builds.show bc` named the first damaged entry as if it were the build asked for."""
    from llamaforge.build.store import find_build

    for key in ("bc" + "1" * 30, "bc" + "2" * 30):
        (lf_home / "builds" / key).mkdir(parents=True)
        (lf_home / "builds" / key / "manifest.json").write_text("{", encoding="utf-8")
    with pytest.raises(CacheError, match="2 damaged store entries start with 'bc', and no build") as refused:
        find_build("bc")
    assert "more characters" in (refused.value.hint or "")
    with pytest.raises(CacheError, match=f"build bc{'1' * 30} is damaged"):
        find_build("bc1")


def test_a_build_missing_or_truncating_a_listed_artifact_is_damaged(lf_home: Path) -> None:
    """A build whose bin/ lost a file or holds a truncated one (a full disk, a manual edit) was found, smoked and
    rendered as if whole; smoke then blamed the recipe's targets. A manifest whose recipe or patches had another
    shape was found, and smoke raised a traceback on it."""
    from llamaforge.build.store import find_build, scan_builds

    cases = {
        "e" * 32: ("missing", "bin/llama-server, listed in manifest.json, is missing"),
        "f" * 32: ("short", "bin/llama-server has 3 bytes, manifest.json says 4"),
        "0" * 32: ("directory", "bin/llama-server, listed in manifest.json, is missing"),
        "1" * 32: ("list", "manifest.json: 'artifacts' is not a table of files"),
        "2" * 32: ("no size", "manifest.json: artifact bin/llama-server has no size"),
        "4" * 32: ("recipe a string", "manifest.json: 'recipe' is not a table"),
        "5" * 32: ("patches unnamed", "manifest.json: 'patches' holds an entry with no name"),
    }
    for key, (damage, _) in cases.items():
        build = lf_home / "builds" / key
        (build / "bin").mkdir(parents=True)
        artifacts: Any = {"bin/llama-server": {"sha256": "0" * 64, "size": 4}}
        if damage == "short":
            (build / "bin" / "llama-server").write_bytes(b"abc")
        elif damage == "directory":
            (build / "bin" / "llama-server").mkdir()
        elif damage == "list":
            artifacts = ["bin/llama-server"]
        elif damage == "no size":
            artifacts = {"bin/llama-server": "x"}
        shapes: dict[str, Any] = {
            "recipe a string": {"recipe": "default"},  # smoke raised AttributeError on these two
            "patches unnamed": {"patches": [3]},
        }.get(damage, {})
        manifest = {**_manifest(key), "artifacts": artifacts, **shapes}
        (build / "manifest.json").write_text(json.dumps(manifest), "utf-8")
    whole = lf_home / "builds" / ("3" * 32)
    (whole / "bin").mkdir(parents=True)
    (whole / "bin" / "llama-server").write_bytes(b"abcd")
    listed = {"bin/llama-server": {"sha256": "0" * 64, "size": 4}}
    (whole / "manifest.json").write_text(json.dumps({**_manifest(whole.name), "artifacts": listed}), "utf-8")
    # a forced rebuild moves the old entry aside under a hidden name first: a crash there leaves it behind
    retired = lf_home / "builds" / f".retired-{whole.name}-build-x"
    shutil.copytree(whole, retired)
    manifests, broken = scan_builds()
    assert [item["key"] for item in manifests] == [whole.name]
    assert {entry.path.name: entry.error for entry in broken} == {
        **{key: error for key, (_, error) in cases.items()},
        retired.name: "left over from a forced rebuild that was interrupted, no build of the store: remove it",
    }
    for key, (_, error) in cases.items():
        with pytest.raises(CacheError, match=f"build {key} is damaged: {error}") as refused:
            find_build(key)
        assert "--force" in (refused.value.hint or "")


def test_a_damaged_build_directory_given_to_smoke_is_named(lf_home: Path, tmp_path: Path) -> None:
    """`smoke --build DIR` with a manifest that is not JSON, or no object, raised a traceback; one listing a
    binary the directory lacks blamed the recipe's targets."""
    from llamaforge.build.store import read_build_manifest
    from llamaforge.smoke.builds import resolve_build

    build = tmp_path / "copied-build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "llama-server").write_bytes(b"abcd")
    manifest = {**_manifest("a" * 32), "artifacts": {"bin/llama-server": {"sha256": "0" * 64, "size": 4}}}
    (build / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert read_build_manifest(build)["key"] == "a" * 32  # a copy out of the store keeps its key
    assert resolve_build(str(build), "docker", OperationContext())[:2] == ("a" * 32, build)
    for damage, problem in (
        ("{", "manifest.json is not JSON"),
        ("[1]", r"manifest.json is not a build manifest \(no key\)"),
        (None, "bin/llama-server, listed in manifest.json, is missing"),
    ):
        if damage is None:
            (build / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
            (build / "bin" / "llama-server").unlink()
        else:
            (build / "manifest.json").write_text(damage, encoding="utf-8")
        with pytest.raises(CacheError, match=f"build directory {build} is damaged: {problem}") as refused:
            resolve_build(str(build), "docker", OperationContext())
        assert "copy the build again" in (refused.value.hint or "")


# --- doctor and a running build container -----------------------------------------------------------------------


@pytest.fixture
def build_container(docker_engine: Any, base_image: str) -> Iterator[Any]:
    """A container labelled like a build's, running ``sleep``; removed by its id afterwards."""
    import docker.errors

    from llamaforge.runners.engine import LABEL

    container = docker_engine.containers.run(
        base_image,
        ["sleep", "300"],
        labels={LABEL: "1", "org.llamaforge.role": "build"},
        detach=True,
        network_mode="none",
        init=True,
    )
    try:
        yield container
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_engine.containers.get(container.id).remove(force=True)


def _container_checks(short_id: str) -> dict[str, dict[str, str]]:
    from llamaforge.build.doctor import run_doctor

    return {check.name: check.__dict__ for check in run_doctor() if short_id in check.detail + check.hint}


@pytest.mark.docker
def test_doctor_never_calls_a_running_build_container_leftover(build_container: Any) -> None:
    short_id = build_container.short_id
    running = _container_checks(short_id)
    assert list(running) == ["running containers"], running
    check = running["running containers"]
    assert f"{short_id} (build " in check["detail"] and "running)" in check["detail"]
    assert "rm" not in check["hint"] and f"docker stop {short_id}" in check["hint"]
    assert "Ctrl-C" in check["hint"]
    build_container.stop(timeout=1)
    stopped = _container_checks(short_id)
    assert list(stopped) == ["containers"], stopped
    assert (
        f"docker rm {short_id}" in stopped["containers"]["hint"] and "-f" not in stopped["containers"]["hint"]
    )


# --- a bare smoke says it starts a cold build ---------------------------------------------------------------------


class _Stop(Exception):
    """Raised by the test's reporter at the first event, so nothing after it runs."""


def _resolve_default(events: list[Event], *, cache_hit_passes: bool = False) -> None:
    """Resolve smoke's default build, stopping at the first event (only a cache hit may pass): a build would
    report before starting anything, so none starts."""
    from llamaforge.smoke.builds import resolve_build

    def reporter(event: Event) -> None:
        events.append(event)
        if not (cache_hit_passes and event.message.startswith("cache hit")):
            raise _Stop

    resolve_build(None, "docker", OperationContext(reporter=reporter))


@pytest.mark.docker
def test_bare_smoke_says_it_starts_a_cold_build(lf_home: Path, docker_engine: Any) -> None:
    events: list[Event] = []
    with pytest.raises(_Stop):
        _resolve_default(events)
    assert events[0].kind == "warning", events
    note = events[0].message
    assert "no --build given" in note and "building it now, cold" in note and "--build KEY" in note
    assert "474 compile steps: 61 minutes on a loaded 2-core machine" in note
    assert not (lf_home / "builds").exists()


@pytest.mark.docker
def test_smoke_with_the_default_build_in_store_gives_no_cold_note(
    monkeypatch: pytest.MonkeyPatch, patched_build: Path, build_env: dict[str, str]
) -> None:
    store = build_env["LLAMAFORGE_HOME"]  # the suite's store, which holds the default build
    monkeypatch.setenv("LLAMAFORGE_HOME", store)
    events: list[Event] = []
    try:
        _resolve_default(events, cache_hit_passes=True)
    except _Stop:
        pytest.skip(f"the default build is not in {store}: {events[-1].message}")
    assert [event.kind for event in events] == ["info"], events


def test_a_lock_file_that_is_a_directory_is_named(lf_home: Path, tmp_path: Path) -> None:
    """A directory where a cache's lock file goes (a build's, a download's, a source's) raised IsADirectoryError
    from filelock when the lock was taken."""
    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source, source_id
    from llamaforge.build.store import build_lock
    from llamaforge.models import store as modelstore
    from llamaforge.models.fetch import fetch_model

    source = load_recipe("default").source
    model = write_tiny_model(
        tmp_path / "m.gguf", TinyModelSpec(arch="qwen3"), write_mini_vocab(tmp_path / "v")
    )
    recipe = tmp_path / "m.toml"
    recipe.write_text(f'source = "{model.path.as_uri()}"\nsha256 = "{model.sha256}"\n', encoding="utf-8")
    key = modelstore.key_for(model.sha256)
    for lock, take in (
        (lf_home / "locks" / f"{'a' * 32}.lock", lambda: build_lock("a" * 32).acquire()),
        (lf_home / "sources" / f"{source_id(source)}.lock", lambda: fetch_source(source)),
        (lf_home / "models" / "partial" / f"{key}.lock", lambda: fetch_model(str(recipe))),
    ):
        lock.mkdir(parents=True)
        with pytest.raises(CacheError, match=f"lock file {lock} is not a regular file") as caught:
            take()
        assert "remove it" in (caught.value.hint or "")
        lock.rmdir()
