"""Background jobs: long operations run in threads and are observed by id.

A front (the MCP server, a notebook) calls ``JobManager.start`` and gets a job id at once; ``status``, ``logs``
and ``cancel`` work from any thread while the operation runs. The manager belongs to the process, not to a
client connection, so a job keeps running when the client that started it goes away. ``cancel`` goes through
the operation's ``CancelToken``: its callbacks remove the build container, so cancelling really stops the work.
A job keeps its result as JSON; one whose verdict failed (``OperationFailed``) ends ``failed`` and keeps it too.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from llamaforge.core.errors import Cancelled, ExitCode, InvalidOption, LlamaforgeError, OperationFailed
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import (
    Operation,
    OperationContext,
    Params,
    find_operation,
    operations,
    result_json,
)
from llamaforge.core.validation import describe_errors

logger = logging.getLogger(__name__)

JobState = Literal["running", "cancelling", "succeeded", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class UnknownJob(InvalidOption):
    """No job with that id in this process."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class JobProgress(_Frozen):
    """The latest stage or countable step a job reported."""

    stage: str
    message: str
    completed: float | None = None
    total: float | None = None


class JobError(_Frozen):
    """Why a job failed, as the user should read it (no traceback)."""

    type: str
    message: str
    hint: str | None = None
    exit_code: int
    rendered: str


class JobStatus(_Frozen):
    """A snapshot of one job."""

    id: str
    operation: str
    params: dict[str, Any]
    state: JobState
    created_at: str
    finished_at: str | None = None
    seconds: float
    progress: JobProgress | None = None
    log_lines: int
    result: dict[str, Any] | None = None  # also kept when the job failed with a result (a failing verdict)
    error: JobError | None = None


class JobLogs(_Frozen):
    """One page of a job's event log; ``next_offset`` is where the following page starts."""

    id: str
    state: JobState
    offset: int
    next_offset: int
    first_offset: int
    total: int
    lines: list[str]


@dataclass(frozen=True)
class JobEvent:
    """An event as a job recorded it: its position in the log and when it arrived."""

    index: int
    at: float
    event: Event

    def line(self) -> str:
        """The event as one log line."""
        stamp = datetime.datetime.fromtimestamp(self.at, datetime.UTC).strftime("%H:%M:%S")
        stage = f"{self.event.stage}: " if self.event.stage else ""
        return f"{stamp} {self.event.kind:<8} {stage}{self.event.message}"


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")


@dataclass
class _Job:
    id: str
    operation: Operation
    params: Params
    cancel: CancelToken
    created: float
    monotonic_start: float
    state: JobState = "running"
    finished: float | None = None
    seconds: float | None = None
    events: list[JobEvent] = field(default_factory=list)
    first_index: int = 0
    count: int = 0
    progress: JobProgress | None = None
    result: dict[str, Any] | None = None
    error: JobError | None = None
    thread: threading.Thread | None = None


