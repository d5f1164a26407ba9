"""Fit-planner accuracy: the planner's estimate vs the buffers stock llama.cpp b11312 reports when it loads
tiny generated dense (qwen3), hybrid (qwen35), MoE (qwen3moe), hybrid MoE (qwen35moe, qwen3next) and sliding-window
(gemma2, gemma3) models, over context sizes, slots, flash attention on/off, KV cache types and batch sizes; the
sliding-window models also with a unified KV cache (llama-server's default without --parallel) and --swa-full.
Goal: every category within 5 %.

A CPU build reports every buffer as host memory, so the comparison is per category: weights (CPU_Mapped),
KV cache, recurrent state, compute buffer, output buffer. Then it plots the planner's breakdown for realistic
cases: synthetic Qwen3.5-9B-shaped and Qwen3.5-35B-A3B-shaped headers (Q4_K weights) on an RTX 3090.

With ``--random-shapes N`` it also loads N models of random shapes (small vocabulary, context 512, where the
per-layer activation model dominates the compute buffer) and reports the compute-buffer error over them;
``--refit`` (needs scipy) refits that model's coefficients on those loads: how the coefficients in
llamaforge.serve.fit were obtained (N=100).

Usage: python benchmarks/fit_accuracy.py [--server PATH/llama-server] [--vocab-dir DIR] [--out DIR] [--quick]
       [--models NAME,...] [--slots] [--random-shapes N [--refit]]
(defaults: the cached stock CPU build and source tree under ~/.cache/llamaforge, output to
$TMPDIR/llamaforge-fit-accuracy: the table as JSON and the PNGs; about 2 minutes on 2 cores, plus about
3 s per random shape).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llamaforge.build.recipes import pinned_llama_cpp
from llamaforge.core.paths import home
from llamaforge.gguf.header import read_header
from llamaforge.gguf.tiny import AnyTinySpec, TinyModelSpec, write_any_tiny_model, write_tiny_model
from llamaforge.gguf.tiny.mla import TinyMLASpec
from llamaforge.gguf.tiny.shared_kv import TinySharedKVSpec
from llamaforge.serve import fit
from llamaforge.serve.fit import (
    MiB,
    Settings,
    estimate_memory,
    plan_fit,
    summarize,
    synthetic_header,
)
from llamaforge.serve.fit_chart import save_fit_chart
from llamaforge.serve.measure import measure_with_llamacpp
from llamaforge.serve.shape import HYBRID_ARCHS, ModelShape, model_shape

sys.path.insert(0, str(Path(__file__).parent))
from fit_projection import projection_row, summarize_projection

HYBRID = {"full_attention_interval": 4, "ssm_state_size": 64, "ssm_group_count": 4, "ssm_time_step_rank": 8}
MODELS: dict[str, tuple[AnyTinySpec, str]] = {
    "qwen3": (TinyModelSpec(arch="qwen3", n_layer=4), "qwen2"),
    "qwen35": (TinyModelSpec(arch="qwen35", n_layer=8, **HYBRID), "qwen35"),  # type: ignore[arg-type]
    "qwen3moe": (TinyModelSpec(arch="qwen3moe", n_layer=4, n_expert=8, n_expert_used=2), "qwen2"),
    "qwen35moe": (TinyModelSpec(arch="qwen35moe", n_layer=8, n_expert=8, **HYBRID), "qwen35"),  # type: ignore[arg-type]
    "qwen3next": (TinyModelSpec(arch="qwen3next", n_layer=8, n_expert=8, **HYBRID), "qwen2"),  # type: ignore[arg-type]
    # wider shapes: the activations (not the vocabulary) drive the compute buffer
    "qwen3-wide": (
        TinyModelSpec(arch="qwen3", n_layer=2, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072),
        "qwen2",
    ),
    "qwen35-wide": (
        TinyModelSpec(
            arch="qwen35",
            n_layer=4,
            n_embd=1024,
            n_head=8,
            n_head_kv=2,
            head_dim=256,
            n_ff=3072,
            ssm_state_size=128,
            ssm_group_count=8,
            ssm_time_step_rank=16,
        ),
        "qwen35",
    ),
    # sliding window on every even layer (gemma2's pattern); windows well below most contexts
    "gemma2": (TinyModelSpec(arch="gemma2", n_layer=4, head_dim=32, sliding_window=256), "qwen2"),
    # five sliding layers to one full one (gemma3's pattern)
    "gemma3": (TinyModelSpec(arch="gemma3", n_layer=6, head_dim=32, sliding_window=256), "qwen2"),
    "gemma2-wide": (
        TinyModelSpec(
            arch="gemma2",
            n_layer=4,
            n_embd=1024,
            n_head=8,
            n_head_kv=4,
            head_dim=128,
            n_ff=3072,
            sliding_window=1024,
        ),
        "qwen2",
    ),
    # MLA: one latent K row (kv_lora_rank + RoPE dims) per cell and layer, no V
    "deepseek2-mla": (TinyMLASpec(), "qwen2"),
    # last two layers reuse the caches of layers 2 (sliding) and 3 (full); sliding layers have smaller heads
    "gemma4-shared": (TinySharedKVSpec(), "qwen2"),
}
SETTINGS = [
    Settings(ctx=512),
    Settings(ctx=2048),
    Settings(ctx=8192),
    Settings(ctx=32768),
    Settings(ctx=65536),
    Settings(ctx=4096, flash_attn=False),
    Settings(ctx=16384, flash_attn=False),
    Settings(ctx=8192, parallel=4),
    Settings(ctx=2048, parallel=16),  # the hybrids' DeltaNet states grow their compute buffer with the slots
    Settings(ctx=16384, cache_type_k="q8_0", cache_type_v="q8_0"),
    Settings(ctx=16384, cache_type_k="q4_0", cache_type_v="q4_0"),
    Settings(ctx=8192, ubatch=256),
]
QUICK = [Settings(ctx=2048), Settings(ctx=32768), Settings(ctx=4096, flash_attn=False)]
# --slots: the hybrids' compute buffer over slots and ubatch sizes (each slot adds DeltaNet states to it).
SLOTS = [Settings(ctx=2048, parallel=n) for n in (1, 4, 8, 16, 32)] + [
    Settings(ctx=2048, parallel=n, ubatch=256) for n in (8, 16)
]
SLOT_MODELS = ["qwen35", "qwen35moe", "qwen3next", "qwen35-wide"]
# Cell counts only sliding-window models tell apart (their window cache depends on slots and unification).
SWA_SETTINGS = [
    Settings(ctx=8192, parallel=4, kv_unified=True),
    Settings(ctx=32768, parallel=3),
    Settings(ctx=8192, parallel=2, swa_full=True),
]
CATEGORIES = ("weights", "kv_cache", "recurrent_state", "compute", "output")
ROUNDING = 0.005 * MiB  # llama.cpp prints MiB with two decimals
# Shaped after the published configs (assumed hyper-parameters: the planner needs no weights).
QWEN35_9B = TinyModelSpec(
    arch="qwen35",
    n_layer=32,
    n_embd=4096,
    n_head=16,
    n_head_kv=4,
    head_dim=256,
    n_ff=12288,
    context_length=262144,
    ssm_conv_kernel=4,
    ssm_state_size=128,
    ssm_group_count=16,
    ssm_time_step_rank=32,
    full_attention_interval=4,
)
QWEN35_35B_A3B = TinyModelSpec(
    arch="qwen35moe",
    n_layer=40,
    n_embd=2048,
    n_head=16,
    n_head_kv=2,
    head_dim=256,
    n_ff=512,
    context_length=262144,
    n_expert=256,
    n_expert_used=8,
    n_ff_exp=512,
    n_ff_shexp=512,
    ssm_conv_kernel=4,
    ssm_state_size=128,
    ssm_group_count=16,
    ssm_time_step_rank=32,
    full_attention_interval=4,
)


def label(settings: Settings) -> str:
    text = f"ctx {settings.ctx}"
    if settings.parallel > 1:
        text += f" x{settings.parallel}"
    if not settings.flash_attn:
        text += " no-FA"
    if settings.cache_type_k != "f16":
        text += f" {settings.cache_type_k}"
    if settings.ubatch != 512:
        text += f" ub{settings.ubatch}"
    if settings.kv_unified:
        text += " unified"
    if settings.swa_full:
        text += " swa-full"
    return text


def error_pct(estimate: int, actual: int) -> float:
    """Relative error, with llama.cpp's printing precision forgiven (a 0.01 MiB line is +-50 % by itself)."""
    if actual == 0:
        return 0.0 if estimate < ROUNDING else 100.0
    off = abs(estimate - actual)
    return 0.0 if off <= ROUNDING + 1 else 100.0 * (estimate - actual) / actual


