"""The Jupyter front: ``%load_ext llamaforge``, then ``%llamaforge OPERATION [ARGS]`` for every operation.

The magic is generated from the operation registry like the Invoke tasks: each operation's parameter model
becomes an argparse parser (``%llamaforge build --help``), the operation runs as a job of a
:class:`~llamaforge.core.jobs.JobManager` while the kernel thread renders its events as a progress bar, and the result
comes back as an :class:`OperationResult` whose ``_repr_html_`` draws tables and charts. User errors show their
message and hint, not a traceback. ``run("models.fit", model=..., ctx=...)`` is the same thing from Python.
"""

from __future__ import annotations

import argparse
import html
import json
import shlex
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from llamaforge.core.errors import ExitCode, InvalidOption, LlamaforgeError
from llamaforge.core.jobs import FINISHED, JobManager, JobStatus
from llamaforge.core.registry import Operation, Params, find_operation, operations
from llamaforge.core.validation import booleans_for_numbers, describe_errors
from llamaforge.core.views.html import badge, kv_table, section
from llamaforge.fronts.jupyter_progress import ProgressView, progress_view
from llamaforge.fronts.render_html import render_html, render_text

_FRONT_FLAGS = ("help", "background")


# --- errors ------------------------------------------------------------------------------------------------


class NotebookError(LlamaforgeError):
    """A failed ``%llamaforge`` call; IPython shows its message and hint instead of a traceback.

    When the operation ran to a failing verdict (a smoke threshold, a verify check), ``result`` is its full
    :class:`OperationResult`: shown below the error, and there to read (``error.result["verdict"]``).
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        exit_code: int = ExitCode.FAILED,
        rendered: str | None = None,
        error_type: str = "LlamaforgeError",
        result: OperationResult | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
        self.error_type = error_type
        self.result = result
        self._rendered = rendered

    @classmethod
    def from_error(cls, error: LlamaforgeError) -> NotebookError:
        """Wrap a core error, keeping its exit code and rendering."""
        return cls(
            error.message,
            hint=error.hint,
            exit_code=error.exit_code,
            rendered=error.render(),
            error_type=type(error).__name__,
        )

    def render(self) -> str:
        return self._rendered or super().render()

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting a traceback: the user sees what to do, not our stack.
        first, *rest = self.render().splitlines() or [""]
        shown = render_text(self.result.operation, self.result.data).splitlines() if self.result else []
        return [*shown, f"\x1b[1;31merror:\x1b[0m {first}", *rest]


# --- parsing: one argparse parser per operation, generated from its Params model ----------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise NotebookError(
            message, hint=f"`{self.prog} --help` lists the options", exit_code=ExitCode.BAD_INPUT
        )

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise NotebookError(message or f"{self.prog} stopped", exit_code=status or ExitCode.BAD_INPUT)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _argument_spec(info: FieldInfo) -> dict[str, Any]:
    """argparse keyword arguments (type, choices, action) for one field of a parameter model."""
    annotation = _unwrap_optional(info.annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return (
            {"action": "store_true"}
            if info.get_default() is not True
            else {"action": argparse.BooleanOptionalAction}
        )
    if origin is list:
        (item,) = typing.get_args(annotation) or (str,)
        spec = _argument_spec(FieldInfo(annotation=item))
        return {**spec, "action": "append"}
    if origin is typing.Literal:
        return {"choices": [str(choice) for choice in typing.get_args(annotation)]}
    if annotation in (int, float):
        return {"type": annotation}
    return {"type": str}


def _help_text(info: FieldInfo) -> str:
    text = (info.description or "").replace("%", "%%")
    if info.is_required():
        return text
    default = info.get_default(call_default_factory=True)
    if default not in (None, False, [], ""):
        text += f" (default: {default})"
    return text


def build_parser(op: Operation) -> argparse.ArgumentParser:
    """The argparse parser of ``%llamaforge OP``: one option per parameter field, positionals as declared."""
    notes = ["read-only" if op.read_only else "changes state"]
    if op.long_running:
        notes.append("long-running: --background returns a job handle at once")
    parser = _Parser(
        prog=f"%llamaforge {op.name}",
        description=f"{op.summary}\n({'; '.join(notes)})",
        add_help=False,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name in op.positional:
        info = op.params.model_fields[name]
        parser.add_argument(
            name,
            metavar=name.upper(),
            nargs=None if info.is_required() else "?",
            help=_help_text(info),
            **_argument_spec(info),
        )
    for name, info in op.params.model_fields.items():
        if name in op.positional:
            continue
        if name in _FRONT_FLAGS:
            raise TypeError(f"{op.name}: parameter {name!r} clashes with a flag of the Jupyter front")
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            required=info.is_required(),
            help=_help_text(info),
            **_argument_spec(info),
        )
    parser.add_argument("-h", "--help", action="store_true", help="Show this help")
    if op.long_running:
        parser.add_argument(
            "--background",
            action="store_true",
            help="Start it as a background job and return its handle at once",
        )
    return parser


def resolve_operation(name: str) -> Operation:
    """The operation called ``name``, or the only one whose last part is ``name`` (``fit`` -> ``models.fit``)."""
    if not isinstance(name, str):
        raise NotebookError(
            f"the operation is named by a string, not {type(name).__name__} {name!r}",
            hint='e.g. run("models.fit", model=..., ctx=...); `%llamaforge` lists the operations',
            exit_code=ExitCode.BAD_INPUT,
        )
    try:
        return find_operation(name, short_names=True)
    except InvalidOption as error:
        raise NotebookError.from_error(error) from None


def validate_params(op: Operation, arguments: Mapping[str, Any]) -> Params:
    """``op``'s parameter model from parsed arguments; pydantic's complaints in terms of the flags."""
    properties = op.params.model_json_schema().get("properties", {})
    problems = [
        f"--{where.replace('_', '-')}: {value} is not a number"
        for name, given in arguments.items()
        for where, value in booleans_for_numbers(name, given, properties.get(name, {}))
    ]
    if problems:
        raise NotebookError(
            "; ".join(problems),
            hint=f"`%llamaforge {op.name} --help` lists the options",
            exit_code=ExitCode.BAD_INPUT,
        )
    try:
        return op.params.model_validate({k: v for k, v in arguments.items() if v is not None})
    except ValidationError as error:
        raise NotebookError(
            describe_errors(error, as_flags=True),
            hint=f"`%llamaforge {op.name} --help` lists the options",
            exit_code=ExitCode.BAD_INPUT,
        ) from None
    except LlamaforgeError as error:  # a validator that reads a file (--topology) names what is wrong in it
        raise NotebookError.from_error(error) from None


# --- running: a job in a thread, its events rendered from the kernel thread ---------------------------------


_JOBS: JobManager | None = None


def jobs() -> JobManager:
    """The kernel's job manager: every ``%llamaforge`` call runs as one of its jobs."""
    global _JOBS  # noqa: PLW0603 - one manager per kernel process, made on first use
    if _JOBS is None:
        _JOBS = JobManager()
    return _JOBS


