"""One error hierarchy for every user-facing failure.

Each error carries a message that says what went wrong and a hint that says what to do next.
Only the entry points (tasks.py, the MCP server) turn an error into an exit code or a tool error.
Each failure class has an exit code of its own, and every code is a name of :class:`ExitCode` in this file,
whichever module defines the class (docs/exit-codes.md is the table, tests/test_exit_codes.py holds it to this
file): a subclass is the same failure told more precisely and keeps its parent's code unless it sets one; the
only unrelated classes that share a code are the bad-input family (2: ``InvalidOption``, ``RecipeError``).
An operation that runs to its end with a failing verdict raises :class:`OperationFailed`, which carries the
operation's full result, so every front fails the same way and can still show why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from pydantic import BaseModel

from llamaforge.core.exits import crash_hint, crash_words, describe_exit, exit_signal, loaded_cpu_module


class ExitCode:
    """Every exit code a front ends with: the one place the numbers are written. A failure class anywhere in
    llamaforge sets ``exit_code = ExitCode.<NAME>``; docs/exit-codes.md says what each means."""

    OK: Final = 0
    FAILED: Final = 1  # the generic code: an unparsable command line, an unexpected crash
    BAD_INPUT: Final = 2
    SOURCE: Final = 3
    PATCH: Final = 4
    DOCKER_UNAVAILABLE: Final = 5
    TOOL_FAILED: Final = 6
    CACHE: Final = 7
    NOT_REPRODUCIBLE: Final = 8
    MODEL: Final = 9
    SMOKE: Final = 10
    FETCH: Final = 11
    LOCK: Final = 12
    DOES_NOT_FIT: Final = 13
    SSH: Final = 14
    DEPLOY: Final = 15
    BUILD_MISMATCH: Final = 16
    IMAGE: Final = 17
    CUDA_TOOLKIT_MISSING: Final = 18
    DOCKER_MISSING: Final = 19
    HOST_DISK_FULL: Final = 20
    ROOT_NOT_OWNED: Final = 21
    RELEASE_CANNOT_RUN: Final = 22
    SWARM: Final = 23
    POLICY_REFUSED: Final = 24
    NO_ROOT_ACCESS: Final = 25
    UPGRADE: Final = 26
    CANCELLED: Final = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
    OUTPUT_CLOSED: Final = 141  # 128 + SIGPIPE: stdout's reader went away; no class raises it
    TERMINATED: Final = 143  # 128 + SIGTERM


class LlamaforgeError(Exception):
    """Base of all user-facing failures."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """Message plus the next step, as shown to a person."""
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class RecipeError(LlamaforgeError):
    """A recipe file is missing, unreadable or invalid (names the file and field)."""

    exit_code = ExitCode.BAD_INPUT


class InvalidOption(LlamaforgeError):
    """A command-line or API option has a value that cannot work."""

    exit_code = ExitCode.BAD_INPUT


class SourceError(LlamaforgeError):
    """Fetching or verifying the llama.cpp source failed."""

    exit_code = ExitCode.SOURCE


class ChecksumMismatch(SourceError):
    """Downloaded bytes do not match the pinned sha256."""


class PatchError(LlamaforgeError):
    """A patch in the series does not apply."""

    exit_code = ExitCode.PATCH

    def __init__(
        self,
        message: str,
        *,
        patch: str,
        file: str | None = None,
        hunk: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.patch = patch
        self.file = file
        self.hunk = hunk


class DockerUnavailable(LlamaforgeError):
    """The Docker engine cannot be reached."""

    exit_code = ExitCode.DOCKER_UNAVAILABLE


class ImageError(LlamaforgeError):
    """A base or builder image is missing or cannot be built."""

    exit_code = ExitCode.IMAGE


class ToolFailed(LlamaforgeError):
    """An external command failed; keeps the command, its exit code and the last lines of its output."""

    exit_code = ExitCode.TOOL_FAILED

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str],
        returncode: int,
        tail: Sequence[str],
        log_path: str | None = None,
        hint: str | None = None,
        timed_out: bool = False,
    ) -> None:
        super().__init__(message, hint=hint)
        self.command = list(command)
        self.returncode = returncode
        self.tail = list(tail)
        self.log_path = log_path
        self.timed_out = timed_out  # the runner killed it when its time was up

    def render(self) -> str:
        lines = [
            self.message,
            f"  command: {' '.join(self.command)}",
            f"  exit: {describe_exit(self.returncode)}",
        ]
        if self.tail:
            lines.append("  last lines of output:")
            lines.extend(f"    | {line}" for line in self.tail)
        if self.log_path:
            lines.append(f"  full log: {self.log_path}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        # A traceback (a test's, a bug report's) shows how the command ended and its last lines, not only why.
        return self.render()

    def as_crash(self, program: str, output: Iterable[str], *, when: str = "") -> ToolFailed:
        """This failure told as the crash it was when a signal ended ``program`` ("llama-bench was killed by
        SIGILL (illegal instruction) with libggml-cpu-haswell.so loaded", the CPU module read from its
        ``output``), with the hint that fits the signal; itself when the program exited on its own or the
        runner killed it at its timeout."""
        sig = exit_signal(self.returncode)
        if sig is None or self.timed_out:
            return self
        module = loaded_cpu_module(output)
        return ToolFailed(
            crash_words(program, sig, module, when=when),
            command=self.command,
            returncode=self.returncode,
            tail=self.tail,
            log_path=self.log_path,
            hint=crash_hint(sig, module),
        )


class BuildFailed(ToolFailed):
    """The build script failed inside its executor."""


class Cancelled(LlamaforgeError):
    """The operation was cancelled (Ctrl-C or a cancel request); nothing was published."""

    exit_code = ExitCode.CANCELLED


class Terminated(Cancelled):
    """The operation was cancelled by SIGTERM (e.g. ``kill``, a service manager, CI timeouts)."""

    exit_code = ExitCode.TERMINATED


class CacheError(LlamaforgeError):
    """A cache entry is missing or inconsistent."""

    exit_code = ExitCode.CACHE


class NotReproducible(LlamaforgeError):
    """A rebuild produced artifacts whose sha256 differ from the manifest."""

    exit_code = ExitCode.NOT_REPRODUCIBLE


class ModelError(LlamaforgeError):
    """A model file is truncated, corrupt or cannot be rewritten as asked (names the tensor or key)."""

    exit_code = ExitCode.MODEL


class FetchError(ModelError):
    """Downloading a model failed, or what arrived does not match its pins (nothing was published)."""

    exit_code = ExitCode.FETCH


class ModelChecksumMismatch(FetchError):
    """A downloaded model's sha256 or size differs from its pin; the bytes were moved to quarantine."""


