"""The command-line front: Invoke tasks generated from the operation registry, rendered with rich.

``tasks.py`` (``invoke build --arch 86``) and the ``llamaforge`` console script both use ``namespace()``.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from invoke.collection import Collection
from invoke.exceptions import Exit
from invoke.program import Program
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.text import Text

from llamaforge.core.errors import Cancelled, InvalidOption, LlamaforgeError, OperationFailed, Terminated
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import Operation, OperationContext, result_json
from llamaforge.core.validation import describe_errors
from llamaforge.core.version import __version__
from llamaforge.fronts.cli_index import FlagSpec, OperationSpec, operation_index
from llamaforge.fronts.cli_invoke import (
    OUTPUT_CLOSED,
    OperationTask,
    adapt_invoke,
    discard_output,
    output_closed,
)
from llamaforge.fronts.render_cli import render_result

if TYPE_CHECKING:
    from rich.progress import Progress

_PIPE_WIDTH = 200  # columns of a result printed to a pipe or a file: a table's wraps there, text lines never


class _Console(Console):
    """rich's console, which leaves a closed output to the entry point (quiet, exit code 141) where rich itself
    would exit with 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output has gone")


class ConsoleReporter:
    """Renders events: stages as lines, countable work as a progress bar (on a terminal; elsewhere a line every
    30 s or 10 %, see :class:`_ProgressLines`), bytes in MiB, log lines when verbose (a progress message once,
    not once per event)."""

    def __init__(self, console: Console, verbose: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.verbose = verbose
        self._progress: Progress | None = None
        self._task: Any = None
        self._lines = _ProgressLines(clock)
        self._said = ""  # the last progress message printed when verbose

    def _bar(self) -> Progress:
        if self._progress is None:
            # Imported with the first bar: a run without countable work (a cache hit) never needs it.
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold blue]{task.fields[stage]}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=None, stage="", count="")
        return self._progress

    def _new_message(self, event: Event) -> bool:
        """True the first time a progress message is seen in a row (a download says "downloading" per MiB)."""
        new, self._said = event.message != self._said, event.message
        return new

    def __call__(self, event: Event) -> None:
        if event.kind == "progress" and (event.total or event.unit) and not self.console.is_terminal:
            line = self._lines.line(event)
            if line:
                self.console.print(line, highlight=False, markup=False)
            if self.verbose and self._new_message(event):
                self.console.print(event.message, highlight=False, markup=False)
        elif event.kind == "progress" and (event.total or event.unit):
            bar = self._bar()
            description = event.message if len(event.message) < 70 else event.message[:67] + "..."
            bar.update(
                self._task,
                completed=event.completed,
                total=event.total,
                description=description,
                stage=event.stage,
                count=_count(event),
            )
            if self.verbose and self._new_message(event):
                bar.console.print(Text(event.message, style="dim"), highlight=False)
        elif event.kind == "log":
            if self.verbose:
                self.console.print(f"[dim]{event.message}[/dim]", highlight=False, markup=False)
        elif event.kind == "warning":
            self.console.print(f"[yellow]warning:[/yellow] {event.message}", highlight=False)
        else:
            self.console.print(f"[bold]»[/bold] {event.message}", highlight=False)

    def close(self) -> None:
        """Stop the progress display."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class _ProgressLines:
    """Countable work where no bar can be drawn (a CI log, ``nohup``, a pipe): one line when the count starts,
    then at most one per 30 s or 10 % and one at its end, e.g. ``build [251/474] 53% 5m12s, ~4m left``; bytes
    as ``fetch 120/400 MiB (30 %) 33 MiB/s, ~8s left`` (without a total, every 30 s: ``fetch 120 MiB 33 MiB/s``)."""

    seconds = 30.0
    step = 0.10

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._count: tuple[str, float | None] | None = None  # the stage and total being counted
        self._start = self._shown_at = 0.0
        self._shown_fraction = self._shown_completed = self._first = 0.0

    def line(self, event: Event) -> str | None:
        """The line to print for ``event`` (a progress event with a total or a unit), or None for none yet."""
        now, completed = self._clock(), event.completed or 0.0
        fraction = min(completed / event.total, 1.0) if event.total else 0.0
        if (
            self._count != (event.stage, event.total)
            or fraction < self._shown_fraction
            or completed < self._shown_completed
        ):
            self._count, self._start, self._first = (event.stage, event.total), now, completed  # a new count
        else:
            due = now - self._shown_at >= self.seconds
            if event.total:
                due = (
                    due
                    or fraction >= self._shown_fraction + self.step
                    or fraction >= 1.0 > self._shown_fraction
                )
            if not due:
                return None
        self._shown_at, self._shown_fraction, self._shown_completed = now, fraction, completed
        elapsed = now - self._start
        left = (
            f", ~{_duration(elapsed * (1 - fraction) / fraction)} left"
            if elapsed and 0 < fraction < 1
            else ""
        )
        if event.unit == "bytes":
            rate = f" {_mib((completed - self._first) / elapsed)} MiB/s" if elapsed else ""
            if not event.total:
                return f"{event.stage} {_mib(completed)} MiB{rate}".strip()
            shown = f"{_mib(completed, event.total)}/{_mib(event.total)} MiB ({fraction * 100:.0f} %)"
            return f"{event.stage} {shown}{rate}{left}".strip()
        if not event.total:
            return None
        count = f"[{completed:g}/{event.total:g}]"
        return f"{event.stage} {count} {fraction:.0%} {_duration(elapsed)}{left}".strip()


def _mib(count: float, scale: float | None = None) -> str:
    """Bytes as MiB: whole from 10 MiB on (of ``scale`` when given, so ``3.5/400`` reads ``4/400``), else one
    decimal."""
    mib = count / 2**20
    return f"{mib:.0f}" if (scale if scale is not None else count) >= 10 * 2**20 else f"{mib:.1f}"


def _count(event: Event) -> str:
    """The bar's count: ``120.0/400.0 MiB`` for bytes, ``251/474`` for steps."""
    done = event.completed or 0
    if event.unit == "bytes":
        return (
            f"{done / 2**20:.1f}/{event.total / 2**20:.1f} MiB" if event.total else f"{done / 2**20:.1f} MiB"
        )
    return f"{done:g}/{event.total:g}" if event.total else f"{done:g}"