def _follow(job_id: str, view: ProgressView) -> JobStatus:
    """Feed the job's events to ``view`` until it finishes; Ctrl-C / interrupt cancels the job."""
    manager, seen = jobs(), 0
    try:
        while True:
            status = manager.wait(job_id, after=seen, timeout=0.2)
            for item in manager.events(job_id, offset=seen):
                view.event(item.event)
                seen = item.index + 1
            if status.state in FINISHED and seen >= status.log_lines:
                break
    except KeyboardInterrupt:
        status = manager.cancel(job_id, wait=120)
    view.finish(status.state, status.seconds)
    return status


@dataclass(frozen=True)
class OperationResult:
    """What ``%llamaforge OP`` returns: the operation's JSON data, shown as HTML in a notebook."""

    operation: str
    data: dict[str, Any]
    params: dict[str, Any]
    seconds: float

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def exit_code(self) -> int:
        """The exit code the CLI would return for this result (0 unless e.g. a smoke verdict failed)."""
        return int(self.data.get("exit_code", 0))

    def to_json(self) -> str:
        """The data as the CLI's ``--json`` prints it."""
        return json.dumps(self.data, indent=2, sort_keys=True, default=str)

    def _repr_html_(self) -> str:
        return render_html(self.operation, self.data, seconds=self.seconds)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(render_text(self.operation, self.data))

    def __repr__(self) -> str:
        return f"OperationResult({self.operation!r}, keys={sorted(self.data)})"


def _outcome(status: JobStatus) -> OperationResult:
    if status.state == "succeeded" and status.result is not None:
        return OperationResult(status.operation, status.result, status.params, status.seconds)
    error = status.error
    if status.state == "cancelled":
        raise NotebookError(
            f"{status.operation} was cancelled",
            exit_code=ExitCode.CANCELLED,
            hint="its containers were removed and nothing was published; run it again to start over",
        )
    if error is None:
        raise NotebookError(f"{status.operation} ended as {status.state} without a result")
    hint = error.hint
    if error.message.startswith("internal error"):
        hint = "this is a bug in llamaforge: the traceback was logged to stderr"
    failed = status.result  # a failing verdict keeps the whole result
    raise NotebookError(
        error.message,
        hint=hint,
        exit_code=error.exit_code,
        rendered=error.rendered if error.hint == hint else None,
        error_type=error.type,
        result=OperationResult(status.operation, failed, status.params, status.seconds) if failed else None,
    )


