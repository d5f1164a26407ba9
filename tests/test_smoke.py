"""Smoke runs (`invoke smoke`, `invoke smoke.compare`).

Unit tests need no llama.cpp: llama-bench parsing runs on JSON captured from the real b11312 binary
(tests/data/smoke/, from `llama-bench -m tiny-qwen3.gguf -p 64 -n 32 -r 3 -t 1 -o json` and friends on the
tiny models of llamaforge.gguf.tiny), and percentiles, thresholds, the verdict, the report files and the
comparison run on synthetic reports. The integration tests smoke the default (patched, CPU variants) build with
the model `nox -s smoke` smokes, the tiny Q4_0 qwen3 (so the CPU's quantized kernels run, and every CPU module in
the sweep): end to end through `invoke`, and the server's cleanup when it fails to load, when cancelled, and on a
busy port.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from helpers import invoke, unloadable_model
from llamaforge.core.errors import Cancelled, InvalidOption, SmokeFailed, ToolFailed
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf.header import read_header
from llamaforge.runners.process import ProcessHandle, ProcessResult
from llamaforge.serve import launcher
from llamaforge.serve.bandwidth import TokenBytes, bytes_per_token
from llamaforge.serve.launcher import free_port, port_is_free
from llamaforge.smoke.bench import bench_command, parse_llama_bench
from llamaforge.smoke.report import (
    compare_runs,
    comparison_rows,
    render_compare,
    render_summary,
    resolve_run,
    write_run_files,
)
from llamaforge.smoke.roofline import Bandwidth, gpu_bandwidth, probe_cpu_bandwidth, roofline
from llamaforge.smoke.run import SmokeOptions, SmokeTarget, run_smoke
from llamaforge.smoke.server import ChatRequest, LevelRun, RequestSample
from llamaforge.smoke.verdict import (
    SmokeThresholds,
    distribution,
    evaluate,
    parse_threshold_items,
    percentile,
    resolve_thresholds,
    summarize_level,
)

pytestmark = pytest.mark.quick

DATA = Path(__file__).parent / "data" / "smoke"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRUNCATED = (DATA / "llama-bench-qwen3.json").read_text(encoding="utf-8")[:900]


# --- llama-bench JSON --------------------------------------------------------------------------------------


def test_parse_llama_bench_dense() -> None:
    run = parse_llama_bench((DATA / "llama-bench-qwen3.json").read_text(encoding="utf-8"))
    assert (run.build_commit, run.build_number, run.backends) == ("0c1e570", 11312, "CPU")
    assert (run.model_size, run.model_n_params, run.n_threads) == (39044608, 19521920, 1)
    assert run.model_type == "qwen3 ?B F16"
    pp, tg = run.test("pp"), run.test("tg")
    assert pp is not None and tg is not None
    assert (pp.name, pp.n_prompt, pp.n_gen) == ("pp64", 64, 0)
    assert (tg.name, tg.n_prompt, tg.n_gen) == ("tg32", 0, 32)
    assert tg.avg_ts == pytest.approx(63.03914) and tg.stddev_ts == pytest.approx(8.472892)
    assert len(tg.samples_ts) == len(tg.samples_ns) == 3
    # llama-bench's avg_ts is the mean of its per-repetition samples
    assert np.mean(tg.samples_ts) == pytest.approx(tg.avg_ts, rel=1e-4)


def test_parse_llama_bench_moe() -> None:
    run = parse_llama_bench((DATA / "llama-bench-qwen3moe.json").read_text(encoding="utf-8"))
    assert run.model_type.startswith("qwen3moe")
    assert [t.name for t in run.tests] == ["pp32", "tg16"]
    assert all(len(t.samples_ts) == 2 for t in run.tests)


def test_parse_llama_bench_names_pg_and_depth_like_compare_llama_bench() -> None:
    run = parse_llama_bench((DATA / "llama-bench-qwen3-pg-depth.json").read_text(encoding="utf-8"))
    assert [t.name for t in run.tests] == [
        "pp32",
        "tg16",
        "pp32+tg16",
        "pp32 @ d64",
        "tg16 @ d64",
        "pp32+tg16 @ d64",
    ]
    assert [t.kind for t in run.tests] == ["pp", "tg", "pg", "pp", "tg", "pg"]
    assert run.test("tg") is run.tests[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no valid JSON"),
        (TRUNCATED, "no valid JSON"),  # llama-bench crashed mid-run
        ("[]", "no test results"),
        ('[{"n_prompt": 64}]', "lacks an expected field"),
    ],
)
def test_parse_llama_bench_refuses_broken_output(text: str, message: str) -> None:
    with pytest.raises(SmokeFailed, match=message):
        parse_llama_bench(text)


def test_bench_command() -> None:
    command = bench_command(Path("/b/llama-bench"), Path("/m.gguf"), pp=64, tg=32, repetitions=3, threads=2)
    assert command == [
        "/b/llama-bench",
        "-m",
        "/m.gguf",
        "-p",
        "64",
        "-n",
        "32",
        "-r",
        "3",
        "-o",
        "json",
        "-t",
        "2",
    ]
    assert "-t" not in bench_command(Path("b"), Path("m"), pp=1, tg=1, repetitions=1, threads=None)


# --- percentiles -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 5, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 10, 101):
        values = list(rng.exponential(10.0, n))
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_hand_checked() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 0.0], 95) == pytest.approx(9.5)  # order does not matter
    assert percentile([5.0], 95) == 5.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_distribution() -> None:
    assert distribution([]) is None
    dist = distribution([1.0, 3.0, 2.0])
    assert dist == {"n": 3, "min": 1.0, "p50": 2.0, "p95": pytest.approx(2.9), "max": 3.0, "mean": 2.0}


# --- thresholds and verdict --------------------------------------------------------------------------------


def test_threshold_items_and_layers(tmp_path: Path) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text('min_tg_tps = 40.0\nnon_empty_answer = "Say yes."\n', encoding="utf-8")
    cli = parse_threshold_items([str(toml), "max_ttft_ms=250", "non_empty_answer=none"])
    assert cli == {"min_tg_tps": 40.0, "non_empty_answer": None, "max_ttft_ms": "250"}
    thresholds, sources = resolve_thresholds(
        [("build recipe", {"min_tg_tps": 5, "max_ttft_ms": 900}), ("model recipe", None), ("cli", cli)]
    )
    assert thresholds == SmokeThresholds(min_tg_tps=40.0, max_ttft_ms=250.0, non_empty_answer=None)
    assert sources == {"min_tg_tps": "cli", "max_ttft_ms": "cli", "non_empty_answer": "cli"}
    defaults, sources = resolve_thresholds([("build recipe", {"max_ttft_ms": 900})])
    assert defaults.min_tg_tps == 1.0 and defaults.non_empty_answer
    assert sources == {"min_tg_tps": "default", "max_ttft_ms": "build recipe", "non_empty_answer": "default"}


def test_thresholds_refuse_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="unknown threshold 'min_tg_tp'") as error:
        resolve_thresholds([("cli", {"min_tg_tp": 1})])
    assert "did you mean 'min_tg_tps'" in (error.value.hint or "")
    with pytest.raises(InvalidOption, match="max_ttft_ms"):
        resolve_thresholds([("cli", {"max_ttft_ms": "-3"})])
    with pytest.raises(InvalidOption, match="neither KEY=VALUE nor a TOML file"):
        parse_threshold_items([str(tmp_path / "missing.toml")])


def test_smoke_options_are_bounded() -> None:
    with pytest.raises(InvalidOption, match="a smoke, not a load test"):
        SmokeOptions(requests=10_000)
    with pytest.raises(InvalidOption, match="concurrency"):
        SmokeOptions(concurrency=(0,))


def _sample(
    index: int,
    concurrency: int,
    ttft: float,
    *,
    error: str | None = None,
    reply: str = "x y z",
    tps: float = 50.0,
) -> RequestSample:
    return RequestSample(
        index=index,
        concurrency=concurrency,
        ttft_ms=ttft,
        e2e_ms=ttft + 600,
        itl_ms=[20.0, 20.0, 22.0],
        chunks=4,
        completion_tokens=4 if error is None else 0,
        prompt_tokens=30,
        decode_tps=tps,
        reply=reply,
        server_timings={"prompt_ms": ttft - 5, "predicted_per_second": tps, "prompt_per_second": 900.0},
        error=error,
    )


def _report(ttfts: list[float], tg: float = 60.0, reply: str = "Paris") -> dict[str, Any]:
    levels = []
    for concurrency in (1, 2):
        run = LevelRun(
            concurrency, 2.0, [_sample(i, concurrency, t * concurrency) for i, t in enumerate(ttfts)]
        )
        levels.append({**summarize_level(run), "samples": [vars(s) for s in run.samples]})
    return {
        "run_id": "R",
        "host": {"platform": "Linux", "cpus": 2},
        "wall_s": 3.0,
        "build": {"key": "k" * 32, "recipe": "default", "backend": "cpu", "patches": []},
        "model": {"label": "tiny-qwen3", "size": 2**20, "type": "qwen3 ?B F16", "n_params": 19521920},
        "bench": {
            **json.loads('{"build_commit": "0c1e570", "build_number": 11312, "backends": "CPU"}'),
            "n_threads": 1,
            "tests": [
                {"name": "pp64", "kind": "pp", "avg_ts": 3000.0, "stddev_ts": 10.0, "samples_ts": [3000.0]},
                {"name": "tg32", "kind": "tg", "avg_ts": tg, "stddev_ts": 1.0, "samples_ts": [tg]},
            ],
        },
        "server": {
            "port": 1,
            "startup_s": 1.0,
            "levels": levels,
            "non_empty_answer": {"reply": reply, "error": None},
        },
        "roofline": {
            "efficiency": 0.5,
            "measured_tg_tps": tg,
            "bandwidth_gbs": 10.0,
            "bandwidth_source": "given",
            "bytes_per_token": 2**20,
            "roof_tps": 2 * tg,
            "notes": [],
        },
    }


def test_summarize_level_cross_checks_server_timings() -> None:
    run = LevelRun(2, 2.0, [_sample(0, 2, 100.0), _sample(1, 2, 300.0), _sample(2, 2, 0, error="HTTP 500")])
    level = summarize_level(run)
    assert level["requests"] == 3 and level["errors"] == ["HTTP 500"]
    assert level["completion_tokens"] == 8 and level["aggregate_tps"] == 4.0
    assert level["ttft_ms"]["p50"] == 200.0 and level["ttft_ms"]["n"] == 2
    assert level["itl_ms"]["n"] == 6 and level["itl_ms"]["max"] == 22.0
    cross = level["cross_check"]
    assert cross["client_over_server_decode"]["p50"] == 1.0
    assert cross["ttft_minus_server_prompt_ms"]["p50"] == 5.0


def test_verdict() -> None:
    thresholds, sources = resolve_thresholds([("cli", {"min_tg_tps": 50, "max_ttft_ms": 150})])
    verdict = evaluate(_report([100.0, 120.0]), thresholds, sources)
    assert verdict["passed"]
    assert [(c["name"], c["status"]) for c in verdict["checks"]] == [
        ("min_tg_tps", "pass"),
        ("max_ttft_ms", "pass"),
        ("no_failed_requests", "pass"),
        ("non_empty_answer", "pass"),
    ]
    assert verdict["checks"][1]["value"] == pytest.approx(119.0)  # p95 at concurrency 1, not 2
    assert verdict["checks"][0]["source"] == "cli" and verdict["checks"][3]["source"] == "default"

    slow = evaluate(_report([100.0, 400.0], tg=10.0), thresholds, sources)
    assert not slow["passed"]
    assert {c["name"] for c in slow["checks"] if c["status"] == "fail"} == {"min_tg_tps", "max_ttft_ms"}

    silent = evaluate(_report([100.0], reply="  \n"), thresholds, sources)
    assert [c["name"] for c in silent["checks"] if c["status"] == "fail"] == ["non_empty_answer"]

    broken = _report([100.0])
    broken["server"]["levels"][0]["errors"] = ["ConnectionResetError: reset"]
    assert [c["name"] for c in evaluate(broken, thresholds, sources)["checks"] if c["status"] == "fail"] == [
        "no_failed_requests"
    ]


def test_verdict_skips_checks_of_stages_that_did_not_run() -> None:
    thresholds, sources = resolve_thresholds([])
    verdict = evaluate({"bench": None, "server": None}, thresholds, sources)
    assert verdict["passed"]
    assert {c["status"] for c in verdict["checks"]} == {"skipped"}


# --- report files and compare ------------------------------------------------------------------------------


def test_report_files_and_summary(tmp_path: Path) -> None:
    report = _report([100.0, 120.0], reply="Par|is\nnext")
    report["verdict"] = evaluate(report, *resolve_thresholds([]))
    files = write_run_files(report, tmp_path)
    for name in ("report.json", "summary.md", "throughput.png", "latency.png"):
        assert Path(files[name]).is_file()
    for name in ("throughput.png", "latency.png"):
        assert Path(files[name]).read_bytes()[:8] == PNG_MAGIC
    assert json.loads(Path(files["report.json"]).read_text(encoding="utf-8"))["files"] == files
    summary = render_summary(report)
    assert summary.startswith("# Smoke run R: PASS")
    assert "| tg32 | 60.0 | 1.0 | 60.0 |" in summary
    assert "Par\\|is next" in summary  # a reply cannot break the Markdown table
    assert "## Roofline (estimated)" in summary and "50.0 % of the memory roofline" in summary


def test_comparison_rows_ratios() -> None:
    a, b = _report([100.0, 100.0], tg=50.0), _report([50.0, 50.0], tg=100.0)
    rows = {row["metric"]: row for row in comparison_rows(a, b)}
    tg = rows["llama-bench tg32"]
    assert (tg["a"], tg["b"], tg["ratio"], tg["speedup"], tg["better"]) == (50.0, 100.0, 2.0, 2.0, "B")
    ttft = rows["c=1 TTFT p50"]
    # latency down: B is better, so the speedup is A / B
    assert ttft["ratio"] == pytest.approx(0.5) and ttft["speedup"] == pytest.approx(2.0)
    assert rows["llama-bench pp64"]["better"] == "same"
    assert rows["roofline efficiency (est.)"]["speedup"] == 1.0
    assert {"c=2 ITL p95", "c=2 aggregate", "c=1 decode p50", "c=1 e2e p50"} <= set(rows)
    reverse = {row["metric"]: row for row in comparison_rows(b, a)}
    assert reverse["llama-bench tg32"]["better"] == "A"


def test_compare_runs_writes_files(tmp_path: Path) -> None:
    for run_id, tg in (("20260101T000000Z-a", 50.0), ("20260101T000001Z-b", 55.0)):
        report = {**_report([100.0], tg=tg), "run_id": run_id}
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "report.json").write_text(json.dumps(report), encoding="utf-8")
    assert resolve_run("20260101T000001", tmp_path) == tmp_path / "20260101T000001Z-b"
    with pytest.raises(InvalidOption, match="2 smoke runs match"):
        resolve_run("2026", tmp_path)
    data = compare_runs("20260101T000000Z-a", str(tmp_path / "20260101T000001Z-b"), tmp_path)
    assert data["differs"] == []
    tg = next(row for row in data["rows"] if row["metric"] == "llama-bench tg32")
    assert tg["ratio"] == pytest.approx(1.1)
    for path in data["files"].values():
        assert Path(path).is_file()
    assert Path(data["files"]["compare.png"]).read_bytes()[:8] == PNG_MAGIC
    markdown = render_compare(data)
    assert "| llama-bench tg32 | t/s | 50.0 | 55.0 | 1.100 | 1.100 | B |" in markdown


def test_compare_refuses_damaged_reports_and_names_its_files_by_the_run_directories(tmp_path: Path) -> None:
    good = tmp_path / "runs" / "20260101T000000Z-a"
    good.mkdir(parents=True)
    (good / "report.json").write_text(json.dumps({**_report([100.0]), "run_id": good.name}), encoding="utf-8")
    damaged = {
        "not-json": "{",
        "a-list": "[]",
        "no-build": json.dumps({key: v for key, v in _report([100.0]).items() if key != "build"}),
        "bench-a-string": json.dumps({**_report([100.0]), "bench": "x"}),
    }
    for name, text in damaged.items():
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "report.json").write_text(text, encoding="utf-8")
        with pytest.raises(InvalidOption, match=f"{name}/report.json is not a smoke report"):
            compare_runs(good.name, name, tmp_path / "runs")
    # A run_id in a report names no path: the files go under compare/, named by the directories.
    escaping = tmp_path / "runs" / "escaping"
    escaping.mkdir()
    report = {**_report([100.0]), "run_id": "../../../escaped"}
    (escaping / "report.json").write_text(json.dumps(report), encoding="utf-8")
    data = compare_runs(good.name, "escaping", tmp_path / "runs")
    assert (
        Path(data["files"]["compare.json"]).parent
        == tmp_path / "runs" / "compare" / f"{good.name}--vs--escaping"
    )
    assert not list(tmp_path.glob("escaped*")) and not list(tmp_path.parent.glob("escaped*"))


# --- roofline ----------------------------------------------------------------------------------------------


def _moe_gguf(path: Path, *, tied: bool = False) -> None:
    writer = gguf.GGUFWriter(path, "qwen3moe")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_expert_count(4)
    writer.add_expert_used_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((100, 8), dtype=np.float32))  # 100 rows of 32 bytes
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), dtype=np.float16))  # 128 bytes
    writer.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 16, 8), dtype=np.float16))  # 1024 bytes
    if not tied:
        writer.add_tensor("output.weight", np.zeros((100, 8), dtype=np.float16))  # 1600 bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bytes_per_token_counts_dense_one_embedding_row_and_active_experts(tmp_path: Path) -> None:
    _moe_gguf(tmp_path / "m.gguf")
    counted = bytes_per_token(read_header(tmp_path / "m.gguf"), kv_depth=10)
    assert (counted.dense, counted.experts_active, counted.embedding_row) == (128 + 1600, 1024 // 4, 32)
    assert counted.weights == 128 + 1600 + 256 + 32
    assert counted.kv_cache == 1 * 10 * 1 * (4 + 4) * 2  # layers x depth x kv heads x (k + v) x f16
    assert counted.total == counted.weights + counted.kv_cache
    assert any("1 of 4 experts" in note for note in counted.notes)
    _moe_gguf(tmp_path / "tied.gguf", tied=True)
    tied = bytes_per_token(read_header(tmp_path / "tied.gguf"), kv_depth=0)
    assert tied.dense == 128 + 3200 and tied.embedding_row == 0  # the output matmul reads the whole table
    assert any("tied embeddings" in note for note in tied.notes)


def test_roofline_math_and_labels() -> None:
    token_bytes = TokenBytes(
        dense=10**8, experts_active=0, embedding_row=0, kv_cache=0, recurrent_state=0, kv_depth=0.0
    )
    result = roofline(50.0, Bandwidth(20.0, "given: --bandwidth-gbs"), token_bytes)
    assert result["roof_tps"] == pytest.approx(200.0) and result["efficiency"] == pytest.approx(0.25)
    assert result["estimated"] == ["bytes_per_token"]
    measured = roofline(50.0, Bandwidth(20.0, "measured: x", {"l3_bytes": 2 * 10**8}), token_bytes)
    assert measured["estimated"] == ["bytes_per_token", "bandwidth"]
    assert any("L3 cache" in note for note in measured["notes"])


def test_gpu_bandwidth_table() -> None:
    assert gpu_bandwidth("NVIDIA GeForce RTX 4090") == Bandwidth(
        1008, "spec sheet: GeForce RTX 4090 (peak, not measured)"
    )
    ti = gpu_bandwidth("NVIDIA GeForce RTX 3060 Ti, NVIDIA GeForce RTX 3090")
    assert ti is not None and ti.gbs == 448  # the first GPU, and the longest matching name
    assert gpu_bandwidth("Some Unknown Accelerator") is None


def test_cpu_bandwidth_probe_measures_something() -> None:
    bandwidth = probe_cpu_bandwidth(1, repeats=2, per_thread_bytes=16 * 2**20)
    assert bandwidth.gbs > 0.1 and bandwidth.source.startswith("measured")
    assert bandwidth.details["bytes_per_round"] == 2 * 16 * 2**20


# --- server helpers and registry ---------------------------------------------------------------------------


def test_ports() -> None:
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert not port_is_free(port)


def test_chat_request_streams_without_prompt_cache() -> None:
    body = ChatRequest("hi", 16).body()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["cache_prompt"] is False and body["ignore_eos"] is True and body["max_tokens"] == 16
    assert ChatRequest("hi", 16, ignore_eos=False).body()["ignore_eos"] is False


def test_operations_are_registered_and_invoke_has_both_tasks() -> None:
    from llamaforge.fronts.cli import namespace

    assert operations()["smoke"].long_running and operations()["smoke.compare"].positional == (
        "run_a",
        "run_b",
    )
    names = namespace().task_names
    assert "smoke.compare" in names and "smoke" in names.get("smoke.smoke", [])


# --- integration: the default build and the tiny Q4_0 qwen3 ---------------------------------------------


def _children_named(name: str) -> list[int]:
    """Live child processes of this test process whose command is ``name``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
            comm = (stat.parent / "comm").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and comm == name and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="session")
