"""The CPU module sweep (`invoke smoke.cpu-modules`, and the `cpu_modules` part of a smoke report).

Unit tests check how a module's directory is laid out and what a build of one CPU level answers, with no
llama.cpp. The integration tests run the real default (variants) build of b11312 with the tiny Q4_0 qwen3: every
module of its bin/ is listed, the ones this CPU can run give pp and tg, the others are "not for this CPU", the
loader's default pick is named; and a module compiled here whose ggml_backend_init executes an illegal instruction
is named as killed by SIGILL without stopping the sweep. Where the CPU has AMX, the sapphirerapids module runs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from helpers import cpu_header, invoke
from llamaforge.core.errors import OperationFailed
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.runners.process import ProcessHandle, ProcessResult
from llamaforge.smoke.cpu_features import HOST_FLAGS, VARIANT_FEATURES, host_cpu, host_cpu_flags
from llamaforge.smoke.cpu_modules import cpu_modules, stage_module_dir, sweep_cpu_modules
from llamaforge.smoke.ops_cpu_modules import CpuModulesResult, CpuModuleSweep
from llamaforge.smoke.report import cpu_modules_lines

pytestmark = pytest.mark.quick

CPUINFO = Path("/proc/cpuinfo").read_text(encoding="utf-8") if Path("/proc/cpuinfo").is_file() else ""
HOST_FEATURES = {name for name, flag in HOST_FLAGS.items() if flag in host_cpu_flags(CPUINFO)}
HAS_AMX = "amx_tile" in host_cpu_flags(CPUINFO) and "amx_int8" in host_cpu_flags(CPUINFO)
KEPT_MODULES = ("libggml-cpu-sse42.so", "libggml-cpu-x64.so")
TRAP_MODULE = r"""
/* A CPU backend module that ggml's loader prefers to every real one and that dies as it starts: on x86,
   __builtin_trap() is ud2, an illegal instruction (SIGILL). */