@dataclass(frozen=True)
class BackgroundJob:
    """A handle on an operation started with ``--background``: ``status()``, ``wait()``, ``logs()``, ``cancel()``."""

    id: str
    operation: str

    def status(self) -> JobStatus:
        """The job's state, latest progress and, once finished, its result or error."""
        return jobs().status(self.id)

    def wait(self) -> OperationResult:
        """Show the job's progress until it finishes; its result (or its error, raised)."""
        return _outcome(_follow(self.id, progress_view(self.operation)))

    def logs(self, tail: int = 50) -> list[str]:
        """The last ``tail`` lines of the job's event log."""
        return jobs().logs(self.id, offset=-tail, limit=tail).lines

    def cancel(self) -> JobStatus:
        """Cancel the job (its containers are removed) and wait for it to stop."""
        return jobs().cancel(self.id)

    def _repr_html_(self) -> str:
        status = self.status()
        progress = status.progress
        rows = [
            ("job", status.id),
            ("operation", status.operation),
            ("state", badge(status.state)),
            ("seconds", f"{status.seconds:.1f}"),
            ("log lines", status.log_lines),
        ]
        if progress is not None:
            counted = f" [{progress.completed:g}/{progress.total:g}]" if progress.total else ""
            rows.append(("progress", f"{progress.stage}: {progress.message}{counted}"))
        if status.error is not None:
            rows.append(("error", status.error.rendered))
        return section(
            f"background job {status.operation}",
            kv_table(rows) + "<p><code>job.wait()</code> shows its "
            "progress and returns the result; <code>job.logs()</code>, <code>job.cancel()</code></p>",
        )

    def __repr__(self) -> str:
        return f"BackgroundJob({self.id!r}, {self.operation!r}, state={self.status().state!r})"


def run(operation: str, /, *, background: bool = False, **params: Any) -> OperationResult | BackgroundJob:
    """Run ``operation`` (``build``, ``fit``, …) with keyword parameters, showing progress; its result.

    With ``background=True`` (long operations) the job starts and its handle returns at once.
    """
    op = resolve_operation(operation)
    validated = validate_params(op, params)
    job_id = jobs().start(op.name, validated)
    if background:
        return BackgroundJob(job_id, op.name)
    return _outcome(_follow(job_id, progress_view(op.name)))


@dataclass(frozen=True)
class HelpText:
    """``--help`` output, shown as preformatted text."""

    text: str
    title: str = ""

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"

    def __repr__(self) -> str:
        return self.text


def operations_help() -> HelpText:
    """What ``%llamaforge`` alone shows: every operation with its summary."""
    width = max(len(name) for name in operations())
    lines = ["usage: %llamaforge OPERATION [ARGS]   (%llamaforge OPERATION --help for its options)", ""]
    for name, op in sorted(operations().items()):
        tags = "" if op.read_only else " [changes state]"
        lines.append(f"  {name:<{width}}  {op.summary}{tags}")
    lines += [
        "",
        "An operation's last name part is enough when it is unique: `%llamaforge fit MODEL --ctx 8192`.",
    ]
    return HelpText("\n".join(lines), "llamaforge operations")


def llamaforge_magic(line: str) -> OperationResult | BackgroundJob | HelpText:
    """``%llamaforge OPERATION [ARGS]``: run a registered operation with CLI-style arguments."""
    try:
        words = shlex.split(line)
    except ValueError as error:
        raise NotebookError(f"cannot split the arguments: {error}", exit_code=ExitCode.BAD_INPUT) from None
    if not words or words[0] in ("-h", "--help", "help"):
        return operations_help()
    op = resolve_operation(words[0])
    parser = build_parser(op)
    if "-h" in words[1:] or "--help" in words[1:]:
        return HelpText(parser.format_help())
    arguments = vars(parser.parse_args(words[1:]))
    background = bool(arguments.pop("background", False))
    arguments.pop("help", None)
    validated = validate_params(op, arguments)
    job_id = jobs().start(op.name, validated)
    if background:
        return BackgroundJob(job_id, op.name)
    return _outcome(_follow(job_id, progress_view(op.name)))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext llamaforge``: register the ``%llamaforge`` line magic."""
    ipython.register_magic_function(llamaforge_magic, magic_kind="line", magic_name="llamaforge")
