"""The AMX patch (patches/llama.cpp/0003-ggml-cpu-amx-tile-config-in-rodata.patch), proven in the built module.

On a CPU without AMX nothing can run the tile kernels, but what broke them can be read in the disassembly of
``libggml-cpu-sapphirerapids.so`` (``objdump -d``):

* stock b11312 built with GCC 12 loads its tile configuration (``ldtilecfg``) from the stack, where the compiler
  kept only the zeroing and ``palette_id = 1``: every tile has 0 rows and the first ``tilezero`` raises SIGILL;
* the patched module loads it from a constant whose 64 bytes (read back from the file) hold the rows and the
  column bytes of the eight tiles the kernels use, asks for the tile data permission (``arch_prctl(0x1023,
  18)``) in the same function, before ``ldtilecfg``, and every function that runs tile instructions is reached
  only from a function that loads the configuration first (the per-thread ``ggml_tile_config_init``).

Where the CPU has AMX, the patched module also runs quantized models with AMX, on one thread and two, beside
``--repack 0`` (no AMX buffers) in the same run. Elsewhere those tests are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llamaforge.core.exits import loaded_cpu_module
from llamaforge.gguf.tiny import DType

pytestmark = pytest.mark.llamacpp

MODULE = "libggml-cpu-sapphirerapids.so"
# tile_config_t: palette_id, start_row, 14 reserved bytes, colsb[16] (uint16), rows[16] (uint8).
EXPECTED_ROWS = (8, 8, 16, 16, 16, 16, 16, 16) + (0,) * 8
EXPECTED_COLSB = (64, 64, 32, 32, 64, 64, 64, 64) + (0,) * 8
TILE_MNEMONICS = (
    "tilezero",
    "tileloadd",
    "tileloaddt1",
    "tilestored",
    "tdpbssd",
    "tdpbsud",
    "tdpbusd",
    "tdpbuud",
    "tdpbf16ps",
    "tdpfp16ps",
)
HAS_AMX = "amx_tile" in Path("/proc/cpuinfo").read_text(encoding="utf-8")

_FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_CALL_TARGET = re.compile(r"^([0-9a-f]+) <")


@dataclass
class Function:
    name: str
    instructions: list[tuple[int, str, str]] = field(default_factory=list)  # address, mnemonic, operands

    @property
    def tile_instructions(self) -> list[str]:
        return [m for _, m, _ in self.instructions if m in TILE_MNEMONICS]

    def calls(self) -> set[int]:
        targets = set()
        for _, mnemonic, operands in self.instructions:
            if mnemonic in ("call", "jmp"):
                match = _CALL_TARGET.match(operands)
                if match:
                    targets.add(int(match[1], 16))
        return targets


def disassemble(module: Path) -> dict[int, Function]:
    """The module's functions by start address, from ``objdump -d``."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(module)], capture_output=True, text=True, check=True
    ).stdout
    functions: dict[int, Function] = {}
    current: Function | None = None
    for line in out.splitlines():
        head = _FUNCTION.match(line)
        if head:
            current = functions.setdefault(int(head[1], 16), Function(head[2]))
            continue
        insn = _INSN.match(line)
        if insn and current is not None:
            current.instructions.append((int(insn[1], 16), insn[2], insn[3]))
    return functions


