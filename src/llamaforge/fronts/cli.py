"""The command-line front: Invoke tasks generated from the operation registry, rendered with rich.

``tasks.py`` (``invoke build --arch 86``) and the ``llamaforge`` console script both use ``namespace()``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.console import Console

from llamaforge import __version__
from llamaforge.core.errors import Cancelled, InvalidOption, LlamaforgeError, OperationFailed, Terminated
from llamaforge.core.events import CancelToken, Event
from llamaforge.core.registry import Operation, OperationContext, result_json
from llamaforge.core.validation import describe_errors
from llamaforge.fronts.cli_index import OperationSpec, operation_index
from llamaforge.fronts.render_cli import render_result

if TYPE_CHECKING:
    from rich.progress import Progress


class ConsoleReporter:
    """Renders events: stages as lines, countable work as a progress bar, log lines when verbose."""

    def __init__(self, console: Console, verbose: bool) -> None:
        self.console = console
        self.verbose = verbose
        self._progress: Progress | None = None
        self._task: Any = None

    def _bar(self) -> Progress:
        if self._progress is None:
            # Imported with the first bar: a run without countable work (a cache hit) never needs it.
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold blue]{task.fields[stage]}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.description}"), console=self.console, transient=True,
            )  # fmt: skip
            self._progress.start()
            self._task = self._progress.add_task("", total=None, stage="")
        return self._progress

    def __call__(self, event: Event) -> None:
        if event.kind == "progress" and event.total:
            bar = self._bar()
            description = event.message if len(event.message) < 70 else event.message[:67] + "..."
            bar.update(self._task, completed=event.completed, total=event.total, description=description,
                       stage=event.stage)  # fmt: skip
            if self.verbose:
                bar.console.print(f"[dim]{event.message}[/dim]", highlight=False)
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


def run_operation(op: Operation, arguments: dict[str, Any], *, as_json: bool, verbose: bool) -> int:
    """Validate ``arguments``, run ``op``, print its result (also when its verdict failed, then the error);
    return the exit code: 0, the error's, 130 after Ctrl-C, 143 after SIGTERM."""
    err = Console(stderr=True, soft_wrap=True)
    try:
        params = op.params.model_validate({k: v for k, v in arguments.items() if v is not None})
    except ValidationError as error:
        err.print(f"[red]error:[/red] {describe_errors(error, as_flags=True)}", highlight=False)
        return InvalidOption.exit_code
    reporter = ConsoleReporter(err, verbose)
    cancel = CancelToken()
    failure: OperationFailed | None = None
    try:
        with _cancel_on_sigterm(cancel):
            result = result_json(op.run(params, OperationContext(reporter=reporter, cancel=cancel)))
    except OperationFailed as error:  # a failing verdict: the result is still printed, then the error
        failure, result = error, result_json(error.result)
    except Cancelled as error:
        reporter.close()
        err.print(f"[yellow]cancelled[/yellow]: {error.message}", highlight=False)
        return error.exit_code
    except LlamaforgeError as error:
        reporter.close()
        err.print("[red]error:[/red] ", end="")
        err.print(error.render(), highlight=False, markup=False)
        return error.exit_code
    except KeyboardInterrupt:
        cancel.cancel()
        reporter.close()
        err.print(
            "[yellow]interrupted[/yellow]: cancelled; running work stopped and cleaned up; nothing was published"
        )
        return 130
    finally:
        reporter.close()
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    else:
        render_result(op, result, Console())
    if failure is not None:
        err.print("[red]failed:[/red] ", end="")
        err.print(failure.render(), highlight=False, markup=False)
        return failure.exit_code
    return 0


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
    from invoke.exceptions import Exit
    from invoke.tasks import Task

    parameters = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    help_text: dict[str, str] = {}
    iterable = [flag.name for flag in spec.flags if flag.iterable]
    for flag in spec.flags:
        default = inspect.Parameter.empty if flag.name in spec.positional else flag.default
        parameters.append(inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, default=default))
        help_text[flag.name] = flag.help
    parameters.append(inspect.Parameter("json", inspect.Parameter.KEYWORD_ONLY, default=False))
    parameters.append(inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=False))
    help_text["json"] = "Print the result as JSON on stdout (events go to stderr)"
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
    return Task(body, name=spec.name.rsplit(".", 1)[-1], help=help_text, iterable=iterable, auto_shortflags=False,
                positional=list(spec.positional))  # fmt: skip


def namespace() -> Any:
    """An Invoke Collection with one task per registered operation (``builds.list`` -> collection ``builds``).
    It is made from the operation index: a run imports only the operation it runs."""
    from invoke.collection import Collection

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
    from invoke.program import Program

    Program(namespace=namespace(), version=__version__, name="llamaforge", binary="llamaforge").run()