def compare(
    server: Path, vocab_dir: Path, scratch: Path, settings_list: list[Settings], names: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        spec, vocab = MODELS[name]
        model = write_any_tiny_model(
            scratch / f"{name}.gguf", spec, vocab_dir / f"ggml-vocab-{vocab}.gguf"
        ).path
        header = read_header(model)
        shape = model_shape(header)
        for settings in settings_list + (SWA_SETTINGS if shape.swa else []):
            if settings.cache_type_k != "f16" and (shape.head_dim_k % 32 or shape.head_dim_k_swa % 32):
                continue  # llama.cpp refuses a quantized cache whose block does not divide the head size
            _gpu, planned = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)
            reported = measure_with_llamacpp(server, model, settings, fit_projection=True)
            row: dict[str, Any] = {"model": name, "settings": label(settings)}
            row["projection"] = projection_row(planned, reported)
            if shape.swa:  # both caches' cells, planned and printed
                swa_cache = reported.swa_kv_cache
                row["swa_cells"] = {
                    "estimate": settings.swa_cells(shape.n_swa),
                    "llamacpp": swa_cache.cells if swa_cache else None,
                }
            for category in CATEGORIES:
                estimate, actual = getattr(planned, category), reported.total(category)
                row[category] = {
                    "estimate_mib": estimate / MiB,
                    "llamacpp_mib": actual / MiB,
                    "error_pct": error_pct(estimate, actual),
                }
            rows.append(row)
            cells = [
                f"{c[:7]} {row[c]['estimate_mib']:8.2f}/{row[c]['llamacpp_mib']:8.2f} "
                f"{row[c]['error_pct']:+5.1f}%"
                for c in CATEGORIES
            ]
            if "swa_cells" in row:
                cells.append(f"swa cells {row['swa_cells']['estimate']}/{row['swa_cells']['llamacpp']}")
            if row["projection"]:
                total = row["projection"]["total"]
                cells.append(
                    f"total ours/--fit/real {total['ours_mib']:.2f}/{total['llamacpp_projection_mib']}/"
                    f"{total['real_mib']:.2f} ({row['projection']['closer']})"
                )
            print(f"{name:12s} {row['settings']:20s} " + "  ".join(cells), flush=True)
    return rows


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    print("\nerror = estimate vs llama.cpp (5 % goal); estimate/llama.cpp in MiB above")
    print(f"{'category':16s} {'cases':>5s} {'max |err|':>10s} {'mean |err|':>11s} {'within 5 %':>11s}")
    summary: dict[str, Any] = {}
    for category in CATEGORIES:
        errors = [abs(row[category]["error_pct"]) for row in rows if row[category]["llamacpp_mib"] > 0]
        mean = statistics.fmean(errors) if errors else 0.0
        within = sum(e <= 5.0 for e in errors)
        summary[category] = {
            "cases": len(errors),
            "max_abs_error_pct": max(errors, default=0.0),
            "mean_abs_error_pct": mean,
            "within_5pct": within,
        }
        print(
            f"{category:16s} {len(errors):5d} {max(errors, default=0):9.1f}% {mean:10.1f}% {within:6d}/{len(errors)}"
        )
    totals = []
    for row in rows:
        estimate = sum(row[c]["estimate_mib"] for c in CATEGORIES)
        actual = sum(row[c]["llamacpp_mib"] for c in CATEGORIES)
        totals.append(abs(estimate - actual) / actual * 100)
    summary["total"] = {
        "cases": len(totals),
        "max_abs_error_pct": max(totals),
        "mean_abs_error_pct": statistics.fmean(totals),
    }
    print(
        f"{'all (sum)':16s} {len(totals):5d} {max(totals):9.1f}% {statistics.fmean(totals):10.1f}% "
        f"{sum(t <= 5 for t in totals):6d}/{len(totals)}"
    )
    return summary


