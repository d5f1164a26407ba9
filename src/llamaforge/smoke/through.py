"""Smoke a deployed llama-server through its host's SSH connection: greedy tokens, llama-server's own tok/s, and
which device holds which buffer (from the service's load log).

Used for an RPC topology's head (``topology.smoke``), next to a single-host deployment of the same model. The
buffers are grouped by the device llama.cpp names in its log: ``CPU``/``CPU_Mapped`` on the head, ``RPC0[addr:
port]`` for the first device of the RPC server at that address, ``CUDA0`` for a local GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamaforge.serve.loadlog import BUFFER_KINDS, LoadLog, parse_load_log
from llamaforge.smoke.answers import GoldenRequest, _post, greedy_completion

_HOST_BUFFERS = ("CPU", "CPU_Mapped", "CPU_REPACK", "CPU_AARCH64")


@dataclass(frozen=True)
class ServeFigures:
    """One measured server: its greedy tokens and llama-server's timings (mean over the runs)."""

    tokens: list[str]
    tg_tps: float
    pp_tps: float
    runs: int


def measure(base_url: str, *, n_predict: int = 32, runs: int = 3, timeout: float = 300.0) -> ServeFigures:
    """Greedy tokens (one ``/completion`` with logprobs) and the mean tok/s llama-server reports over ``runs``
    completions of ``n_predict`` tokens (``timings.predicted_per_second`` / ``prompt_per_second``)."""
    tokens = [
        str(entry["token"]) for entry in greedy_completion(base_url, GoldenRequest(n_predict=16, n_probs=1))
    ]
    tg, pp = [], []
    body = GoldenRequest(n_predict=n_predict, n_probs=0).body()
    for _ in range(runs):
        timings = _post(base_url, "/completion", body, timeout).get("timings") or {}
        tg.append(float(timings.get("predicted_per_second") or 0.0))
        pp.append(float(timings.get("prompt_per_second") or 0.0))
    return ServeFigures(tokens, round(sum(tg) / len(tg), 2), round(sum(pp) / len(pp), 2), runs)


def device_of(buffer_type: str) -> str:
    """The device a llama.cpp buffer type lives on: ``head`` for host buffers, else the name without
    ``_Mapped`` (``RPC0[10.0.0.2:50052]``, ``CUDA0``)."""
    return "head" if buffer_type in _HOST_BUFFERS else buffer_type.removesuffix("_Mapped")


def buffers_by_device(log: LoadLog) -> dict[str, dict[str, int]]:
    """``{device: {kind: bytes}}`` from a parsed load log (kinds as :data:`~llamaforge.serve.loadlog.BUFFER_KINDS`)."""
    devices: dict[str, dict[str, int]] = {}
    for kind in BUFFER_KINDS:
        for buffer_type, size in log.buffers.get(kind, {}).items():
            per = devices.setdefault(device_of(buffer_type), {})
            per[kind] = per.get(kind, 0) + size
    return devices


def load_log_devices(lines: Sequence[str]) -> dict[str, dict[str, int]]:
    """:func:`buffers_by_device` of the last load in ``lines`` (a service's journal)."""
    return buffers_by_device(parse_load_log(lines))


def figures_json(figures: ServeFigures) -> dict[str, Any]:
    """JSON-able figures."""
    return {
        "tokens": figures.tokens,
        "tg_tps": figures.tg_tps,
        "pp_tps": figures.pp_tps,
        "runs": figures.runs,
    }
