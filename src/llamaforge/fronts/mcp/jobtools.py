"""The job tools: a job started by a ``*_start`` tool is followed with job_status and job_logs, listed with
jobs_list and stopped with job_cancel."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, TypeVar

import anyio.to_thread
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, Field

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.jobs import FINISHED, JobLogs, JobManager, JobStatus
from llamaforge.fronts.mcp.arguments import CheckedTool
from llamaforge.fronts.mcp.output import Output

JOB_TOOLS = ("job_status", "job_logs", "job_cancel", "jobs_list")
_T = TypeVar("_T")


class JobList(BaseModel):
    """Every job of this server process, newest first."""

    jobs: list[JobStatus]


def job_tools(jobs: JobManager, output: Output, *, with_cancel: bool) -> list[Tool]:
    """job_status, job_logs, jobs_list and (with ``with_cancel``) job_cancel, over ``jobs``."""

    def call(function: Callable[[str], _T], job_id: str) -> _T:
        try:
            return function(job_id)
        except LlamaforgeError as error:
            raise output.error(error.render()) from None

    def shown(model: BaseModel) -> CallToolResult:
        return output.result(model.model_dump(mode="json", by_alias=True))

    async def job_status(
        job_id: Annotated[str, Field(description="Id returned by a *_start tool")],
    ) -> Annotated[CallToolResult, JobStatus]:
        """State of a background job: running/cancelling/succeeded/failed/cancelled, progress, result or error."""
        return shown(call(jobs.status, job_id))

    async def job_logs(
        job_id: Annotated[str, Field(description="Id returned by a *_start tool")],
        offset: Annotated[
            int, Field(description="First line; negative counts from the end (-50: the tail)")
        ] = 0,
        limit: Annotated[int, Field(ge=1, le=2000, description="Lines per page")] = 200,
    ) -> Annotated[CallToolResult, JobLogs]:
        """One page of a job's log; call again from next_offset for more (the job may still be writing)."""
        return shown(call(functools.partial(jobs.logs, offset=offset, limit=limit), job_id))

    async def job_cancel(
        job_id: Annotated[str, Field(description="Id returned by a *_start tool")],
    ) -> Annotated[CallToolResult, JobStatus]:
        """Cancel a job: its container or process is stopped and removed, nothing is published."""
        status = call(jobs.status, job_id)
        if status.state not in FINISHED:
            status = await anyio.to_thread.run_sync(functools.partial(call, jobs.cancel, job_id))
        return shown(status)

    async def jobs_list() -> Annotated[CallToolResult, JobList]:
        """Every background job of this server (running and recently finished), newest first."""
        return shown(JobList(jobs=jobs.list_jobs()))

    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False)
    tools: list[Tool] = [
        CheckedTool.of(function, output, annotations=read_only, structured_output=True)
        for function in (job_status, job_logs, jobs_list)
    ]
    if with_cancel:
        cancels = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
        tools.append(CheckedTool.of(job_cancel, output, annotations=cancels, structured_output=True))
    return tools