def _duration(seconds: float) -> str:
    """``5m12s``, ``4m``, ``12s``: minutes and seconds, whole."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{rest}s"
    return f"{minutes}m{rest:02d}s" if rest else f"{minutes}m"


def _required_hint(op: Operation, error: ValidationError) -> str | None:
    """What each flag that was required but not given is for (its description), when one was missing."""
    fields = op.params.model_fields
    missing = [
        str(item["loc"][0]) for item in error.errors() if item["type"] == "missing" and len(item["loc"]) == 1
    ]
    described = [
        f"--{name.replace('_', '-')}"
        + (f" ({description.rstrip('.')})" if (description := fields[name].description) else "")
        for name in missing
        if name in fields
    ]
    return f"give {', '.join(described)}; `{op.name} --help` lists the flags" if described else None


def run_operation(op: Operation, arguments: dict[str, Any], *, as_json: bool, verbose: bool) -> int:
    """Validate ``arguments``, run ``op``, print its result (also when its verdict failed, then the error);
    return the exit code: 0, the error's, 130 after Ctrl-C, 143 after SIGTERM, 141 when stdout's reader went
    away. With ``as_json`` an error is also written on stdout as ``{"error": {"message", "hint",
    "exit_code"}}``; a failing verdict's result is printed as it is (its own model's shape, the verdict in it),
    with the error on stderr."""
    err = _Console(stderr=True, soft_wrap=True)
    try:
        params = op.params.model_validate({k: v for k, v in arguments.items() if v is not None})
    except (ValidationError, LlamaforgeError) as error:  # a validator that reads a file (--topology) says why
        refusal = (
            InvalidOption(describe_errors(error, as_flags=True), hint=_required_hint(op, error))
            if isinstance(error, ValidationError)
            else error
        )
        return _refuse(err, refusal, as_json=as_json)
    reporter = ConsoleReporter(err, verbose)
    cancel = CancelToken()
    failure: OperationFailed | None = None
    try:
        with _cancel_on_sigterm(cancel):
            result: BaseModel = op.run(params, OperationContext(reporter=reporter, cancel=cancel))
    except OperationFailed as error:  # a failing verdict: the result is still printed, then the error
        failure, result = error, error.result
    except Cancelled as error:
        reporter.close()
        return _refuse(err, error, as_json=as_json, label="[yellow]cancelled:[/yellow]")
    except LlamaforgeError as error:
        reporter.close()
        return _refuse(err, error, as_json=as_json)
    except KeyboardInterrupt:
        cancel.cancel()
        reporter.close()
        interrupted = Cancelled("cancelled; running work stopped and cleaned up; nothing was published")
        return _refuse(err, interrupted, as_json=as_json, label="[yellow]interrupted:[/yellow]")
    finally:
        reporter.close()
    shown = _show(op, result, as_json=as_json)
    if failure is not None:
        _say(err, "[red]failed:[/red]", failure)
        return failure.exit_code
    return 0 if shown else OUTPUT_CLOSED


def _show(op: Operation, result: BaseModel, *, as_json: bool) -> bool:
    """Print the result on stdout (its JSON, or its renderer's view of the typed result); False when stdout's
    reader went away before it was all read (``| head -1``): the rest is dropped quietly."""
    try:
        if as_json:
            sys.stdout.write(json.dumps(result_json(result), indent=2, sort_keys=True, default=str) + "\n")
            sys.stdout.flush()
        else:
            render_result(op, result, result_console())
    except BrokenPipeError:
        if not output_closed():
            raise
        discard_output()
        return False
    return True


def result_console() -> Console:
    """rich's console for results on stdout: on a terminal its own width; in a pipe, a file or a CI log (where
    rich assumes 80 columns and would cut tables and lines) ``COLUMNS`` when set, else wide enough for a table's
    columns, and text lines as long as they are."""
    console = _Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return _Console(width=_PIPE_WIDTH, soft_wrap=True)


def _error_json(error: LlamaforgeError) -> dict[str, Any]:
    return {"error": {"message": error.message, "hint": error.hint, "exit_code": error.exit_code}}


def _say(err: Console, label: str, error: LlamaforgeError) -> None:
    err.print(f"{label} ", end="")
    err.print(error.render(), highlight=False, markup=False)


def _refuse(err: Console, error: LlamaforgeError, *, as_json: bool, label: str = "[red]error:[/red]") -> int:
    """Report ``error`` on stderr (and as JSON on stdout with ``as_json``); its exit code."""
    _say(err, label, error)
    if as_json:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.write(json.dumps(_error_json(error), indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()
    return error.exit_code


@contextlib.contextmanager
def _cancel_on_sigterm(cancel: CancelToken) -> Iterator[None]:
    """While an operation runs, SIGTERM cancels it as Ctrl-C does: its containers and processes are stopped and
    removed, and it ends as ``Terminated`` (exit code 143), never as the failure the killed work would show."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can take signals; there the caller cancels
        return
    terminated = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        terminated.set()
        # The cleanups call the Docker engine: run them beside the interrupted call, not inside it.
        threading.Thread(target=cancel.cancel, name="llamaforge-sigterm", daemon=True).start()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except OperationFailed as error:
        if terminated.is_set():  # its result says where the work stopped (a rollout's hosts): keep it
            error.exit_code = Terminated.exit_code
        raise
    except Exception as error:
        if terminated.is_set():
            raise Terminated(
                "terminated (SIGTERM): running work stopped and cleaned up; nothing was published"
            ) from error
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _task_for(spec: OperationSpec) -> Any:
    parameters = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    help_text: dict[str, str] = {}
    iterable = [flag.name for flag in spec.flags if flag.iterable]
    for flag in spec.flags:
        default = inspect.Parameter.empty if flag.name in spec.positional else flag.default
        parameters.append(inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, default=default))
        help_text[flag.name] = flag_help(flag)
    parameters.append(inspect.Parameter("json", inspect.Parameter.KEYWORD_ONLY, default=False))
    parameters.append(inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=False))
    help_text["json"] = (
        'Print the result as JSON on stdout (events go to stderr); errors too, as {"error": …}'
    )
    help_text["verbose"] = "Stream every log line (e.g. the compiler output)"

    def body(c: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.pop("json", False))
        verbose = bool(kwargs.pop("verbose", False))
        arguments = dict(kwargs)
        for name in iterable:
            arguments[name] = arguments.get(name) or []
        code = run_operation(spec.load(), arguments, as_json=as_json, verbose=verbose)
        if code:
            raise Exit(code=code)

    body.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    body.__doc__ = spec.summary
    body.__name__ = spec.name.rsplit(".", 1)[-1].replace("-", "_")
    return OperationTask(
        body,
        name=spec.name.rsplit(".", 1)[-1],
        help=help_text,
        iterable=iterable,
        auto_shortflags=False,
        positional=list(spec.positional),
    )