int ggml_backend_score(void) { return 1 << 20; }
void *ggml_backend_init(void) { __builtin_trap(); }
"""


# --- unit: the isolated directory, a build of one level --------------------------------------------------------


def _fake_bin(root: Path, names: Sequence[str]) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name in names:
        (bin_dir / name).write_bytes(b"\x7fELF " + name.encode())
    (bin_dir / "libllama.so").symlink_to("libllama.so.0")
    return bin_dir


def test_a_module_directory_holds_llama_bench_and_every_library_but_the_backend_modules(
    tmp_path: Path,
) -> None:
    bin_dir = _fake_bin(
        tmp_path,
        [
            "llama-bench",
            "llama-server",
            "libllama.so.0",
            "libggml-base.so",
            "libggml-base.so.0",
            "libggml.so.0",
            "libggml-rpc.so",
            "libggml-cuda.so",
            "libggml-cpu-haswell.so",
            "libggml-cpu-zen4.so",
        ],
    )
    assert [path.name for path in cpu_modules(bin_dir)] == ["libggml-cpu-haswell.so", "libggml-cpu-zen4.so"]
    exe = stage_module_dir(bin_dir / "llama-bench", tmp_path / "stage" / "haswell")
    staged = sorted(path.name for path in exe.parent.iterdir())
    # No backend module at all: a GPU backend would take the work away from the CPU module under test.
    assert staged == [
        "libggml-base.so",
        "libggml-base.so.0",
        "libggml.so.0",
        "libllama.so",
        "libllama.so.0",
        "llama-bench",
    ]
    # A real file, not a symlink: ggml reads the executable's directory from /proc/self/exe, symlinks resolved.
    assert not exe.is_symlink() and exe.read_bytes() == (bin_dir / "llama-bench").read_bytes()
    assert (exe.parent / "libllama.so").resolve() == (bin_dir / "libllama.so.0").resolve()


class NoProcesses:
    """A runner that fails the test if anything is started."""

    def run(self, argv: Sequence[str], **options: Any) -> ProcessResult:
        raise AssertionError(f"a build without CPU modules starts nothing: {argv}")

    def start(self, argv: Sequence[str], **options: Any) -> ProcessHandle:
        raise AssertionError(f"a build without CPU modules starts nothing: {argv}")


def test_a_build_of_one_cpu_level_gets_a_clear_answer(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path, ["llama-bench", "libggml-cpu.so", "libggml-base.so"])
    sweep = sweep_cpu_modules(
        bin_dir / "llama-bench",
        tmp_path / "m.gguf",
        tmp_path / "logs",
        cpu_level="x86-64-v3",
        runner=NoProcesses(),
    )
    assert sweep["modules"] == [] and sweep["passed"] and sweep["default"] is None
    assert "one CPU level (x86-64-v3)" in sweep["note"] and "nothing to sweep" in sweep["note"]
    assert cpu_modules_lines(sweep)[-1] == sweep["note"]
    assert CpuModuleSweep.model_validate(sweep).note == sweep["note"]  # the shape smoke's result publishes


def _row(variant: str, status: str, outcome: str, **extra: Any) -> dict[str, Any]:
    row = {
        "module": f"libggml-cpu-{variant}.so",
        "variant": variant,
        "status": status,
        "outcome": outcome,
        "loaded": status == "ran",
        "default": False,
        "signal": None,
        "exit": "exit code 0",
        "pp_tps": None,
        "tg_tps": None,
        "missing": [],
        "detail": "",
        "hint": None,
        "log": "/l",
        "wall_s": 0.5,
    }
    return {**row, **extra}


def test_every_view_shows_the_table_and_names_the_crash() -> None:
    from rich.console import Console

    from llamaforge.fronts.render_html import render_html
    from llamaforge.smoke.render import cpu_modules_cli

    crash = "killed by SIGILL (illegal instruction)"
    sweep = {
        "bin_dir": "/b",
        "model": "/m.gguf",
        "cpu": {"model": "Some CPU", "features": ["AVX2"]},
        "options": {"pp": 16, "tg": 8, "repetitions": 1, "threads": 1},
        "note": None,
        "passed": False,
        "modules": [
            _row("haswell", "ran", "ran", pp_tps=120.5, tg_tps=30.25, default=True),
            _row(
                "sapphirerapids",
                "not_for_this_cpu",
                "not for this CPU (lacks AMX_INT8)",
                missing=["AMX_INT8"],
            ),
            _row(
                "zen4",
                "crashed",
                f"crashed: {crash}",
                signal="SIGILL",
                exit=crash,
                detail=f"{crash} after loading it",
            ),
        ],
        "default": {
            "module": "libggml-cpu-haswell.so",
            "variant": "haswell",
            "signal": None,
            "exit": "exit code 0",
            "detail": "",
            "hint": None,
            "log": "/d",
        },
        "problems": [f"libggml-cpu-zen4.so: crashed ({crash} after loading it)"],
        "summary": "3 CPU modules: 1 ran, 1 not for this CPU, 1 crashed; the loader picks libggml-cpu-haswell.so",
        "logs": "/logs",
        "wall_s": 2.0,
        "build_key": "k" * 32,
        "model_label": "m",
        "files": {"summary.md": "/s.md"},
        "exit_code": 10,
    }
    markdown = "\n".join(cpu_modules_lines(sweep))
    assert "| libggml-cpu-haswell.so | yes | **default** | ran | 120.5 | 30.2 |  |" in markdown
    assert (
        "| libggml-cpu-sapphirerapids.so | no |  | not for this CPU (lacks AMX_INT8) | - | - |  |" in markdown
    )
    assert (
        f"| libggml-cpu-zen4.so | yes |  | crashed: {crash} | - | - | {crash} after loading it |" in markdown
    )
    console = Console(record=True, width=200)
    cpu_modules_cli(CpuModulesResult.model_validate(sweep), console)
    text = console.export_text()
    assert "FAIL" in text and f"crashed: {crash}" in text and "not for this CPU (lacks AMX_INT8)" in text
    page = render_html("smoke.cpu_modules", sweep)
    assert f"crashed: {crash}" in page and "libggml-cpu-sapphirerapids.so" in page


def test_the_suite_says_which_cpu_it_ran_on() -> None:
    # what the llama.cpp tests exercise depends on the CPU; the run's header names it (pytest_report_header)
    xeon = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: fpu sse3 pni ssse3 avx avx2 f16c fma bmi2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8\n"
    )
    assert host_cpu(xeon) == (
        "Intel(R) Xeon(R) Processor",
        [
            "SSE3",
            "SSSE3",
            "AVX",
            "AVX2",
            "F16C",
            "FMA",
            "BMI2",
            "AVX512",
            "AVX512_VNNI",
            "AVX512_BF16",
            "AMX_INT8",
        ],
    )
    header = cpu_header(xeon)
    assert header.startswith("cpu: Intel(R) Xeon(R) Processor, ") and ", AMX; features: SSE3 " in header
    epyc = "model name\t: AMD EPYC 7B13\nflags\t\t: pni ssse3 avx avx2\n"
    assert ", no AMX; features: SSE3 SSSE3 AVX AVX2" in cpu_header(epyc)
    assert host_cpu("") == ("unknown", [])
    assert cpu_header("").endswith("no AMX; features: none known")


def test_the_operation_is_registered_with_its_cli_spelling_and_mcp_tool() -> None:
    from llamaforge.fronts.cli import namespace

    op = operations()["smoke.cpu_modules"]
    assert op.long_running and not op.read_only and op.render_cli and op.render_html
    assert "smoke.cpu-modules" in namespace().task_names  # what core.exits' crash hints tell people to run


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_mcp_server_has_the_sweep_tool(anyio_backend: str) -> None:
    from mcp import Client

    from llamaforge.fronts.mcp.server import build_server

    async with Client(build_server()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    tool = tools["smoke_cpu_modules"]
    assert "smoke_cpu_modules_start" in tools
    assert {"build", "model", "pp", "tg", "threads"} <= set(tool.input_schema["properties"])
    output = json.dumps(tool.output_schema)
    assert "not_for_this_cpu" in output and "signal" in output and "pp_tps" in output


# --- integration: the real variants build ----------------------------------------------------------------------


# ggml's x86 score (ggml-cpu/arch/x86/cpu-feats.cpp): 1 plus one bit per feature a variant was built with; the
# loader picks the highest. SSSE3 stands for the SSE4.2 every x86 variant above x64 has.
SCORE_BITS = {
    "FMA": 1,
    "F16C": 2,
    "SSSE3": 4,
    "BMI2": 8,
    "AVX": 16,
    "AVX2": 32,
    "AVX_VNNI": 64,
    "AVX512": 128,
    "AVX512_VBMI": 256,
    "AVX512_BF16": 512,
    "AVX512_VNNI": 1024,
    "AMX_INT8": 2048,
}


def _runs_here(variant: str) -> bool:
    """Whether this CPU has every feature of ``variant`` (ggml's variant table, read independently of ggml)."""
    return set(VARIANT_FEATURES[variant]) <= HOST_FEATURES


@pytest.fixture(scope="module")
def variants_sweep(patched_build: Path, build_env: dict[str, str]) -> dict[str, Any]:
    """`invoke smoke.cpu-modules --build DIR --threads 1 --json` on the default build, with the default model
    (the tiny Q4_0 qwen3 written into the test home)."""
    result = invoke(
        "smoke.cpu-modules",
        "--build",
        str(patched_build),
        "--threads",
        "1",
        "--json",
        env=build_env,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.docker
@pytest.mark.llamacpp
def test_the_sweep_runs_every_module_this_cpu_can_run(
    patched_build: Path, variants_sweep: dict[str, Any]
) -> None:
    data = variants_sweep
    names = sorted(path.name for path in (patched_build / "bin").glob("libggml-cpu-*.so"))
    assert len(names) > 1 and [row["module"] for row in data["modules"]] == names
    assert data["model_label"] == "tiny-qwen3-q4_0" and data["passed"] and data["exit_code"] == 0
    for row in data["modules"]:
        if _runs_here(row["variant"]):
            assert row["status"] == "ran" and row["loaded"], row
            assert row["pp_tps"] > 0 and row["tg_tps"] > 0 and row["signal"] is None, row
        else:
            assert row["status"] == "not_for_this_cpu" and not row["loaded"], row
            assert row["missing"] and set(row["missing"]) <= set(VARIANT_FEATURES[row["variant"]]), row
        assert Path(row["log"]).is_file()
    assert any(row["status"] == "ran" for row in data["modules"])
    default = data["default"]
    assert default["module"] in names and default["signal"] is None, default
    if platform.machine() in ("x86_64", "AMD64"):
        runnable = [row["variant"] for row in data["modules"] if _runs_here(row["variant"])]
        best = max(runnable, key=lambda variant: sum(SCORE_BITS.get(f, 0) for f in VARIANT_FEATURES[variant]))
        assert default["variant"] == best, (default, runnable)
    assert [row["module"] for row in data["modules"] if row["default"]] == [default["module"]]
    assert data["cpu"]["model"] in CPUINFO
    summary = Path(data["files"]["summary.md"]).read_text(encoding="utf-8")
    assert "**default**" in summary and default["module"] in summary
    assert f"the loader picks {default['module']}" in data["summary"]


@pytest.mark.docker
@pytest.mark.llamacpp
def test_the_k_quant_kernels_run_in_every_module_this_cpu_can_run(
    patched_build: Path, build_env: dict[str, str]
) -> None:
    """The sweep on `tiny-q4_k_m` (Q4_K and Q6_K matrices, 256 wide): the K-quant kernels of each module, those
    of the reported crash (the AMX ones where the CPU has AMX), not only Q4_0's."""
    result = invoke(
        "smoke.cpu-modules",
        *("--build", str(patched_build), "--model", "tiny-q4_k_m", "--threads", "1", "--json"),
        env=build_env,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(result.stdout)
    assert data["model_label"] == "tiny-qwen3-q4_k_m" and data["passed"], data["problems"]
    ran = [row for row in data["modules"] if row["status"] == "ran"]
    assert {row["variant"] for row in ran} == {
        row["variant"] for row in data["modules"] if _runs_here(row["variant"])
    }
    assert ran and all(row["pp_tps"] > 0 and row["tg_tps"] > 0 and row["signal"] is None for row in ran)
    print(
        f"{data['cpu']['model']}: "
        + ", ".join(f"{r['variant']} pp {r['pp_tps']:.0f} tg {r['tg_tps']:.0f}" for r in ran)
    )


@pytest.mark.docker
@pytest.mark.llamacpp
def test_the_sapphirerapids_module_runs_with_amx(variants_sweep: dict[str, Any]) -> None:
    if not HAS_AMX:
        pytest.skip(
            "this CPU has no AMX (no amx_tile/amx_int8 in /proc/cpuinfo): the sapphirerapids module is "
            "not for this CPU, so its AMX kernels cannot run here"
        )
    row = next(row for row in variants_sweep["modules"] if row["variant"] == "sapphirerapids")
    assert row["status"] == "ran" and row["pp_tps"] > 0 and row["tg_tps"] > 0, row
    assert variants_sweep["default"]["module"] == "libggml-cpu-sapphirerapids.so"


def _compile_trap_module(path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    require(compiler is not None, "no C compiler (cc) to build the crashing test module")
    source = path.with_suffix(".c")
    source.write_text(TRAP_MODULE, encoding="utf-8")
    subprocess.run([str(compiler), "-shared", "-fPIC", "-O1", "-o", str(path), str(source)], check=True)


@pytest.fixture
def trap_build(patched_build: Path, tmp_path: Path) -> Path:
    """A build directory with the default build's binaries and libraries, two of its CPU modules (sse42 and x64,
    which every x86-64 CPU runs: one sorts before the trap module, one after) and a module compiled here that the
    loader ranks first and that executes an illegal instruction in its ggml_backend_init."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the modules kept here (sse42, x64) are x86-64's; this machine is {platform.machine()}")
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for entry in (patched_build / "bin").iterdir():
        if entry.name == "llama-bench":  # a copy: the loader searches the executable's own directory
            shutil.copy2(entry, bin_dir / entry.name)
        elif not entry.name.startswith("libggml-cpu-") or entry.name in KEPT_MODULES:
            (bin_dir / entry.name).symlink_to(entry)
    _compile_trap_module(bin_dir / "libggml-cpu-trap.so")
    return bin_dir.parent


@pytest.fixture
def tiny_q4_0(source_tree: Path, tmp_path: Path) -> Path:
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    vocab = source_tree / "models" / "ggml-vocab-qwen2.gguf"
    spec = TinyModelSpec(arch="qwen3", dtype="q4_0")
    return write_tiny_model(tmp_path / "tiny-q4_0.gguf", spec, vocab).path


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_crashing_module_is_named_with_its_signal_and_the_sweep_goes_on(
    trap_build: Path, tiny_q4_0: Path, lf_home: Path
) -> None:
    op = operations()["smoke.cpu_modules"]
    params = op.params.model_validate({"build": str(trap_build), "model": str(tiny_q4_0), "threads": 1})
    with pytest.raises(OperationFailed, match=r"libggml-cpu-trap\.so: crashed") as failed:
        op.run(params, OperationContext())
    data = result_json(failed.value.result)
    assert failed.value.exit_code == 10 and data["exit_code"] == 10 and not data["passed"]
    assert [row["variant"] for row in data["modules"]] == ["sse42", "trap", "x64"]
    sse42, trap, x64 = data["modules"]
    assert trap["status"] == "crashed" and trap["signal"] == "SIGILL" and not trap["loaded"], trap
    assert trap["exit"] == "killed by SIGILL (illegal instruction)" and trap["pp_tps"] is None
    assert "libggml-cpu-trap.so ran an instruction this CPU cannot" in trap["hint"]
    # The modules before and after it ran: one crash does not stop the sweep.
    for row in (sse42, x64):
        assert row["status"] == "ran" and row["loaded"] and row["pp_tps"] > 0 and row["tg_tps"] > 0, row
    # ggml's loader ranks the trap module first, so every binary of this build dies as it starts: named too.
    assert data["default"]["signal"] == "SIGILL" and data["default"]["module"] is None, data["default"]
    assert data["problems"][0].startswith("libggml-cpu-trap.so: crashed (killed by SIGILL")
    assert "default pick" in data["problems"][-1]
    summary = Path(data["files"]["summary.md"]).read_text(encoding="utf-8")
    assert "| libggml-cpu-trap.so | yes |  | crashed: killed by SIGILL (illegal instruction) |" in summary


@pytest.mark.docker
@pytest.mark.llamacpp
def test_the_cli_exits_10_and_shows_the_crash_in_its_table(
    trap_build: Path, tiny_q4_0: Path, lf_home: Path
) -> None:
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home), "COLUMNS": "220"}
    result = invoke(
        "smoke.cpu-modules",
        "--build",
        str(trap_build),
        "--model",
        str(tiny_q4_0),
        "--threads",
        "1",
        env=env,
        timeout=600,
    )
    assert result.returncode == 10, result.stderr[-3000:]
    shown = result.stdout + result.stderr
    assert "FAIL" in shown and "crashed: killed by SIGILL (illegal instruction)" in shown, shown[-3000:]
    assert "libggml-cpu-x64.so" in shown and "libggml-cpu-sse42.so" in shown
