"""The Vulkan backend, built and run for real: `invoke build --backend vulkan` in Docker, then the build's runtime
image runs llama-bench and llama-server on Mesa's software Vulkan device (lavapipe) in containers, and the load
logs must name that Vulkan device.

Steps: the trixie base image (``images.bootstrap``; reused when it exists), the build (a cache hit when it
exists), its runtime image, a tiny random-weight qwen3 model; then ``llama-bench`` (``-ngl 99``) and a
``llama-server`` answering one completion, each with ``VK_ICD_FILENAMES`` naming lavapipe and
``GGML_VK_VISIBLE_DEVICES`` selecting it. Prints the build's
time, the Vulkan device line and the figures as JSON; exits 1 when a log names no Vulkan device.

Usage: python benchmarks/vulkan_lavapipe.py [--cpu x86-64-v2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from llamaforge.build.images import bootstrap_image
from llamaforge.build.recipes import load_recipe
from llamaforge.build.runtime_image import PREFIX, ensure_runtime_image
from llamaforge.build.source import fetch_source
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

BASE = "llamaforge/debian:trixie"
# Mesa's ICD file for lavapipe as trixie ships it (bookworm's is lvp_icd.x86_64.json). ggml-vulkan passes over
# devices of the CPU type unless GGML_VK_VISIBLE_DEVICES names them, so both are set.
LAVAPIPE = ("-e", "VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.json", "-e", "GGML_VK_VISIBLE_DEVICES=0")
# ggml-vulkan's own line (llama-bench), or llama-server's choice of device (at -lv 4).
DEVICE_LINE = re.compile(r"^.*(?:ggml_vulkan: \d+ = |using device Vulkan\d+ ).*$", re.M)


def build(cpu: str) -> dict[str, Any]:
    """`invoke build --backend vulkan --cpu CPU` of the default recipe: the published build's manifest."""
    op = operations()["build"]
    params = op.params.model_validate({"recipe": "default", "backend": "vulkan", "cpu": cpu})
    result = result_json(op.run(params, OperationContext()))
    path = Path(result["build"]["path"])
    manifest: dict[str, Any] = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    manifest["cached"] = result["build"]["cached"]
    return manifest


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``docker ARGS``, its output captured."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def device_line(log: str) -> str | None:
    """The line that names the Vulkan device used (``ggml_vulkan: 0 = llvmpipe …``)."""
    found = DEVICE_LINE.search(log)
    return found.group(0) if found else None


def run_bench(image: str, model: Path) -> dict[str, Any]:
    """llama-bench of the runtime image on lavapipe, all layers offloaded: its rows and its load log."""
    started = time.monotonic()
    done = docker(
        "run",
        "--rm",
        *LAVAPIPE,
        "--mount",
        f"type=bind,source={model},target=/models/model.gguf,readonly",
        "--entrypoint",
        f"{PREFIX}/bin/llama-bench",
        image,
        "-m",
        "/models/model.gguf",
        "-ngl",
        "99",
        "-p",
        "32",
        "-n",
        "16",
        "-r",
        "1",
        "-o",
        "json",
    )
    rows = json.loads(done.stdout)
    return {"rows": rows, "log": done.stderr, "seconds": round(time.monotonic() - started, 1)}


def run_server(image: str, model: Path, port: int) -> dict[str, Any]:
    """llama-server of the runtime image on lavapipe: healthy, one completion answered; its log."""
    name = f"lf-vulkan-lavapipe-{port}"
    docker(
        "run",
        "--detach",
        "--name",
        name,
        *LAVAPIPE,
        "-e",
        "LLAMA_ARG_N_GPU_LAYERS=99",
        "-p",
        f"127.0.0.1:{port}:8080",
        "--mount",
        f"type=bind,source={model},target=/models/model.gguf,readonly",
        image,
        "-lv",
        "4",  # the device and offload lines are info at verbosity 4
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion",
            data=json.dumps({"prompt": "Hello", "n_predict": 8, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        log = docker("logs", name).stderr + docker("logs", name).stdout
    finally:
        docker("rm", "--force", name, check=False)
    return {"tokens_predicted": answer.get("tokens_predicted"), "timings": answer.get("timings"), "log": log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu", default="x86-64-v2", help="the CPU level of ggml-cpu (one level: a shorter build)"
    )
    parser.add_argument("--port", type=int, default=18093)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    started = time.monotonic()
    base = bootstrap_image(BASE, suite="trixie")
    print(
        f"base image {base.tag} ({'reused' if base.reused else 'made'} in {time.monotonic() - started:.0f} s)"
    )
    manifest = build(args.cpu)
    took = "cache hit" if manifest["cached"] else f"{manifest['duration_s']} s"
    print(f"build {manifest['key']}: {took}", flush=True)
    image = ensure_runtime_image(manifest["key"])
    print(f"runtime image {image.tag} ({'reused' if image.reused else 'made'})", flush=True)
    with tempfile.TemporaryDirectory(prefix="lf-vulkan-") as scratch:
        vocab = fetch_source(load_recipe("default").source) / "models" / "ggml-vocab-qwen2.gguf"
        model = write_tiny_model(Path(scratch) / "tiny-qwen3.gguf", TinyModelSpec(arch="qwen3"), vocab).path
        model.chmod(0o644)
        bench = run_bench(image.tag, model)
        server = run_server(image.tag, model, args.port)
    figures = {
        "build_key": manifest["key"],
        "build_seconds": manifest["duration_s"],
        "cached": manifest["cached"],
        "toolchain": manifest.get("toolchain", {}),
        "runtime_image": image.tag,
        "bench_device": device_line(bench["log"]),
        "bench_rows": [
            {key: row.get(key) for key in ("backends", "n_gpu_layers", "n_prompt", "n_gen", "avg_ts")}
            for row in bench["rows"]
        ],
        "server_device": device_line(server["log"]),
        "server_tokens_predicted": server["tokens_predicted"],
        "server_offload": [line for line in server["log"].splitlines() if "offloaded" in line],
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    if not (figures["bench_device"] and figures["server_device"]):
        print(
            "no Vulkan device in a load log:\n" + bench["log"][-3000:] + server["log"][-3000:],
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
