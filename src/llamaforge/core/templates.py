"""Render llamaforge's Jinja templates: one ``render()``, StrictUndefined, every shell value quoted (``q`` for
POSIX shells, ``ps`` for PowerShell)."""

from __future__ import annotations

import shlex
from typing import Any

import jinja2

from llamaforge.core.paths import data_dir


def _shell_quote(value: object) -> str:
    return shlex.quote(str(value))


def _powershell_quote(value: object) -> str:
    # A single-quoted PowerShell string is literal; a quote inside it is written twice.
    return "'" + str(value).replace("'", "''") + "'"


def _dockerfile_json(value: object) -> str:
    # Exec-form instructions take a JSON array; json.dumps gives the exact quoting Docker expects.
    import json

    return json.dumps(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - renders shell scripts and Dockerfiles, not HTML
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _shell_quote
    env.filters["json"] = _dockerfile_json
    env.filters["ps"] = _powershell_quote
    return env


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context``; a missing variable is an error, never empty text."""
    return _environment().get_template(template).render(**context)
