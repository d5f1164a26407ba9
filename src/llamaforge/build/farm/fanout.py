"""A build matrix fanned out over a builder fleet: every entry on a builder that can build it, as many at once as
the builders have slots, each in a thread of its own.

* Before anything runs, an entry no selected builder can build (platform, toolchain, labels) refuses the whole
  matrix, naming why each builder does not qualify; every engine is pinged, and an unreachable one is left out
  (with a warning naming it and why) — its entries go to the others, or fail if no other qualifies.
* Every event of an entry is prefixed with ``ENTRY@BUILDER:``.
* A builder lost mid-build (its engine stops answering, its container vanishes, its SSH connection drops, its disk
  is full) is left out from then on; the entry is retried once on another builder that qualifies, then reported
  failed.
* Cancelling (Ctrl-C) cancels every running entry at once (each removes its container on its own engine) and
  leaves the entries not started ``not run``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from llamaforge.build.ccache import RemoteCache
from llamaforge.build.executors.base import Executor
from llamaforge.build.farm.builders import Builder
from llamaforge.build.farm.images import ImageShipper, sending_executor
from llamaforge.build.farm.placement import Need, choose, eligible, refusal
from llamaforge.build.matrix import Matrix, MatrixEntry, MatrixRow, MatrixStopped
from llamaforge.core.errors import Cancelled, DockerUnavailable, ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import OperationContext
from llamaforge.runners.engine import EngineConfig
from llamaforge.runners.engine_probe import ping_engine

BuildOne = Callable[[MatrixEntry, Executor, Builder, OperationContext], dict[str, Any]]
"""Builds one entry with an executor on a builder; returns the row's fields (result, key, platform, …)."""

RETRIES = 1  # how many times an entry lost with its builder is tried on another one
_DISK_FULL = "no space left on device"  # what the kernel says through docker, tar, cmake and the compilers


def entry_need(matrix: Matrix, entry: MatrixEntry) -> Need:
    """What ``entry`` asks of a builder: its platform (else its recipe's), toolchain and labels."""
    platform = entry.platform
    if platform is None:
        from llamaforge.build.recipes import load_recipe

        platform = load_recipe(entry.recipe or matrix.recipe).platform
    return Need(entry.name, platform, tuple(entry.labels), entry.toolchain)


@dataclass
class _Attempt:
    entry: MatrixEntry
    need: Need
    lost: list[str] = field(default_factory=list)  # builders lost while this entry ran there


@dataclass
class _Outcome:
    attempt: _Attempt
    builder: Builder
    seconds: float
    row: dict[str, Any] | None = None
    error: BaseException | None = None
    lost: DockerUnavailable | LlamaforgeError | None = None