def read_bytes(module: Path, address: int, count: int) -> bytes:
    """``count`` bytes of the module's image at virtual ``address`` (``objdump -s``)."""
    out = subprocess.run(
        [
            "objdump",
            "-s",
            f"--start-address={address:#x}",
            f"--stop-address={address + count:#x}",
            str(module),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = bytearray()
    for line in out.splitlines():
        parts = line.split()
        if (
            len(parts) >= 2
            and re.fullmatch(r"[0-9a-f]+", parts[0])
            and re.fullmatch(r"[0-9a-f]{1,8}", parts[1])
        ):
            start = int(parts[0], 16)
            if start < address or start >= address + count:
                continue
            for word in parts[1:5]:
                if re.fullmatch(r"[0-9a-f]{2,8}", word):
                    data += bytes.fromhex(word)
    return bytes(data[:count])


def loads(functions: dict[int, Function]) -> list[tuple[Function, int, str]]:
    """Every ``ldtilecfg``: the function, its index in the function and its operand."""
    return [
        (function, index, operands)
        for function in functions.values()
        for index, (_, mnemonic, operands) in enumerate(function.instructions)
        if mnemonic == "ldtilecfg"
    ]


@pytest.fixture(scope="module")
def objdump() -> str:
    path = shutil.which("objdump")
    if path is None:
        pytest.skip("objdump (binutils) is not installed")
    return path


def module_of(build: Path) -> Path:
    module = build / "bin" / MODULE
    assert module.is_file(), f"{MODULE} missing from {build}/bin: is this the default (variants) build?"
    return module


def test_stock_module_loads_its_tile_configuration_from_the_stack(objdump: str, stock_build: Path) -> None:
    """The bug, as the patch's header describes it: reproduced by reading, so the next test can fail."""
    found = loads(disassemble(module_of(stock_build)))
    assert found, "no ldtilecfg in the stock module"
    for function, index, operands in found:
        assert "(%rsp)" in operands, f"{function.name}: {operands}"
        offset = operands.split("(")[0]
        stores = [
            (mnemonic, ops)
            for _, mnemonic, ops in function.instructions[max(0, index - 12) : index]
            if ops.endswith(f"{offset}(%rsp)")
        ]
        # Only the zeroing of the whole struct and palette_id = 1: no rows[] / colsb[] store survived.
        assert [m for m, _ in stores] == ["vmovdqa64", "movb"], stores
        assert stores[1][1].startswith("$0x1,"), stores


def test_patched_module_loads_a_whole_configuration_after_asking_for_permission(
    objdump: str, patched_build: Path
) -> None:
    module = module_of(patched_build)
    functions = disassemble(module)
    found = loads(functions)
    assert found, "no ldtilecfg in the patched module"
    for function, index, operands in found:
        target = re.search(r"#\s*([0-9a-f]+)", operands)
        assert "(%rip)" in operands and target, f"{function.name}: ldtilecfg {operands} is not a constant"
        config = read_bytes(module, int(target[1], 16), 64)
        assert len(config) == 64
        assert config[0] == 1 and config[1] == 0, config[:2].hex()
        assert struct.unpack_from("<16H", config, 16) == EXPECTED_COLSB
        assert tuple(config[48:64]) == EXPECTED_ROWS
        before = function.instructions[max(0, index - 16) : index]
        operands_before = " ".join(ops for _, _, ops in before)
        assert "$0x1023," in operands_before and "$0x9e," in operands_before, (
            f"{function.name}: no arch_prctl(ARCH_REQ_XCOMP_PERM) before ldtilecfg"
        )


def test_tile_instructions_run_only_after_the_thread_loaded_its_configuration(
    objdump: str, patched_build: Path
) -> None:
    functions = disassemble(module_of(patched_build))
    loaders = {
        address for address, f in functions.items() if any(m == "ldtilecfg" for _, m, _ in f.instructions)
    }
    tiled = {address for address, f in functions.items() if f.tile_instructions}
    assert tiled, "no tile instruction in the module: is AMX compiled in?"
    callers: dict[int, set[int]] = {}
    for address, function in functions.items():
        for target in function.calls():
            callers.setdefault(target, set()).add(address)
    for address in tiled - loaders:
        # Each caller chain must reach a function that loads the configuration before any other entry.
        pending, seen = [address], set()
        while pending:
            current = pending.pop()
            if current in seen or current in loaders:
                continue
            seen.add(current)
            parents = callers.get(current, set())
            assert parents, (
                f"{functions[address].name} runs tile instructions and is reached from "
                f"{functions[current].name}, which nothing that loads a tile configuration calls"
            )
            pending.extend(parents)


def _bench(directory: Path, model: Path, threads: int, repack: bool) -> tuple[float, float, str | None]:
    bench = subprocess.run(
        [
            str(directory / "llama-bench"),
            "-m",
            str(model),
            "-p",
            "64",
            "-n",
            "16",
            "-r",
            "1",
            "-t",
            str(threads),
            "--repack",
            "1" if repack else "0",
            "-o",
            "jsonl",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bench.returncode == 0, f"llama-bench exit {bench.returncode}: {bench.stderr[-2000:]}"
    rows = [json.loads(line) for line in bench.stdout.splitlines() if line.startswith("{")]
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg, loaded_cpu_module(bench.stderr.splitlines())


@pytest.mark.skipif(
    not HAS_AMX, reason="this CPU has no AMX (no amx_tile in /proc/cpuinfo): the AMX run is owed"
)
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0", "q4_k_m"])
def test_amx_runs_quantized_models_on_one_thread_and_two(
    patched_build: Path, tmp_path: Path, dtype: DType
) -> None:
    """Q8_0, Q4_0 and the Q4_K_M mix (256 wide: the K-quant AMX kernels, the path of the reported crash)."""
    from llamaforge.gguf.tiny import write_tiny_model
    from llamaforge.models.tiny import tiny_smoke_spec

    vocab = Path(os.environ.get("LLAMAFORGE_TEST_VOCAB", ""))
    if not vocab.is_file():
        pytest.skip("set LLAMAFORGE_TEST_VOCAB to llama.cpp's models/ggml-vocab-qwen2.gguf")
    model = write_tiny_model(tmp_path / f"tiny-{dtype}.gguf", tiny_smoke_spec(dtype), vocab).path
    for threads in (1, 2):
        amx_pp, amx_tg, module = _bench(patched_build / "bin", model, threads, repack=True)
        plain_pp, plain_tg, _ = _bench(patched_build / "bin", model, threads, repack=False)
        print(
            f"{dtype} t={threads} {module}: AMX pp64 {amx_pp:.1f} tg16 {amx_tg:.1f} | "
            f"--repack 0 pp64 {plain_pp:.1f} tg16 {plain_tg:.1f}"
        )
        assert module == MODULE
        assert amx_pp > 0 and amx_tg > 0