# ------------------------------------------------------------------------------- random shapes, refit


def mini_vocab(path: Path, n_tokens: int = 1000) -> Path:
    """A tokenizer-only GGUF with ``n_tokens`` tokens: keeps random-shape models small."""
    import gguf

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"t{i}" for i in range(n_tokens)])
    writer.add_token_types([1] * n_tokens)
    writer.add_token_merges(["t 1"])
    writer.add_eos_token_id(n_tokens - 1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_spec(rng: random.Random, arch: str) -> TinyModelSpec:
    n_head_kv = rng.choice([1, 2, 4, 8])
    kwargs: dict[str, Any] = {
        "arch": arch,
        "n_layer": 2,
        "n_embd": rng.choice([256, 512, 1024, 2048]),
        "n_head": n_head_kv * rng.choice([1, 2, 4]),
        "n_head_kv": n_head_kv,
        "head_dim": rng.choice([32, 64, 128, 256]),
        "n_ff": rng.choice([256, 512, 1024, 2048, 4096, 8192]),
    }
    if "moe" in arch:
        kwargs.update(n_expert=rng.choice([8, 16, 32]), n_expert_used=rng.choice([1, 2, 4, 8]))
        kwargs.update(
            n_ff_exp=rng.choice([128, 256, 512, 1024]), n_ff_shexp=rng.choice([128, 512, 1024, 2048])
        )
    if arch in HYBRID_ARCHS:
        groups = rng.choice([2, 4, 8, 16])
        kwargs.update(
            ssm_group_count=groups,
            ssm_time_step_rank=groups * rng.choice([1, 2]),
            ssm_state_size=rng.choice([32, 64, 128]),
        )
    return TinyModelSpec(**kwargs)


def features(shape: ModelShape) -> dict[str, float]:
    """The per-token quantities of llamaforge.serve.fit's activation model."""
    q = shape.n_head * shape.head_dim_k * (2 if shape.arch in HYBRID_ARCHS else 1)
    conv = 2 * shape.ssm_group_count * shape.ssm_state_size + shape.ssm_inner_size
    return {
        "E": shape.n_embd,
        "Q": q,
        "K": shape.n_head_kv * shape.head_dim_k,
        "F": shape.n_ff,
        "U": shape.n_expert_used * shape.n_ff_exp,
        "UE": shape.n_expert_used * shape.n_embd,
        "S": shape.n_ff_shexp,
        "C": conv if shape.recurrent_layers else 0,
        "V": shape.ssm_inner_size if shape.arch == "qwen3next" else 0,  # its fused Q/K/V/Z input (ssm_in)
    }


def phase_model(c: Any, f: dict[str, float], moe: bool) -> float:
    """max(attention, FFN or MoE up/down, DeltaNet) per-token values for coefficients ``c`` (REFIT_NAMES order)."""
    phases = [c[0] * f["E"] + c[1] * f["Q"] + c[2] * f["K"]]
    if moe:
        phases.append(c[5] * f["E"] + c[6] * f["U"])
        phases.append(c[7] * f["E"] + c[8] * f["UE"] + c[9] * f["U"])
        if f["S"]:
            phases.append(c[10] * f["E"] + c[11] * f["S"])
    else:
        phases.append(c[3] * f["E"] + c[4] * f["F"])
    if f["V"]:
        phases.append(c[14] * f["E"] + c[15] * f["C"] + c[16] * f["V"])
    elif f["C"]:
        phases.append(c[12] * f["E"] + c[13] * f["C"])
    return max(phases)


REFIT_NAMES = (
    "attn.E",
    "attn.Q",
    "attn.K",
    "ffn.E",
    "ffn.F",
    "moe_up.E",
    "moe_up.U",
    "moe_down.E",
    "moe_down.UE",
    "moe_down.U",
    "shared.E",
    "shared.S",
    "recurrent.E",
    "recurrent.C",
    "fused_recurrent.E",
    "fused_recurrent.C",
    "fused_recurrent.V",
)
# what llamaforge.serve.fit uses, in REFIT_NAMES order (for comparison with a refit)
CURRENT = (3.25, 2.0, 0.75, 2.25, 3.25, 2.5, 3.25, 2.75, 1.25, 0.75, 3.75, 3.25, 3.0, 3.0, 3.0, 2.25, 4.5)


def random_shape_sweep(server: Path, scratch: Path, count: int, refit: bool, seed: int) -> dict[str, Any]:
    """Compute-buffer error over ``count`` random shapes at context 512 (activations dominate)."""
    rng = random.Random(seed)
    vocab = mini_vocab(scratch / "ggml-vocab-mini.gguf")
    settings = Settings(ctx=512)
    archs = ("qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next")
    samples = []
    for index in range(count):
        model = write_tiny_model(
            scratch / "random.gguf", random_spec(rng, archs[index % len(archs)]), vocab
        ).path
        header = read_header(model)
        shape = model_shape(header)
        estimate = estimate_memory(shape, header.tensors, settings, n_gpu_layers=0)[1].compute
        actual = measure_with_llamacpp(server, model, settings).total("compute")
        per_token = (actual - settings.n_ctx_seq * settings.n_tokens * 2) / (settings.n_tokens * 4)
        samples.append((shape, estimate, actual, per_token))
    errors = [100 * (e - a) / a for _s, e, a, _y in samples]
    rms = math.sqrt(statistics.fmean(x * x for x in errors))
    worst = max(map(abs, errors))
    print(
        f"\nrandom shapes: {count} models at ctx 512, compute buffer error rms {rms:.1f} %, max {worst:.1f} %, "
        f"within 5 %: {sum(abs(x) <= 5 for x in errors)}/{count}"
    )
    result: dict[str, Any] = {
        "count": count,
        "seed": seed,
        "rms_pct": rms,
        "max_abs_pct": worst,
        "samples": [
            {"arch": s.arch, **features(s), "estimate": e, "llamacpp": a, "per_token": y}
            for s, e, a, y in samples
        ],
    }
    if refit:
        from scipy.optimize import least_squares  # type: ignore[import-untyped]

        def residuals(c: Any) -> list[float]:
            return [(phase_model(c, features(s), s.is_moe) - y) / y for s, _e, _a, y in samples]

        start = random.Random(0)
        trials = [
            least_squares(residuals, [start.uniform(0, 4) for _ in REFIT_NAMES], bounds=(0, 20))
            for _ in range(40)
        ]
        best = min(trials, key=lambda trial: trial.cost)
        result["refit"] = {name: round(float(v), 2) for name, v in zip(REFIT_NAMES, best.x, strict=True)}
        print("refitted coefficients:", result["refit"])
        print("llamaforge.serve.fit uses:  ", dict(zip(REFIT_NAMES, CURRENT, strict=True)))
    return result


# ------------------------------------------------------------------------------------------------ main


def realistic_plots(out: Path) -> list[fit.FitPlan]:
    header = synthetic_header(QWEN35_9B, n_vocab=248320, name="Qwen3.5-9B-shaped (Q4_K)")
    plans = [
        plan_fit(header, gpu="rtx3090", ctx=32768),
        plan_fit(header, gpu="rtx3090", ctx=131072),
        plan_fit(header, gpu="rtx3090", ctx=131072, cache_type_k="q8_0", cache_type_v="q8_0"),
        plan_fit(header, gpu="rtx3090", ctx=262144, parallel=2),
    ]
    png = save_fit_chart(
        [plan.to_json() for plan in plans],
        out / "fit_qwen35_9b_rtx3090.png",
        title="Qwen3.5-9B-shaped (Q4_K, synthetic header) on an RTX 3090",
    )
    moe = synthetic_header(QWEN35_35B_A3B, n_vocab=248320, name="Qwen3.5-35B-A3B-shaped (Q4_K)")
    moe_plans = [plan_fit(moe, gpu="rtx3090", ctx=ctx) for ctx in (32768, 131072, 262144)]
    moe_png = save_fit_chart(
        [plan.to_json() for plan in moe_plans],
        out / "fit_qwen35moe_35b_a3b_rtx3090.png",
        title="Qwen3.5-35B-A3B-shaped (Q4_K, synthetic header) on an RTX 3090",
    )
    print("\nrealistic cases (planner only, no GPU here):")
    for plan in plans + moe_plans:
        print("  " + "\n  ".join(summarize(plan)))
    print(f"plots: {png} {moe_png}")
    return plans + moe_plans


def stock_cpu_server() -> Path | None:
    """llama-server of a published stock (unpatched) CPU build, if there is one."""
    for manifest in sorted(home().glob("builds/*/manifest.json")):
        data = json.loads(manifest.read_text(encoding="utf-8"))
        server = manifest.parent / "bin" / "llama-server"
        if data.get("backend") == "cpu" and not data.get("patches") and server.is_file():
            return server
    return None


def main() -> None:
    cache = home()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", type=Path, default=stock_cpu_server())
    parser.add_argument("--vocab-dir", type=Path, default=next(cache.glob("sources/*/tree/models"), None))
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "llamaforge-fit-accuracy")
    parser.add_argument("--quick", action="store_true", help="3 settings per model instead of 11")
    parser.add_argument(
        "--slots",
        action="store_true",
        help="only the hybrid models at 1-32 slots and ubatch 256/512 (their per-slot DeltaNet states)",
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS)
    )
    parser.add_argument(
        "--random-shapes", type=int, default=0, metavar="N", help="also N random-shape models"
    )
    parser.add_argument("--refit", action="store_true", help="refit the activation model (needs scipy)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random shapes")
    args = parser.parse_args()
    if args.server is None or not args.server.is_file():
        sys.exit(
            f"no llama-server: pass --server (a CPU build of llama.cpp {pinned_llama_cpp()}, "
            "`invoke build --backend cpu`)"
        )
    if args.vocab_dir is None or not (args.vocab_dir / "ggml-vocab-qwen2.gguf").is_file():
        sys.exit("no tokenizer GGUFs: pass --vocab-dir (llama.cpp's models/ directory)")
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fit-accuracy-") as scratch:
        names = (
            SLOT_MODELS if args.slots else [name.strip() for name in args.models.split(",") if name.strip()]
        )
        unknown = sorted(set(names) - set(MODELS))
        if unknown:
            sys.exit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
        settings = SLOTS if args.slots else QUICK if args.quick else SETTINGS
        rows = compare(args.server, args.vocab_dir, Path(scratch), settings, names)
        summary = summarize_rows(rows)
        summary["llamacpp_projection"] = summarize_projection(rows)
        sweep = None
        if args.random_shapes:
            sweep = random_shape_sweep(args.server, Path(scratch), args.random_shapes, args.refit, args.seed)
    print(f"({time.monotonic() - started:.0f} s of llama.cpp loads)")
    plans = realistic_plots(args.out)
    data = {
        "rows": rows,
        "summary": summary,
        "random_shapes": sweep,
        "realistic": [p.to_json() for p in plans],
    }
    (args.out / "fit_accuracy.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
