"""The ``invoke`` command lines README.md and docs/*.md show name tasks and flags the command line has: a renamed
task or flag fails here, not in the hands of a reader who copies the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamaforge.fronts.cli import namespace

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `invoke TASK ...` in a code span or a line of a code block, up to the end of the command (&&, ;, a pipe).
_COMMAND = re.compile(r"(?:^|[`\s(])invoke\s+([a-z][\w.-]*)((?:(?!&&|;|`|\s\|\s|$).)*)", re.MULTILINE)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
# Invoke's own options, which every task line may carry.
_CORE = {"help", "list", "complete", "echo", "dry", "debug"}


def _commands() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for match in _COMMAND.finditer(doc.read_text(encoding="utf-8")):
            line = doc.read_text(encoding="utf-8").count("\n", 0, match.start()) + 1
            found.append((f"{doc.name}:{line}", match.group(1), match.group(2)))
    return found


COMMANDS = _commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) > 50, COMMANDS  # the pattern still finds what the docs hold


def _flags(task: str) -> set[str]:
    """The flags ``invoke TASK`` takes (a boolean's ``--no-`` form too) and Invoke's own."""
    flags = set(_CORE)
    for argument in namespace()[task].get_arguments():
        for name in argument.names:
            flags.add(name)
            if argument.kind is bool:
                flags.add(f"no-{name}")
    return flags


@pytest.mark.parametrize(("where", "task", "rest"), COMMANDS, ids=[where for where, _t, _r in COMMANDS])
def test_a_documented_command_names_a_task_and_its_flags(where: str, task: str, rest: str) -> None:
    names = {alias: name for name, aliases in namespace().task_names.items() for alias in (name, *aliases)}
    assert task in names, f"{where}: `invoke {task}` is no task"
    current = names[task]
    for word in rest.split():
        if word in names:  # `invoke images.bootstrap build`: the next task of the line
            current = names[word]
        for flag in _FLAG.findall(word):
            assert flag in _flags(current), f"{where}: `invoke {current}` has no flag --{flag}"