class LockError(LlamaforgeError):
    """``models.lock`` could not resolve an input, or ``--frozen`` found inputs that are not pinned."""

    exit_code = ExitCode.LOCK


class SmokeFailed(LlamaforgeError):
    """A smoke run failed its verdict (a threshold missed, no answer) or could not measure what it needs."""

    exit_code = ExitCode.SMOKE


class UpgradeFailed(LlamaforgeError):
    """An upgrade's candidate is broken (it does not build, or crashes where the current build runs) or
    regressed; the recipe's pin is untouched."""

    exit_code = ExitCode.UPGRADE


class DoesNotFit(LlamaforgeError):
    """The model cannot run on the GPU with these settings, even with everything movable on the CPU."""

    exit_code = ExitCode.DOES_NOT_FIT


class OperationFailed(LlamaforgeError):
    """An operation ran to its end and its verdict is a failure (a smoke threshold missed, a verify check failed,
    an input left unpinned, a pinned placement that does not fit, …).

    ``result`` is the operation's complete result, as it would have been returned: the CLI still prints it,
    a job keeps it, the MCP tool result carries it as structured content. ``exit_code`` is the one of the
    failing domain (e.g. ``SmokeFailed.exit_code``), so the CLI exits as it always did.
    """

    def __init__(self, message: str, *, result: BaseModel, exit_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result
        self.exit_code = exit_code
