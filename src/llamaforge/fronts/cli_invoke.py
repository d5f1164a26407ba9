"""Invoke, adapted where llamaforge's command line needs more than it gives; the same for ``invoke`` (which loads
``tasks.py``) and the ``llamaforge`` console script.

* ``TASK --help`` prints the task's help for every task: Invoke reads ``--help`` as the value of a positional
  argument still missing (``models.fit --help`` looked for a model named ``--help``, ``smoke.compare --help``
  missed its second run).
* An unknown task or flag gets "did you mean …?"; a flag given without its value is named as ``--flag``.
* A number flag given something else (``--port abc``) reaches the operation's parameter model as given, which
  refuses it naming the flag (exit code 2), where Invoke's own cast ended in a traceback.
* When the reader of the output goes away (``| head -1``), the program ends quietly with exit code 141
  (128 + SIGPIPE, as a program killed by that signal) instead of a ``BrokenPipeError`` traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import sys
from types import TracebackType
from typing import Any

from invoke.exceptions import ParseError
from invoke.parser.argument import Argument
from invoke.parser.parser import ParseMachine
from invoke.tasks import Task

from llamaforge.core.errors import ExitCode
from llamaforge.core.validation import suggest

OUTPUT_CLOSED = ExitCode.OUTPUT_CLOSED  # exit code when the reader of stdout went away: 128 + SIGPIPE
PARSE_ERROR_EXIT = 1  # Invoke's exit code for a command line it cannot parse
_HELP_FLAGS = ("--help", "-h")
_NO_IDEA = "No idea what "  # how Invoke's parser begins the error for a token it cannot place


class OperationTask(Task[Any]):
    """An Invoke task whose number flags keep a value that is no number as given (see :class:`_Flag`)."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        return [
            _Flag(
                names=arg.names,
                kind=arg.kind,
                default=arg.default,
                help=arg.help,
                positional=arg.positional,
                optional=arg.optional,
                incrementable=arg.incrementable,
                attr_name=arg.attr_name,
            )
            for arg in super().get_arguments(ignore_unknown_help)
        ]


class _Flag(Argument):
    """A flag that keeps a value Invoke cannot cast (``--port abc``) as given: the operation's parameter model
    then refuses it with the flag's name, as it refuses every other bad value."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast)
        except (TypeError, ValueError):
            super().set_value(value, cast=False)


def adapt_invoke() -> None:
    """Adapt Invoke's parser (help first, "did you mean") and end quietly when stdout's reader goes away. Called
    once by each entry point, before Invoke parses the command line; calling it again changes nothing."""
    if getattr(ParseMachine, "_llamaforge_adapted", False):
        return
    handle, error = ParseMachine.handle, ParseMachine.error

    def handle_help_first(machine: Any, token: str) -> None:
        context = machine.context
        in_task = (
            context is not None and context is not machine.initial and machine.current_state == "context"
        )
        if token in _HELP_FLAGS and in_task and not machine.waiting_for_flag_value:
            # Invoke shows a task's help when --help follows it, unless a positional argument is still missing:
            # then --help became that argument. Fill them (no task runs after --help), so --help stays help.
            for argument in context.missing_positional_args:
                argument.set_value(token, cast=False)
        repeated = context.flags.get(token) if in_task and not machine.waiting_for_flag_value else None
        if repeated is not None and repeated.takes_value and repeated.kind is not list and repeated.got_value:
            # Invoke would take the flag's second value for a task name ("no task '0'").
            message = f"--{repeated.name} is given twice: give it once"
            _json_parse_error(message)
            raise ParseError(message, context)
        try:
            handle(machine, token)
        except ParseError as failed:
            if str(failed) != f"No idea what {token!r} is!":
                if str(failed).startswith(_NO_IDEA):
                    _json_parse_error(str(failed))
                raise
            message = _unknown(machine, token)
            _json_parse_error(message)
            raise ParseError(message, failed.context) from None

    def error_naming_flags(machine: Any, message: str) -> None:
        flag = machine.flag
        if flag is not None and message == f"Flag {flag!r} needed value and was not given one!":
            message = f"--{flag.name} needs a value"
        if not message.startswith(_NO_IDEA):  # an unknown token: worded, and written, by handle_help_first
            _json_parse_error(message)
        error(machine, message)

    setattr(ParseMachine, "handle", handle_help_first)  # noqa: B010 - mypy refuses assigning to a method
    setattr(ParseMachine, "error", error_naming_flags)  # noqa: B010
    setattr(ParseMachine, "_llamaforge_adapted", True)  # noqa: B010
    _end_quietly_when_output_closes()


def _json_parse_error(message: str) -> None:
    """With ``--json`` on the command line, a command line Invoke cannot parse is also written on stdout as
    ``{"error": {...}}`` (Invoke prints the message on stderr and exits 1), as every other error is."""
    if "--json" in sys.argv[1:]:
        error = {"exit_code": PARSE_ERROR_EXIT, "hint": None, "message": message}
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.write(json.dumps({"error": error}, indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()


def _unknown(machine: Any, token: str) -> str:
    """The words for a token that is no task, no flag and no value: the closest task or flag when one is
    close."""
    known = [*machine.contexts, *machine.contexts.aliases]
    in_task = machine.context is not None and machine.context is not machine.initial
    if in_task:
        known = [*machine.context.flags, *machine.context.inverse_flags, *known]
    what = "flag" if token.startswith("-") else "task"
    hint = suggest(token, known)
    if hint:
        return f"no {what} {token!r}: {hint}"
    where = f"{machine.context.name} --help lists its flags" if in_task else "--list lists the tasks"
    return f"no {what} {token!r} ({where})"


def _closed_outputs() -> list[int]:
    """The file descriptors of stdout and stderr whose reader has gone away (``| head -1`` read its line and
    ended): polling a pipe whose reader has gone reports an error."""
    fds = []
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fds.append(stream.fileno())  # type: ignore[union-attr]
    if not hasattr(select, "poll"):
        return fds  # no poll (Windows): a broken pipe there is the console's
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLOUT)
    return [fd for fd, events in poller.poll(0) if events & select.POLLERR]


def output_closed() -> bool:
    """Whether the reader of stdout or stderr has gone away."""
    return bool(_closed_outputs())


def discard_output() -> None:
    """Point stdout or stderr, whichever reader has gone, at the null device, so that the buffered rest (and
    Python's flush at exit) writes nowhere instead of failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in _closed_outputs():
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _end_quietly_when_output_closes() -> None:
    """A ``BrokenPipeError`` that reaches the top (Invoke's own ``--list`` and ``--help`` too), or that Python's
    flush at exit would meet, ends the program with :data:`OUTPUT_CLOSED` and no traceback, when it came from
    the closed output; any other one (a socket's) is shown as before."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        if issubclass(kind, BrokenPipeError) and output_closed():
            discard_output()
            os._exit(OUTPUT_CLOSED)
        previous(kind, value, traceback)

    def flush_at_exit() -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            discard_output()
            os._exit(OUTPUT_CLOSED)
        except (OSError, ValueError):
            return

    sys.excepthook = hook
    atexit.register(flush_at_exit)