def smoke_model(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> Path:
    """The default smoke model's spec (the tiny qwen3 with Q4_0 matrices), written for this session."""
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
    from llamaforge.models.tiny import SMOKE_MODEL_DTYPE

    path = tmp_path_factory.mktemp("smoke-model") / "tiny-qwen3-q4_0.gguf"
    spec = TinyModelSpec(arch="qwen3", dtype=SMOKE_MODEL_DTYPE)
    write_tiny_model(path, spec, source_tree / "models" / "ggml-vocab-qwen2.gguf")
    return path


@pytest.fixture
def smoke_env(lf_home: Path) -> Iterator[dict[str, str]]:
    yield {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}


def _run_op(name: str, ctx: OperationContext | None = None, **params: Any) -> dict[str, Any]:
    op = operations()[name]
    return result_json(op.run(op.params.model_validate(params), ctx or OperationContext()))


@pytest.mark.docker
@pytest.mark.llamacpp
def test_smoke_end_to_end(patched_build: Path, smoke_model: Path, smoke_env: dict[str, str]) -> None:
    # 128 tokens: the Q4_0 model decodes some 3000 t/s here, and a 16-token reply (5 ms) can reach the client in
    # one burst on a loaded machine, which makes the client/server decode ratio meaningless (seen: 55).
    args = [
        "--build",
        str(patched_build),
        "--model",
        str(smoke_model),
        "--threads",
        "1",
        "--repetitions",
        "2",
        "--requests",
        "3",
        "--max-tokens",
        "128",
        "--json",
    ]
    result = invoke("smoke", *args, env=smoke_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["verdict"]["passed"] and data["exit_code"] == 0
    tests = {t["kind"]: t for t in data["bench"]["tests"]}
    assert tests["pp"]["avg_ts"] > 0 and tests["tg"]["avg_ts"] > 0 and len(tests["tg"]["samples_ts"]) == 2
    assert data["bench"]["build_commit"] == "0c1e570" and data["model"]["n_params"] > 0
    assert data["model"]["type"].endswith("Q4_0"), data["model"]  # llama.cpp read a quantized file
    server = data["server"]
    assert [level["concurrency"] for level in server["levels"]] == [1, 2]
    for level in server["levels"]:
        assert level["errors"] == [] and level["completion_tokens"] == 3 * 128
        assert level["ttft_ms"]["p50"] > 0 and level["itl_ms"]["p95"] > 0 and level["e2e_ms"]["p50"] > 0
        assert level["decode_tps"]["p50"] > 0 and level["aggregate_tps"] > 0
        assert level["cross_check"]["server_decode_tps"]["p50"] > 0
    at_one = server["levels"][0]["cross_check"]["client_over_server_decode"]["p50"]
    assert 0.5 < at_one < 2.0  # the client's clock agrees with the server's own timings
    assert server["non_empty_answer"]["reply"].strip()
    assert data["roofline"]["efficiency"] > 0 and data["roofline"]["bandwidth_gbs"] > 0
    # The default build loads the best CPU variant: nothing this host has is left unused.
    cpu = data["cpu_features"]
    assert cpu["build_cpu_level"] == "variants" and cpu["variant"] and cpu["source"] == "system_info", cpu
    assert cpu["warning"] is None and cpu["unused"] == [], cpu
    assert {"AVX2", "FMA", "F16C"} & set(cpu["host"]) <= set(cpu["used"]), cpu
    assert data["roofline"]["cpu_diagnosis"].startswith("CPU features: the build uses every one")
    # Every CPU module ran on its own first; the sweep's default pick is the module llama-bench and the server
    # loaded, and the verdict holds the sweep's check.
    sweep = data["cpu_modules"]
    assert sweep["passed"] and len(sweep["modules"]) > 1 and sweep["problems"] == [], sweep["problems"]
    assert any(row["status"] == "ran" and row["tg_tps"] > 0 for row in sweep["modules"])
    assert sweep["default"]["module"] == Path(cpu["loaded_module"]).name, (sweep["default"], cpu)
    checks = {check["name"]: check for check in data["verdict"]["checks"]}
    assert checks["cpu_modules"]["status"] == "pass" and checks["cpu_modules"]["value"] == 0
    summary = Path(data["files"]["summary.md"]).read_text(encoding="utf-8")
    assert "## CPU modules" in summary
    assert f"| {sweep['default']['module']} | yes | **default** | ran |" in summary
    assert not _alive(server["pid"]), "llama-server outlived the smoke run"
    for name in ("report.json", "summary.md", "throughput.png", "latency.png", "server.log", "bench.json"):
        assert Path(data["files"][name]).is_file(), name
    report = json.loads(Path(data["files"]["report.json"]).read_text(encoding="utf-8"))
    assert len(report["server"]["levels"][0]["samples"]) == 3  # raw samples are kept
    assert "listening on http://127.0.0.1" in Path(data["files"]["server.log"]).read_text(encoding="utf-8")

    # a copy of the run is another run with the same figures: every ratio 1.0
    again = Path(data["run_dir"]).with_name(f"{data['run_id']}-again")
    shutil.copytree(data["run_dir"], again)
    compared = invoke("smoke.compare", data["run_id"], str(again), "--json", env=smoke_env)
    assert compared.returncode == 0, compared.stderr[-3000:]
    rows = json.loads(compared.stdout)["rows"]
    assert rows and all(row["ratio"] == pytest.approx(1.0) for row in rows)
    # the run named twice (by id and by path) is refused: its table of 1.0 would read as "no change"
    itself = invoke("smoke.compare", data["run_id"], data["run_dir"], env=smoke_env)
    assert itself.returncode == 2 and "are the same smoke run" in itself.stderr, itself.stderr


@pytest.mark.docker
@pytest.mark.llamacpp
def test_smoke_warns_when_a_baseline_build_leaves_cpu_features_unused(
    baseline_build: Path, smoke_model: Path, lf_home: Path
) -> None:
    from llamaforge.smoke.cpu_features import host_cpu_flags

    host = host_cpu_flags(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    if "avx2" not in host:
        pytest.skip("this host has no AVX2: a baseline build leaves nothing it has unused")
    data = _run_op(
        "smoke",
        build=str(baseline_build),
        model=str(smoke_model),
        threads=1,
        repetitions=1,
        concurrency=[1],
        requests=1,
        max_tokens=4,
        pp=8,
        tg=4,
    )
    cpu = data["cpu_features"]
    assert cpu["build_cpu_level"] == "baseline" and cpu["source"] == "system_info", cpu
    sweep = data["cpu_modules"]  # one CPU level: nothing to sweep, and it says so
    assert sweep["modules"] == [] and "one CPU level" in sweep["note"] and sweep["passed"], sweep
    assert "cpu_modules" not in {check["name"] for check in data["verdict"]["checks"]}
    assert {"AVX", "AVX2", "FMA", "F16C"} <= set(cpu["unused"]), cpu
    assert "AVX2" in cpu["warning"] and "baseline" in cpu["cause"] and 'cpu = "variants"' in cpu["fix"]
    roof = data["roofline"]
    assert roof["estimated"] and roof["cpu_diagnosis"].startswith("warning: the build leaves")
    summary = Path(data["files"]["summary.md"]).read_text(encoding="utf-8")
    assert "## Roofline (estimated)" in summary and "warning: the build leaves" in summary


@pytest.mark.docker
@pytest.mark.llamacpp
def test_model_that_fails_to_load_leaves_no_server(
    patched_build: Path, lf_home: Path, tmp_path: Path
) -> None:
    bad = unloadable_model(tmp_path / "bad.gguf")
    with pytest.raises(ToolFailed, match="llama-server exited with code") as error:
        _run_op("smoke", build=str(patched_build), model=str(bad), skip_bench=True)
    assert error.value.log_path and Path(error.value.log_path).is_file()
    assert error.value.tail  # the reason is shown, not just an exit code
    assert _children_named("llama-server") == []
    report = json.loads((Path(error.value.log_path).parent / "report.json").read_text(encoding="utf-8"))
    assert "llama-server exited" in report["error"]


@pytest.mark.docker
@pytest.mark.llamacpp
def test_cancel_during_server_stage_stops_the_server(
    patched_build: Path, smoke_model: Path, lf_home: Path
) -> None:
    cancel = CancelToken()
    pids: list[int] = []

    def reporter(event: Event) -> None:
        if event.message.startswith("llama-server pid"):
            pids.append(int(event.message.split()[2]))
        if event.message.startswith("server: ") and "concurrency 1" in event.message:
            threading.Timer(0.5, cancel.cancel).start()  # mid-request: 400 tokens take seconds

    ctx = OperationContext(reporter=reporter, cancel=cancel)
    with pytest.raises(Cancelled):
        _run_op(
            "smoke",
            ctx,
            build=str(patched_build),
            model=str(smoke_model),
            skip_bench=True,
            threads=1,
            max_tokens=400,
            requests=4,
            concurrency=[1],
        )
    assert pids and not _alive(pids[0])
    assert _children_named("llama-server") == []


@pytest.mark.docker
@pytest.mark.llamacpp
def test_busy_port_is_replaced(
    patched_build: Path, smoke_model: Path, lf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        common = {
            "build": str(patched_build),
            "model": str(smoke_model),
            "skip_bench": True,
            "threads": 1,
            "requests": 1,
            "max_tokens": 4,
            "concurrency": [1],
            "port": busy,
        }
        seen = _run_op("smoke", **common)["server"]  # found busy before starting the server
        assert seen["busy_ports"] == [busy] and seen["port"] != busy
        # The port is taken between the check and the bind: llama-server fails to bind and is started again.
        monkeypatch.setattr(launcher, "port_is_free", lambda *_: True)
        raced = _run_op("smoke", **common)
        assert raced["server"]["busy_ports"] == [busy] and raced["server"]["port"] != busy
        assert "couldn't bind" in Path(raced["run_dir"], "server.log").read_text(encoding="utf-8")
    assert _children_named("llama-server") == []


# --- the process runner seam ---------------------------------------------------------------------------------


class RecordingRunner:
    """A process runner that starts nothing: it records each argv and answers with llama-bench's JSON."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.calls: list[dict[str, Any]] = []

    def run(self, argv: Sequence[str], **options: Any) -> ProcessResult:
        self.calls.append({"argv": list(argv), **options})
        return ProcessResult(argv=list(argv), exit_code=0, stdout=self.stdout, stderr="", duration_s=0.01)

    def start(self, argv: Sequence[str], **options: Any) -> ProcessHandle:
        raise AssertionError(f"the bench stage starts no long-lived process: {argv}")


def test_smoke_bench_stage_runs_through_an_injected_runner(tmp_path: Path, lf_home: Path) -> None:
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "llama-bench").write_text("#!/bin/sh\nexit 99\n", encoding="utf-8")  # never started
    model = tmp_path / "m.gguf"
    _moe_gguf(model)
    runner = RecordingRunner((DATA / "llama-bench-qwen3.json").read_text(encoding="utf-8"))
    target = SmokeTarget(build_key="f" * 64, build_dir=build, manifest={}, model=model, model_label="m")
    options = SmokeOptions(pp=16, tg=8, repetitions=2, threads=1, skip_server=True, bandwidth_gbs=10.0)
    thresholds, sources = resolve_thresholds([("cli", {"min_tg_tps": 1})])
    report = run_smoke(target, options, thresholds, sources, runner=runner)
    call, cpuinfo = runner.calls  # llama-bench, then the CPU flags of the host it ran on
    assert cpuinfo["argv"] == ["cat", "/proc/cpuinfo"]
    assert call["argv"] == bench_command(
        build / "bin" / "llama-bench", model, pp=16, tg=8, repetitions=2, threads=1
    )
    assert call["timeout_s"] == options.bench_timeout_s and call["log_path"] == Path(
        report["run_dir"], "bench.log"
    )
    assert report["bench"]["build_commit"] == "0c1e570" and report["model"]["type"] == "qwen3 ?B F16"
    assert report["roofline"]["measured_tg_tps"] == pytest.approx(63.03914)
    assert report["verdict"]["passed"]
    assert (
        json.loads(Path(report["run_dir"], "bench.json").read_text(encoding="utf-8"))[0]["build_commit"]
        == "0c1e570"
    )


def test_model_tiny_names_the_default_smoke_model(
    lf_home: Path, sdist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`smoke --model tiny` is the same model as no --model, as `deploy --model tiny` names it."""
    from llamaforge.smoke.ops import SmokeParams, _model_target

    # The tiny model's vocabulary comes from the llama.cpp source.
    monkeypatch.setenv("LLAMAFORGE_SOURCE_MIRROR", str(sdist_dir))
    by_name = _model_target(SmokeParams(model="tiny"), OperationContext())
    by_default = _model_target(SmokeParams(), OperationContext())
    assert by_name == by_default and by_name[0].is_file()
