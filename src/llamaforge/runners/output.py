"""A command's output on its way out of a runner: secrets kept off the command line and masked in every line,
and the lines pumped from the command's streams to the caller's callback, the log file and the kept tail."""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from llamaforge.core.errors import InvalidOption

LineCallback = Callable[[str], None]
TAIL_LINES = 20
# Variables named like HF_TOKEN, AWS_SECRET_ACCESS_KEY, REGISTRY_PASSWORD (not TOKENIZERS_PARALLELISM).
SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIALS?)(_|$)", re.IGNORECASE)
MASK = "****"


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of ``env``'s secret-looking variables (tokens, passwords), long enough to mask safely."""
    return [value for name, value in env.items() if SECRET_NAME.search(name) and len(value) >= 6]


def checked_command(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    """``argv`` as strings; InvalidOption when it is empty or carries one of ``secrets``."""
    command = [str(part) for part in argv]
    if not command:
        raise InvalidOption("empty command", hint="pass the program and its arguments as a list")
    if any(secret in part for secret in secrets for part in command):
        raise InvalidOption(
            f"the command line of {command[0]} contains a secret",
            hint="pass tokens and passwords through the environment, never on the command line",
        )
    return command


def masker(secrets: Sequence[str]) -> Callable[[str], str]:
    """A function that replaces each of ``secrets`` in a line with ``****``."""

    def mask(line: str) -> str:
        for secret in secrets:
            line = line.replace(secret, MASK)
        return line

    return mask


@dataclass
class OutputLines:
    """Lines read from one process, shared by its reader threads and its consumers."""

    mask: Callable[[str], str]
    on_line: LineCallback | None
    log: IO[str] | None
    keep_all: bool = True
    lines: list[str] = field(default_factory=list)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES * 4))
    closed: int = 0
    streams: int = 1
    changed: threading.Condition = field(default_factory=threading.Condition)

    def pump(self, stream: IO[str], sink: list[str], to_log: bool = True) -> None:
        """Read ``stream`` to its end (a reader thread's body)."""
        try:
            for raw in stream:
                line = self.mask(raw.rstrip("\n"))
                with self.changed:
                    sink.append(line)
                    if self.keep_all and sink is not self.lines:
                        self.lines.append(line)
                    self.recent.append(line)
                    if self.log is not None and to_log:
                        self.log.write(line + "\n")
                        self.log.flush()
                    if self.on_line is not None:
                        self.on_line(line)
                    self.changed.notify_all()
        finally:
            stream.close()
            with self.changed:
                self.closed += 1
                self.changed.notify_all()

    @property
    def done(self) -> bool:
        """True once every stream reached its end."""
        return self.closed >= self.streams
