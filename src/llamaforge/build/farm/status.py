"""What each builder of a fleet offers now: reachable or not (and why, with the next step), its engine or system,
cores, memory, free disk and the llamaforge images it has. Every builder is asked at once, each with a short
timeout, so one silent machine does not hold up the others."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from llamaforge.build.farm.builders import Builder
from llamaforge.core.errors import LlamaforgeError
from llamaforge.runners.engine_probe import probe_engine

GIB = 1024**3

# One line per fact; POSIX sh on Linux and macOS (sysctl there), no tool beyond the base system.
_HOST_FACTS = r"""
printf 'system=%s\n' "$(uname -sm)"
printf 'cores=%s\n' "$(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu)"
if [ -r /proc/meminfo ]; then
  awk '/^MemTotal:/ {printf "memory_kib=%s\n", $2}' /proc/meminfo
else
  printf 'memory_kib=%s\n' "$(( $(sysctl -n hw.memsize) / 1024 ))"
fi
df -Pk "$HOME" | awk 'NR==2 {printf "free_kib=%s\n", $4}'
"""


@dataclass
class BuilderFacts:
    """One builder's answers (``error``/``hint`` when it did not answer)."""

    builder: Builder
    reachable: bool = False
    version: str | None = None
    system: str | None = None
    cores: int | None = None
    cores_probed: bool = False
    memory_gib: float | None = None
    memory_probed: bool = False
    free_disk_gib: float | None = None
    images: list[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None


def _engine(facts: BuilderFacts) -> None:
    found = probe_engine(facts.builder.engine_config())
    facts.version = f"Docker {found.version} (API {found.api_version})"
    facts.system = f"{found.os} {found.architecture}"
    facts.cores, facts.memory_gib = found.cores or None, round(found.memory_bytes / GIB, 1) or None
    facts.free_disk_gib = None if found.free_disk_bytes is None else round(found.free_disk_bytes / GIB, 1)
    facts.images = list(found.images)


def _host(facts: BuilderFacts) -> None:
    from llamaforge.runners.ssh import SshProcessRunner

    runner = SshProcessRunner(facts.builder.ssh_host())
    try:
        output = runner.run(["sh", "-c", _HOST_FACTS]).stdout
    finally:
        runner.close()
    values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    facts.system = values.get("system")
    facts.version = "SSH build host"
    cores, memory, free = values.get("cores", ""), values.get("memory_kib", ""), values.get("free_kib", "")
    facts.cores = int(cores) if cores.isdigit() else None
    facts.memory_gib = round(int(memory) * 1024 / GIB, 1) if memory.isdigit() else None
    facts.free_disk_gib = round(int(free) * 1024 / GIB, 1) if free.isdigit() else None


def probe_builder(builder: Builder) -> BuilderFacts:
    """Ask ``builder`` what it offers; a builder that does not answer is reported, never raised."""
    facts = BuilderFacts(builder)
    try:
        (_engine if builder.engine is not None else _host)(facts)
    except LlamaforgeError as error:
        facts.error, facts.hint = error.message, error.hint
        return facts
    facts.reachable = True
    # Given figures win over probed ones (a shared machine may offer less than it has).
    facts.cores_probed = builder.cores is None and facts.cores is not None
    facts.memory_probed = builder.memory_gib is None and facts.memory_gib is not None
    facts.cores = builder.cores or facts.cores
    facts.memory_gib = builder.memory_gib or facts.memory_gib
    return facts


def fleet_status(builders: Sequence[Builder]) -> list[BuilderFacts]:
    """Every builder's facts, asked at once, in the fleet's order."""
    answers: dict[str, BuilderFacts] = {}

    def ask(builder: Builder) -> None:
        try:
            answers[builder.name] = probe_builder(builder)
        except Exception as error:  # noqa: BLE001 - a client library's own failure is this builder's answer
            facts = answers[builder.name] = BuilderFacts(builder)
            facts.error = f"{builder.name}: the probe failed: {type(error).__name__}: {error}"
            facts.hint = "check the builder's engine or build_host in the fleet file"

    threads = [threading.Thread(target=ask, args=(builder,), daemon=True) for builder in builders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [answers[builder.name] for builder in builders]