class JobManager:
    """Runs operations in background threads and keeps their state, logs and results."""

    def __init__(
        self,
        registry: Mapping[str, Operation] | None = None,
        *,
        max_log_lines: int = 50_000,
        keep_finished: int = 100,
    ) -> None:
        self._registry = registry if registry is not None else operations()
        self._max_log_lines = max_log_lines
        self._keep_finished = keep_finished
        self._jobs: dict[str, _Job] = {}
        self._changed = threading.Condition()

    # --- starting and running ------------------------------------------------------------------------

    def validate(self, operation: str, params: Mapping[str, Any] | Params) -> tuple[Operation, Params]:
        """The operation and its validated parameters (``InvalidOption`` for unknown names or bad values)."""
        op = find_operation(operation, self._registry)
        if isinstance(params, op.params):
            return op, params
        raw = params.model_dump() if isinstance(params, BaseModel) else dict(params)
        try:
            return op, op.params.model_validate(raw)
        except ValidationError as error:
            raise InvalidOption(
                f"invalid parameters for {op.name}: {describe_errors(error)}",
                hint=f"see the {op.name} parameters and their descriptions",
            ) from None

    def start(self, operation: str, params: Mapping[str, Any] | Params | None = None) -> str:
        """Validate ``params``, start ``operation`` in a background thread and return the job id at once."""
        op, validated = self.validate(operation, params or {})
        job = _Job(
            id=uuid.uuid4().hex[:12],
            operation=op,
            params=validated,
            cancel=CancelToken(),
            created=time.time(),
            monotonic_start=time.monotonic(),
        )
        with self._changed:
            self._prune()
            self._jobs[job.id] = job
        thread = threading.Thread(target=self._run, args=(job,), name=f"llamaforge-job-{job.id}", daemon=True)
        job.thread = thread
        thread.start()
        return job.id

    def _record(self, job: _Job, event: Event) -> None:
        with self._changed:
            job.events.append(JobEvent(job.count, time.time(), event))
            job.count += 1
            overflow = len(job.events) - self._max_log_lines
            if overflow > 0:
                del job.events[:overflow]
                job.first_index += overflow
            if event.kind in ("stage", "progress"):
                job.progress = JobProgress(
                    stage=event.stage, message=event.message, completed=event.completed, total=event.total
                )
            self._changed.notify_all()

    def _run(self, job: _Job) -> None:
        def reporter(event: Event) -> None:
            self._record(job, event)

        result: dict[str, Any] | None = None
        error: JobError | None = None
        state: JobState
        try:
            result = result_json(
                job.operation.run(job.params, OperationContext(reporter=reporter, cancel=job.cancel))
            )
            state = "succeeded"
        except Cancelled as exc:
            state, error = "cancelled", _job_error(exc)
        except OperationFailed as exc:  # a failing verdict: the job failed, and its result says why
            state, error, result = "failed", _job_error(exc), result_json(exc.result)
        except LlamaforgeError as exc:
            state, error = ("cancelled" if job.cancel.cancelled else "failed"), _job_error(exc)
        except Exception as exc:  # a job thread records every failure instead of dying silently
            logger.exception("job %s (%s) crashed", job.id, job.operation.name)
            state = "cancelled" if job.cancel.cancelled else "failed"
            error = JobError(
                type=type(exc).__name__,
                message=f"internal error: {exc}",
                exit_code=ExitCode.FAILED,
                rendered=f"internal error in {job.operation.name}: {type(exc).__name__}: {exc}",
            )
        with self._changed:
            job.state, job.result, job.error = state, result, error
            job.finished = time.time()
            job.seconds = time.monotonic() - job.monotonic_start
            self._changed.notify_all()

    def _prune(self) -> None:
        finished = [job for job in self._jobs.values() if job.state in FINISHED]
        for job in sorted(finished, key=lambda item: item.created)[
            : max(0, len(finished) - self._keep_finished)
        ]:
            del self._jobs[job.id]

    # --- observing --------------------------------------------------------------------------------------

    def _get(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(
                f"no job {job_id!r} in this server", hint="jobs_list (or JobManager.list_jobs) shows the jobs"
            )
        return job

    def _snapshot(self, job: _Job) -> JobStatus:
        seconds = job.seconds if job.seconds is not None else time.monotonic() - job.monotonic_start
        return JobStatus(
            id=job.id,
            operation=job.operation.name,
            params=job.params.model_dump(mode="json"),
            state=job.state,
            created_at=_iso(job.created),
            finished_at=_iso(job.finished) if job.finished is not None else None,
            seconds=round(seconds, 3),
            progress=job.progress,
            log_lines=job.count,
            result=job.result,
            error=job.error,
        )

    def status(self, job_id: str) -> JobStatus:
        """State, latest progress, and the result or error once finished."""
        with self._changed:
            return self._snapshot(self._get(job_id))

    def list_jobs(self) -> list[JobStatus]:
        """Every job this manager knows, newest first."""
        with self._changed:
            jobs = sorted(self._jobs.values(), key=lambda item: item.created, reverse=True)
            return [self._snapshot(job) for job in jobs]

    def events(self, job_id: str, offset: int = 0, limit: int | None = None) -> list[JobEvent]:
        """Recorded events from ``offset`` on (at most ``limit``); the oldest may have been dropped."""
        with self._changed:
            job = self._get(job_id)
            start = max(offset, job.first_index) - job.first_index
            stop = None if limit is None else start + max(0, limit)
            return list(job.events[start:stop])

    def logs(self, job_id: str, offset: int = 0, limit: int = 200) -> JobLogs:
        """One page of the job's log as lines. A negative ``offset`` counts from the end (a tail)."""
        with self._changed:
            job = self._get(job_id)
            if offset < 0:
                offset = max(job.count + offset, 0)
            page = self.events(job_id, offset, limit)
            # past the end: the page is empty and starts (like the next one) at the end, not at the offset asked
            start = page[0].index if page else min(max(offset, job.first_index), job.count)
            return JobLogs(
                id=job.id,
                state=job.state,
                offset=start,
                next_offset=page[-1].index + 1 if page else start,
                first_offset=job.first_index,
                total=job.count,
                lines=[item.line() for item in page],
            )

    def wait(self, job_id: str, *, after: int | None = None, timeout: float | None = None) -> JobStatus:
        """Block until the job finishes or (with ``after``) has more than ``after`` events; or ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            job = self._get(job_id)
            while job.state not in FINISHED and (after is None or job.count <= after):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self._snapshot(job)

    # --- cancelling -------------------------------------------------------------------------------------

    def cancel(self, job_id: str, *, wait: float | None = 60.0) -> JobStatus:
        """Cancel the job: its cleanups run now (the build container is removed); wait for it to stop."""
        with self._changed:
            job = self._get(job_id)
            if job.state in FINISHED:
                return self._snapshot(job)
            job.state = "cancelling"
            self._changed.notify_all()
        job.cancel.cancel()
        if job.thread is not None and wait is not None:
            job.thread.join(wait)
        return self.status(job_id)

    def running(self) -> list[str]:
        """Ids of the jobs that have not finished."""
        with self._changed:
            return [job.id for job in self._jobs.values() if job.state not in FINISHED]

    def shutdown(self, *, cancel: bool, timeout: float | None = None) -> None:
        """Before the process exits: cancel running jobs (or let them finish) and wait for their threads."""
        ids = self.running()
        if cancel:
            for job_id in ids:
                self.cancel(job_id, wait=None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for job_id in ids:
            thread = self._jobs[job_id].thread
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _job_error(error: LlamaforgeError) -> JobError:
    return JobError(
        type=type(error).__name__,
        message=error.message,
        hint=error.hint,
        exit_code=error.exit_code,
        rendered=error.render(),
    )
