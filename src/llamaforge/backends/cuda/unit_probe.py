"""Compile a few ggml-cuda units with a plan's exact cmake arguments in its builder image and list their device
code: the flags and the toolkit checked in minutes, without building the whole library (benchmarks use it)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llamaforge.backends.cuda.device_code import LISTING, OBJECTS, DeviceCode, parse_listing

if TYPE_CHECKING:
    from llamaforge.build.executors.base import Executor
    from llamaforge.build.plan import BuildPlan


def unit_probe_script(plan: BuildPlan, units: Sequence[str]) -> str:
    """A script for the plan's builder image that configures llama.cpp with exactly the plan's cmake arguments,
    compiles only the ggml-cuda ``units`` (``fill.cu``, ``template-instances/mmq-instance-q4_0.cu``) and lists
    their device code with the build script's own listing step: the flags and the toolkit checked in minutes."""
    text = plan.script.text
    listing = text[text.index('echo "llamaforge: list device code"') :]
    listing = listing[: listing.index("\n{\n")]
    objects = [f"{OBJECTS}/{unit}.o" for unit in units]
    copies = "\n".join(
        f"cp /build/{shlex.quote(obj)} /out/bin/{shlex.quote(Path(obj).name)}" for obj in objects
    )
    return f"""set -euo pipefail
out_dir=/out
cmake -S /src -B /build {shlex.join(plan.cmake_args)}
mkdir -p /out/bin
started=$EPOCHREALTIME
ninja -C /build {shlex.join(objects)}
printf '%s %s\n' "$started" "$EPOCHREALTIME" > /out/compile-seconds.txt
{copies}
{listing}
nvcc --version | tail -n 1 > /out/nvcc.txt
"""


def probe_units(
    plan: BuildPlan, units: Sequence[str], source_tree: Path, out: Path, executor: Executor
) -> tuple[DeviceCode, float]:
    """Run :func:`unit_probe_script` through ``executor`` (the docker executor: the plan's builder image) with
    ccache off; the units' device code and the seconds their compilation took (configure not counted)."""
    from llamaforge.build.executors.base import LogSink, RunRequest
    from llamaforge.core.events import CancelToken

    executor.prepare_environment(plan, lambda event: None)
    probe = dataclasses.replace(
        plan, script=dataclasses.replace(plan.script, text=unit_probe_script(plan, units))
    )
    out.mkdir(parents=True, exist_ok=True)
    sink = LogSink(out.parent / f"{out.name}.log", lambda event: None)
    try:
        executor.run(RunRequest(probe, source_tree, out, sink, CancelToken(), use_ccache=False))
    finally:
        sink.close()
    started, ended = (float(value) for value in (out / "compile-seconds.txt").read_text().split())
    return parse_listing((out / LISTING).read_text(encoding="utf-8")), ended - started