class FleetRun:
    """One matrix over some builders of a fleet (see the module docstring)."""

    def __init__(
        self,
        matrix: Matrix,
        builders: list[Builder],
        build_one: BuildOne,
        ctx: OperationContext,
        *,
        local_engine: EngineConfig | None = None,
        remote_cache: RemoteCache | None = None,
    ) -> None:
        self.matrix = matrix
        self.builders = builders
        self.remote_cache = remote_cache  # the fleet's shared ccache storage, for its Docker builders
        self.build_one = build_one
        self.ctx = ctx
        self._report_lock = threading.Lock()
        sources = [("this machine", local_engine or EngineConfig())] + [
            (builder.name, builder.engine_config()) for builder in builders if builder.engine is not None
        ]
        self.shipper = ImageShipper(sources)
        self.lost: dict[str, str] = {}

    def report(self, event: Event, prefix: str = "") -> None:
        """Hand ``event`` to the front (one at a time), its message prefixed."""
        message = f"{prefix}: {event.message}" if prefix else event.message
        # A count (the compile steps) is told apart by its stage: each entry's is its own.
        stage = f"{prefix} {event.stage}" if prefix and event.kind == "progress" else event.stage
        with self._report_lock:
            self.ctx.reporter(Event(event.kind, message, stage, event.completed, event.total, event.unit))

    def _needs(self) -> list[_Attempt]:
        attempts = []
        for entry in self.matrix.builds:
            need = entry_need(self.matrix, entry)
            if not eligible(need, self.builders):
                names = ", ".join(builder.name for builder in self.builders)
                raise InvalidOption(
                    f"no builder of {names} can build the entry {entry.name!r} ({need.describe()}): "
                    + refusal(need, self.builders),
                    hint="add a builder with that platform and those labels to the fleet, select it with "
                    "--builders, or change the entry",
                )
            attempts.append(_Attempt(entry, need))
        return attempts

    def _ping_all(self) -> None:
        """Leave out every engine that does not answer now (pinged at once, each in its own thread)."""
        answers: dict[str, DockerUnavailable | None] = {}

        def ping(builder: Builder) -> None:
            answers[builder.name] = ping_engine(builder.engine_config())

        threads = [
            threading.Thread(target=ping, args=(builder,), daemon=True)
            for builder in self.builders
            if builder.engine is not None
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name, error in answers.items():
            if error is not None:
                self.lost[name] = error.message
                self.report(
                    Event(
                        "warning", f"builder {name} is left out: {error.message} (hint: {error.hint})", "farm"
                    )
                )

    def _is_lost(self, builder: Builder, error: BaseException) -> LlamaforgeError | None:
        """The error that says ``builder`` is gone, when ``error`` (raised by a build there) means that."""
        said = f"{error} {getattr(error, 'hint', '')} {' '.join(getattr(error, 'tail', None) or [])}"
        if isinstance(error, LlamaforgeError) and _DISK_FULL in said.lower():
            return LlamaforgeError(
                f"its disk is full: {error.message}", hint="free space there (docker system prune)"
            )
        if builder.engine is None:
            return error if isinstance(error, LlamaforgeError) and error.exit_code == ExitCode.SSH else None
        if isinstance(error, DockerUnavailable):
            return error
        return ping_engine(builder.engine_config())

    def _work(self, attempt: _Attempt, builder: Builder, done: queue.Queue[_Outcome]) -> None:
        prefix = f"{attempt.entry.name}@{builder.name}"
        child = CancelToken()

        def cancel_child() -> None:
            threading.Thread(target=lambda: _quietly(child.cancel), daemon=True).start()

        unregister = self.ctx.cancel.on_cancel(cancel_child)
        started = time.monotonic()
        outcome = _Outcome(attempt, builder, 0.0)
        executor: Executor | None = None
        try:
            executor = sending_executor(builder, self.shipper, self.remote_cache)
            sub = OperationContext(reporter=lambda event: self.report(event, prefix), cancel=child)
            outcome.row = self.build_one(attempt.entry, executor, builder, sub)
        except BaseException as error:  # noqa: BLE001 - every failure of a worker thread goes back to the loop
            outcome.error = error
            if not child.cancelled and not isinstance(error, Cancelled):
                outcome.lost = self._is_lost(builder, error)
        finally:
            unregister()
            close = getattr(executor, "close", None)
            if close is not None:
                with suppress(Exception):
                    close()
            outcome.seconds = time.monotonic() - started
            done.put(outcome)

    def _start_what_fits(
        self, pending: list[_Attempt], running: dict[str, int], done: queue.Queue[_Outcome]
    ) -> int:
        """Start every pending entry a builder has a free slot for (in the matrix's order); how many started."""
        started = 0
        for attempt in list(pending):
            builder = choose(attempt.need, self.builders, running, excluded={*self.lost, *attempt.lost})
            if builder is None:
                continue
            pending.remove(attempt)
            running[builder.name] = running.get(builder.name, 0) + 1
            started += 1
            slot = f"{running[builder.name]}/{builder.concurrency}"
            self.report(Event("stage", f"{attempt.entry.name} → {builder.label()} (slot {slot})", "matrix"))
            threading.Thread(target=self._work, args=(attempt, builder, done), daemon=True).start()
        return started

    def run(self) -> list[MatrixRow]:
        """Run every entry; the rows in the matrix's order. MatrixStopped when cancelled."""
        pending = self._needs()
        self._ping_all()
        rows: dict[str, MatrixRow] = {}
        running: dict[str, int] = {}
        active = 0
        done: queue.Queue[_Outcome] = queue.Queue()
        while True:
            if not self.ctx.cancel.cancelled:
                active += self._start_what_fits(pending, running, done)
            if active == 0:
                if self.ctx.cancel.cancelled:
                    break  # what did not start stays "not run"
                for attempt in pending:  # nothing runs, so nothing will free a builder for these
                    rows[attempt.entry.name] = self._stranded(attempt)
                break
            try:
                outcome = done.get(timeout=0.5)
            except queue.Empty:
                continue
            active -= 1
            running[outcome.builder.name] -= 1
            retry = self._settle(outcome, rows)
            if retry is not None:
                pending.append(retry)
        ordered = [
            rows.get(entry.name) or MatrixRow(name=entry.name, result="not run")
            for entry in self.matrix.builds
        ]
        if self.ctx.cancel.cancelled:
            raise MatrixStopped(ordered)
        return ordered

    def _settle(self, outcome: _Outcome, rows: dict[str, MatrixRow]) -> _Attempt | None:
        """Record ``outcome``'s row, or return the attempt to run again elsewhere (its builder was lost)."""
        attempt, builder, error = outcome.attempt, outcome.builder, outcome.error
        name = attempt.entry.name
        if error is None:
            row = MatrixRow.model_validate({"name": name, **(outcome.row or {})})
        elif isinstance(error, Cancelled) or self.ctx.cancel.cancelled:
            row = MatrixRow(name=name, result="not run", error="cancelled", exit_code=Cancelled.exit_code)
        elif outcome.lost is not None:
            self.lost[builder.name] = outcome.lost.message
            attempt.lost.append(builder.name)
            others = [
                other.name
                for other in eligible(attempt.need, self.builders)
                if other.name not in self.lost and other.name not in attempt.lost
            ]
            self.report(
                Event("warning", f"{name}@{builder.name}: builder lost: {outcome.lost.message}", "farm")
            )
            if len(attempt.lost) <= RETRIES and others:
                self.report(
                    Event("stage", f"{name}: retrying on another builder ({', '.join(others)})", "farm")
                )
                return attempt
            row = self._failed(
                attempt, f"builder {builder.name} was lost: {outcome.lost.message}", outcome.lost
            )
        elif isinstance(error, LlamaforgeError):
            row = self._failed(attempt, error.message, error)
        else:
            row = self._failed(attempt, f"{type(error).__name__}: {error}", None)
        row.builder = builder.label()
        row.lost_builders = list(attempt.lost) or None
        row.seconds = round(outcome.seconds, 1)
        rows[name] = row
        return None

    def _failed(self, attempt: _Attempt, message: str, error: LlamaforgeError | None) -> MatrixRow:
        entry = attempt.entry
        return MatrixRow(
            name=entry.name,
            result="failed",
            error=message,
            hint=error.hint if error else "run it again; report the error if it stays",
            exit_code=error.exit_code if error else ExitCode.FAILED,
            platform=attempt.need.platform,
            backend=entry.backend,
            archs=entry.arch,
        )

    def _stranded(self, attempt: _Attempt) -> MatrixRow:
        """The row of an entry every builder that qualifies for was lost (or left out)."""
        reasons = "; ".join(
            f"{builder.name}: {self.lost[builder.name]}"
            for builder in eligible(attempt.need, self.builders)
            if builder.name in self.lost
        )
        row = MatrixRow(
            name=attempt.entry.name,
            result="failed",
            error=f"no builder left that can build it ({attempt.need.describe()}): {reasons}",
            hint="`invoke builders.status` says which builders answer; bring one back or add another",
            exit_code=DockerUnavailable.exit_code,
            platform=attempt.need.platform,
            backend=attempt.entry.backend,
            archs=attempt.entry.arch,
        )
        row.lost_builders = list(attempt.lost) or None
        return row


def _quietly(action: Callable[[], None]) -> None:
    """Run ``action``; an engine that cannot be reached while cancelling is no reason to stop cancelling."""
    with suppress(Exception):
        action()


def fleet_matrix(
    matrix: Matrix,
    spec: str,
    build_one: BuildOne,
    ctx: OperationContext,
    remote_cache: RemoteCache | None = None,
) -> list[MatrixRow]:
    """Run every entry of ``matrix`` in parallel on the fleet ``spec`` names (``NAME`` or a path, with
    ``:b1,b2`` for some of its builders); see the module docstring. The Docker builders share ``remote_cache``
    (``--ccache-remote``), else the fleet's ``[ccache]`` storage."""
    from llamaforge.build.farm.builders import load_fleet

    name, _, chosen = spec.partition(":")
    fleet = load_fleet(name)
    for entry in matrix.builds:
        if entry.executor != "docker" or entry.build_host or entry.ssh_key or entry.known_hosts:
            raise InvalidOption(
                f"the matrix entry {entry.name!r} names its own executor or build host; with --builders the "
                "fleet places every entry",
                hint="drop executor/build_host/ssh_key/known_hosts from the entry and add that host to the fleet "
                "as a build_host builder, or run the matrix without --builders",
            )
    cache = remote_cache or fleet.remote_cache()
    return FleetRun(matrix, fleet.select(chosen or None), build_one, ctx, remote_cache=cache).run()
