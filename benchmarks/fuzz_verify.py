"""Fuzz the hardened GGUF header parser and the verify checks: only typed errors, no hang, bounded memory.

    python benchmarks/fuzz_verify.py                  # ~16 000 cases on all cores, figures on stdout
    python benchmarks/fuzz_verify.py --cases 40000 --json fuzz.json

Cases are mutations of the header of a tiny real model (qwen35moe: hybrid layers, MoE, 300-token tokenizer,
chat template), each run in a worker process of a pool:

* every truncation of the header (one case per byte offset),
* bit flips (1-16 random bits in the header),
* every count, length, type and offset field set to huge or boundary values (2^63-1, 2^63, 2^64-1, 2^62,
  2^32, the file size, ...), string lengths sampled,
* random type bytes (value, array item and ggml types),
* crafted headers: gguf 0.19.0's GGUFReader hang (an array length near 2^63), huge counts, nested arrays.

Each case parses with :func:`llamaforge.gguf.header.read_header` and, when that succeeds, runs the
recipe-independent verify checks (:func:`llamaforge.models.verify.analyse_header`: tensor set, structure, template
audit). A case fails when it raises anything but a ``LlamaforgeError`` (untyped), takes over 2 s (``SIGALRM``
in the worker), or exhausts the worker's address-space limit (``RLIMIT_AS``; MemoryError). Peak memory per
case is measured with tracemalloc. The exit code is 1 when any case failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

CASE_TIMEOUT_S = 2.0
MEMORY_HEADROOM = 768 << 20  # address space a worker may grow by beyond what it has after imports
HUGE = [(1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 62, 1 << 32, (1 << 31) - 1, 0, 1, 65535, 65536]

_BASE: bytes = b""
_HEADER_END = 0


# --------------------------------------------------------------------------------------------- the model


def make_base_model(directory: Path) -> Path:
    """A tiny qwen35moe with a 300-token tokenizer and a chat template: every kind of header field."""
    import gguf

    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    vocab = directory / "vocab.gguf"
    writer = gguf.GGUFWriter(vocab, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_token_types([1] * 300)
    writer.add_token_merges(["t o", "to k"])
    writer.add_eos_token_id(299)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return write_tiny_model(directory / "base.gguf", TinyModelSpec(arch="qwen35moe", n_layer=4), vocab).path


def header_fields(data: bytes) -> list[tuple[str, int, int]]:
    """``(kind, offset, size)`` of every count, length, type and offset field of a valid GGUF."""
    out = [("tensor_count", 8, 8), ("kv_count", 16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    pos = 24

    def string(kind: str) -> None:
        nonlocal pos
        out.append((kind, pos, 8))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    for _ in range(n_kv):
        string("key_length")
        out.append(("value_type", pos, 4))
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if vtype == 9:
            item, count = struct.unpack_from("<IQ", data, pos)
            out += [
                ("array_type", pos, 4),
                ("array_length" if item == 8 else "numeric_array_length", pos + 4, 8),
            ]
            pos += 12
            for _ in range(count):
                if item == 8:
                    string("string_length")
                else:
                    pos += sizes[item]
        elif vtype == 8:
            string("value_string_length")
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        string("tensor_name_length")
        n_dims = struct.unpack_from("<I", data, pos)[0]
        out.append(("n_dims", pos, 4))
        out += [("dim", pos + 4 + 8 * axis, 8) for axis in range(n_dims)]
        pos += 4 + 8 * n_dims
        out += [("ggml_type", pos, 4), ("tensor_offset", pos + 4, 8)]
        pos += 12
    return out


# -------------------------------------------------------------------------------------------- the cases


def make_cases(data: bytes, header_end: int, target: int, seed: int) -> list[tuple[Any, ...]]:
    """Small, picklable descriptions of mutations; workers rebuild the bytes from the base file."""
    rng = random.Random(seed)
    fields = header_fields(data)
    cases: list[tuple[Any, ...]] = [("truncate", n) for n in range(header_end)]
    cases += [("truncate", rng.randrange(header_end, len(data))) for _ in range(200)]  # into the tensor data
    tokens_length = next(o for kind, o, _ in fields if kind == "array_length")
    numeric_length = next(o for kind, o, _ in fields if kind == "numeric_array_length")
    n_kv_at, n_tensors_at = 16, 8
    cases += [
        ("sets", hang_patch(fields)),  # the GGUFReader hang
        ("set", numeric_length, 8, (1 << 63) - 1),
        ("set", numeric_length, 8, 1 << 63),
        ("set", tokens_length, 8, (1 << 63) - 1),
        ("set", n_kv_at, 8, (1 << 64) - 1),
        ("set", n_tensors_at, 8, (1 << 63) - 1),
        ("set", next(o for kind, o, _ in fields if kind == "array_type"), 4, 9),  # nested array
        ("set", 4, 4, 0x03000000),  # big-endian version
    ]
    sampled = [f for f in fields if f[0] != "string_length"] + rng.sample(
        [f for f in fields if f[0] == "string_length"], 30
    )
    cases += [
        ("set", offset, size, value % (1 << (8 * size))) for _, offset, size in sampled for value in HUGE
    ]
    typed = [f for f in fields if f[0] in ("value_type", "array_type", "ggml_type", "n_dims")]
    remaining = max(target - len(cases), 4000)
    for index in range(remaining):
        if index % 2 == 0:
            bits = tuple(rng.randrange(header_end * 8) for _ in range(rng.randint(1, 16)))
            cases.append(("flip", bits))
        else:
            _, offset, size = rng.choice(typed)
            value = rng.choice([rng.randrange(1 << 32), rng.randrange(64), rng.randrange(16)])
            cases.append(("set", offset, size, value))
    return cases


def hang_patch(fields: list[tuple[str, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """A numeric array turned into uint8 items with a length of 2^63-1: gguf 0.19.0's GGUFReader walks to the
    end of the file, then spins on empty reads forever (its loop runs to the declared length)."""
    length_at = _numeric(fields)
    return ((length_at - 4, 4, 0), (length_at, 8, (1 << 63) - 1))


def _numeric(fields: list[tuple[str, int, int]]) -> int:
    return next(offset for kind, offset, _ in fields if kind == "numeric_array_length")


def build(case: tuple[Any, ...]) -> bytes:
    kind = case[0]
    if kind == "truncate":
        return _BASE[: case[1]]
    mutant = bytearray(_BASE)
    if kind == "flip":
        for bit in case[1]:
            mutant[bit // 8] ^= 1 << (bit % 8)
    else:
        patches = case[1] if kind == "sets" else (case[1:],)
        for offset, size, value in patches:
            mutant[offset : offset + size] = int(value).to_bytes(size, "little")
    return bytes(mutant)


# ------------------------------------------------------------------------------------------- the workers


class _Timeout(BaseException):
    """Raised by SIGALRM; a BaseException so no ``except Exception`` in the code under test swallows it."""


def _alarm(_signum: int, _frame: object) -> None:
    raise _Timeout


def _init_worker(base: bytes) -> None:
    global _BASE  # noqa: PLW0603 - the worker's copy of the base file, set once per process
    _BASE = base
    # Everything the checks import lazily, loaded before the memory limit and outside the timed cases.
    import gguf  # noqa: F401
    import jinja2.sandbox  # noqa: F401

    import llamaforge.gguf.header
    import llamaforge.models.verify  # noqa: F401

    with Path("/proc/self/status").open(encoding="utf-8") as status:
        vm_size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = vm_size + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)


def run_case(item: tuple[int, tuple[Any, ...]]) -> dict[str, Any]:
    from llamaforge.core.errors import LlamaforgeError
    from llamaforge.gguf.header import read_header
    from llamaforge.gguf.sources import BytesSource
    from llamaforge.models.verify import analyse_header

    index, case = item
    data = build(case)
    outcome, detail = "parsed", ""
    tracemalloc.start()
    started, cpu_started = time.perf_counter(), time.process_time()
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        analyse_header(read_header(BytesSource(data, name=f"case-{index}")))
    except LlamaforgeError as error:
        outcome, detail = "typed", type(error).__name__
    except MemoryError:
        outcome, detail = "memory", "MemoryError"
    except _Timeout:
        outcome, detail = "hang", f"no answer within {CASE_TIMEOUT_S} s"
    except Exception as error:  # noqa: BLE001 - exactly what the fuzzer is looking for
        outcome, detail = "untyped", f"{type(error).__name__}: {error}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {
        "index": index,
        "case": case[:4] if case[0] == "set" else (case[0], str(case[1])[:80]),
        "outcome": outcome,
        "detail": detail,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_bytes": peak,
    }


def stock_reader_on_hang_case(path: Path, directory: Path, timeout: float = 10.0) -> str:
    """What gguf 0.19.0's GGUFReader does with :func:`hang_patch` (in a subprocess with 2 GiB of address
    space, killed on timeout)."""
    data = bytearray(path.read_bytes())
    for offset, size, value in hang_patch(header_fields(bytes(data))):
        data[offset : offset + size] = value.to_bytes(size, "little")
    crafted = directory / "hang.gguf"
    crafted.write_bytes(bytes(data))
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); import gguf; "
        "gguf.GGUFReader(sys.argv[1])"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(crafted)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f} s (killed)"
    last = (done.stderr.strip().splitlines() or ["ok"])[-1]
    return f"exit {done.returncode}: {last[:120]}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=16_000, help="target number of cases (>= 10 000)")
    parser.add_argument("--seed", type=int, default=20261001)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--no-stock-reader", action="store_true", help="skip the GGUFReader comparison")
    args = parser.parse_args()

    from llamaforge.gguf.header import read_header

    with tempfile.TemporaryDirectory(prefix="fuzz-verify-") as scratch:
        base_path = make_base_model(Path(scratch))
        base = base_path.read_bytes()
        header_end = read_header(base_path).header_end
        cases = make_cases(base, header_end, args.cases, args.seed)
        started = time.perf_counter()
        results: list[dict[str, Any]] = []
        context = multiprocessing.get_context("fork")
        with context.Pool(args.jobs, _init_worker, (base,), maxtasksperchild=2000) as pool:
            results.extend(pool.imap_unordered(run_case, enumerate(cases), chunksize=64))
        wall = time.perf_counter() - started
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the workers only, so far
        stock = "skipped" if args.no_stock_reader else stock_reader_on_hang_case(base_path, Path(scratch))

    outcomes = Counter(r["outcome"] for r in results)
    failures = [r for r in results if r["outcome"] not in ("typed", "parsed")]
    times = sorted(r["seconds"] for r in results)
    figures = {
        "cases": len(results),
        "base_model": {"file_bytes": len(base), "header_bytes": header_end},
        "by_strategy": dict(Counter(str(c[0]) for c in cases)),
        "outcomes": dict(outcomes),
        "error_types": dict(Counter(r["detail"] for r in results if r["outcome"] == "typed")),
        "failures": len(failures),
        "failure_examples": failures[:10],
        "max_seconds": round(times[-1], 4),
        "max_cpu_seconds": round(max(r["cpu_seconds"] for r in results), 4),
        "p99_seconds": round(times[int(len(times) * 0.99)], 5),
        "mean_seconds": round(sum(times) / len(times), 6),
        "peak_traced_bytes": max(r["peak_bytes"] for r in results),
        "worker_max_rss_bytes": children,  # a forked worker, parent pages included
        "worker_address_space_headroom": MEMORY_HEADROOM,
        "wall_seconds": round(wall, 1),
        "jobs": args.jobs,
        "stock_gguf_reader_on_hang_case": stock,
    }
    print(json.dumps(figures, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