def flag_help(flag: FlagSpec) -> str:
    """A flag's help line with its default (none is shown for a flag that is off, has no value or is
    required)."""
    if flag.default is None or flag.default is False or flag.default == "":
        return flag.help
    shown = "on" if flag.default is True else flag.default
    return f"{flag.help} (default: {shown})"


def namespace() -> Any:
    """An Invoke Collection with one task per registered operation (``builds.list`` -> collection ``builds``).
    It is made from the operation index: a run imports only the operation it runs."""
    root = Collection()
    groups: dict[str, Any] = {}
    index = operation_index()
    for name, spec in index.items():
        group, _, _leaf = name.rpartition(".")
        task = _task_for(spec)
        # An operation named like a group (``smoke`` next to ``smoke.compare``) is that group's default task.
        is_default = not group and any(other.startswith(name + ".") for other in index)
        group = name if is_default else group
        if group:
            if group not in groups:
                groups[group] = Collection(group)
                root.add_collection(groups[group])
            groups[group].add_task(task, default=is_default)
        else:
            root.add_task(task)
    return root


def main() -> None:
    """Entry point of the ``llamaforge`` console script (same tasks as ``invoke``)."""
    adapt_invoke()
    Program(namespace=namespace(), version=__version__, name="llamaforge", binary="llamaforge").run()
