"""CUDA compile time for the user's arch vs upstream's default arch list, same toolkit, same units, one run.

Compiles a representative set of ggml-cuda translation units in the wheel builder image (CUDA 13.0.2 from PyPI,
ccache off) for `--arch 86` and for the list upstream builds when no arch is given (GGML_NATIVE=OFF, CUDA >= 12.8:
75-virtual;80-virtual;86-real;89-real;90-virtual;120a-real;121a-real), alternating the two, and prints the
compile seconds and the ratio (goal: single arch <= 0.4 of the default list). Configure time is not counted.

Needs Docker, the base image (`invoke images.bootstrap`), PyPI from containers (pass the machine's CA bundle with
--ca-bundle behind a TLS-intercepting proxy) and the extracted llama.cpp source (LLAMAFORGE_TEST_SOURCE).
Usage: python benchmarks/cuda_arch_bench.py [--runs 1] [--units fill.cu softmax.cu ...] [--ca-bundle FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from llamaforge.backends.cuda.unit_probe import probe_units
from llamaforge.build.executors import make_executor
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe

UPSTREAM_DEFAULT = ("75-virtual", "80-virtual", "86-real", "89-real", "90-virtual", "120a-real", "121a-real")
UNITS = ("fill.cu", "softmax.cu", "template-instances/mmq-instance-q4_0.cu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--units", nargs="+", default=list(UNITS))
    parser.add_argument("--ca-bundle", type=Path, default=None)
    args = parser.parse_args()
    source = Path(os.environ["LLAMAFORGE_TEST_SOURCE"])
    executor = make_executor("docker")
    lists = {"86": ("86",), "upstream default": UPSTREAM_DEFAULT}
    seconds: dict[str, list[float]] = {name: [] for name in lists}
    with tempfile.TemporaryDirectory(prefix="llamaforge-cuda-bench-") as scratch:
        for run in range(args.runs):
            for name, archs in lists.items():
                options = BuildOptions(cuda_architectures=archs, ca_bundle=args.ca_bundle)
                plan = plan_build(load_recipe("default"), options)
                code, took = probe_units(
                    plan, args.units, source, Path(scratch) / f"{run}-{len(archs)}", executor
                )
                sass = sorted({arch for kinds in code.values() for arch in kinds["sass"]})
                ptx = sorted({arch for kinds in code.values() for arch in kinds["ptx"]})
                print(
                    f"run {run + 1} {name:>16}: {took:7.1f} s   SASS {','.join(sass)}   PTX {','.join(ptx)}"
                )
                seconds[name].append(took)
    one, default = (statistics.median(seconds[name]) for name in lists)
    print(f"units: {', '.join(args.units)}")
    print(
        f"compile seconds (median of {args.runs}): --arch 86 {one:.1f} s, upstream default list {default:.1f} s"
    )
    print(f"ratio 86 / default = {one / default:.2f}  (goal <= 0.4)")


if __name__ == "__main__":
    main()
