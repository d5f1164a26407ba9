"""The fan-out's per-step costs on this machine: two fresh TLS engines (tests/engines.py), the builder image sent to
them, a 4-entry mini matrix over the fleet against the same 4 entries one after another on this engine.

Run: `python benchmarks/farm_fanout.py` (Docker and the base image needed)."""

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
os.environ["LLAMAFORGE_HOME"] = tempfile.mkdtemp(prefix="lf-measure-home-")

from engines import engines  # noqa: E402 - after the path setup
from helpers import mini_recipe  # noqa: E402
from test_farm import Recorder, _fleet, _matrix, _run  # noqa: E402

tmp = Path(tempfile.mkdtemp(prefix="lf-measure-"))
gen = engines(2)
started = time.monotonic()
pair = next(gen)
print("engines up", round(time.monotonic() - started, 1))
try:
    fleet = _fleet(tmp / "lab.toml", pair)
    recipe = mini_recipe(tmp, ["llama-cli"])
    entries = [{"name": f"m{i}", "cmake": {"X": f"m{i}"}} for i in range(4)]
    matrix = _matrix(tmp / "m.toml", recipe, entries)
    rec = Recorder()
    t = time.monotonic()
    result = _run(matrix, str(fleet), rec)
    wall = time.monotonic() - t
    for _, message in rec.events:
        if "has llamaforge-builder" in message or "sending the builder image" in message:
            print(message)
    print("fleet wall", round(wall, 1), [(r.name, r.builder.split()[0], r.seconds) for r in result.matrix])
    entries2 = [{"name": f"s{i}", "cmake": {"X": f"s{i}"}} for i in range(4)]
    matrix2 = _matrix(tmp / "s.toml", recipe, entries2)
    from llamaforge.build.ops import BuildParams, build_op
    from llamaforge.core.registry import OperationContext

    t = time.monotonic()
    seq = build_op(BuildParams(matrix=str(matrix2)), OperationContext())
    print("sequential local wall", round(time.monotonic() - t, 1), [(r.name, r.seconds) for r in seq.matrix])
finally:
    t = time.monotonic()
    with contextlib.suppress(StopIteration):
        next(gen)
    print("engines removed", round(time.monotonic() - t, 1))
