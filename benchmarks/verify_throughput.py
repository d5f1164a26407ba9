"""Verify throughput (sha256 + every check) divided by ``openssl dgst -sha256`` on the same >= 1 GiB GGUF.

    python benchmarks/verify_throughput.py                # 1.5 GiB file in /tmp, 5 rounds
    python benchmarks/verify_throughput.py --dir /data --rounds 7 --json throughput.json

The file is a valid tiny-architecture qwen3 whose feed-forward matrices are made wide enough to reach the
size (so every check runs on a real model, not on padding), written to ``--dir`` and deleted afterwards. The
page cache is warmed first, then each round times ``openssl dgst -sha256 FILE`` and ``verify_model(FILE,
use_cache=False)`` back to back; the ratio of the best times (and of the medians) is reported. Goal: >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_big_model(directory: Path, n_ff: int) -> Path:
    """A 2-layer, 4096-wide qwen3 with ``n_ff``-wide F16 feed-forward matrices (3 x 2 x 4096 x n_ff x 2 bytes)."""
    import gguf

    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    vocab = directory / "vocab.gguf"
    writer = gguf.GGUFWriter(vocab, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"tok{i}" for i in range(1024)])
    writer.add_token_types([1] * 1024)
    writer.add_token_merges(["t o"])
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    spec = TinyModelSpec(n_layer=2, n_embd=4096, n_ff=n_ff, n_head=32, n_head_kv=8, head_dim=128)
    path = write_tiny_model(directory / "big.gguf", spec, vocab).path
    vocab.unlink()
    return path


def time_openssl(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["openssl", "dgst", "-sha256", str(path)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def time_verify(path: Path) -> tuple[float, str, bool]:
    from llamaforge.models.verify import verify_model

    started = time.perf_counter()
    report = verify_model(path, use_cache=False)
    return time.perf_counter() - started, report.sha256, report.ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--n-ff", type=int, default=32768, help="feed-forward width (32768: 1.5 GiB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="verify-throughput-", dir=args.dir) as scratch:
        os.environ["LLAMAFORGE_HOME"] = str(Path(scratch) / "home")  # no cache entries left behind
        started = time.perf_counter()
        path = make_big_model(Path(scratch), args.n_ff)
        size = path.stat().st_size
        if size < 1 << 30:
            print(f"file is only {size} bytes; raise --n-ff", file=sys.stderr)
            return 2
        made = time.perf_counter() - started
        subprocess.run(["cat", str(path)], check=True, stdout=subprocess.DEVNULL)  # warm the page cache
        expected = subprocess.run(
            ["openssl", "dgst", "-sha256", "-r", str(path)], check=True, capture_output=True, text=True
        ).stdout.split()[0]
        openssl_s, verify_s = [], []
        for _ in range(args.rounds):
            openssl_s.append(time_openssl(path))
            seconds, sha256, ok = time_verify(path)
            if sha256 != expected or not ok:
                print(f"verify disagrees: sha256 {sha256} vs {expected}, ok={ok}", file=sys.stderr)
                return 1
            verify_s.append(seconds)
    figures = {
        "file_bytes": size,
        "generate_seconds": round(made, 1),
        "rounds": args.rounds,
        "openssl_seconds": [round(s, 3) for s in openssl_s],
        "verify_seconds": [round(s, 3) for s in verify_s],
        "openssl_gb_per_s_best": round(size / min(openssl_s) / 1e9, 3),
        "verify_gb_per_s_best": round(size / min(verify_s) / 1e9, 3),
        "ratio_best": round(min(openssl_s) / min(verify_s), 3),
        "ratio_median": round(statistics.median(openssl_s) / statistics.median(verify_s), 3),
        "goal": 0.9,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if figures["ratio_best"] >= figures["goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
