"""What the MCP front refuses: paths outside the allowed roots, a project root that would allow the whole home
directory, and destructive calls no person confirmed.

The checks are derived from the operation registry (fields declared with ``path_field``,
``Operation.destructive``), so an operation registered later is covered without touching this module.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit
from pydantic import BaseModel, Field

from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import PolicyRefused
from llamaforge.core.paths import PathTooLong, data_dir, home, lexists
from llamaforge.core.registry import Operation, Params, is_path_field

ConfirmPolicy = Literal["param", "elicit"]

_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | set | frozenset):
        return [item for item in value if isinstance(item, str)]
    return []


def path_fields(params: type[Params]) -> tuple[str, ...]:
    """Names of the fields of ``params`` that hold a file-system path (or a name-or-path): those declared
    with ``path_field``."""
    return tuple(name for name, info in params.model_fields.items() if is_path_field(info))


def check_project_dir(project_dir: Path, *, explicit: bool) -> None:
    """Refuse serving ``/``, the home directory or a parent of it as the project (path parameters may point
    anywhere inside the project, ``~/.ssh`` included) unless the person named it with ``--project-dir``."""
    if explicit:
        return
    resolved = project_dir.resolve()
    user_home = Path.home().resolve()
    if resolved == Path(resolved.anchor) or user_home == resolved or user_home.is_relative_to(resolved):
        raise InvalidOption(
            f"the project directory would be {resolved} (the current directory): path parameters could then "
            f"reach everything under it, {user_home / '.ssh'} included",
            hint='start the server in the llamaforge checkout (the client\'s "cwd"), or name the project with '
            "--project-dir DIR",
        )


def default_roots(project_dir: Path, extra: Iterable[Path] = ()) -> tuple[Path, ...]:
    """The project, the shipped recipes/patches/templates, the cache home, and ``extra``: all resolved."""
    candidates = [
        project_dir,
        data_dir("recipes"),
        data_dir("patches"),
        data_dir("templates"),
        home(),
        *extra,
    ]
    roots: list[Path] = []
    for candidate in candidates:
        resolved = candidate.expanduser().resolve()
        if resolved not in roots:
            roots.append(resolved)
    return tuple(roots)


def _exists(field: str, value: str, path: Path) -> bool:
    """Whether ``path`` exists; a name longer than the file system holds is refused here, naming the parameter
    (the operation would stop on an OSError the caller could not read)."""
    try:
        return lexists(path)
    except PathTooLong:
        raise ToolError(
            f"path parameter {field!r} is refused: at {len(value)} characters it is longer than this file "
            "system allows for a path or for one name in it; give the path of an existing file, or a shipped name"
        ) from None


@dataclass(frozen=True)
class PathPolicy:
    """Path parameters must resolve (symlinks followed) inside one of ``roots``; ``..`` is never accepted."""

    roots: tuple[Path, ...]
    base: Path

    def _inside(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def check_value(self, field: str, value: str) -> None:
        """Raise ``ToolError`` when ``value`` (of path field ``field``) may leave the allowed roots."""
        if "\x00" in value:
            raise ToolError(f"path parameter {field!r} contains a NUL byte")
        scheme = _URL_SCHEME.match(value)
        if scheme:
            if scheme.group(1).lower() != "file":
                return  # a remote location (hf://, ms://, https://): fetched, not read from this machine
            value = unquote(urlsplit(value).path)
        parts = re.split(r"[\\/]+", value)
        if ".." in parts:
            raise ToolError(
                f"path parameter {field!r} = {value!r} is refused: '..' (path traversal) is not allowed; "
                "give a path inside the allowed roots"
            )
        bare = len(parts) == 1 and not value.startswith(("~", "."))
        candidate = self.base / Path(value).expanduser()
        if not _exists(field, value, candidate) and bare:
            return  # a name (recipe, series), looked up in the shipped data directories
        resolved = candidate.resolve()
        if not self._inside(resolved):
            roots = ", ".join(str(root) for root in self.roots)
            raise ToolError(
                f"path parameter {field!r} = {value!r} resolves to {resolved}, outside the allowed roots ({roots}); "
                "hint: start the server with --allow-root DIR to allow another directory"
            )

    def check_file_path(self, what: str, path: str) -> None:
        """The guard's check of a path named inside a file (``what`` names the file and field): the same roots
        as a parameter, refused with :class:`PolicyRefused`."""
        try:
            self.check_value(what, path)
        except ToolError as error:
            raise PolicyRefused(str(error).replace("path parameter ", "", 1)) from None

    def check(self, op: Operation, arguments: dict[str, Any]) -> None:
        """Check every path field of ``op`` present in ``arguments``, and refuse ``..`` in any other text."""
        paths = set(path_fields(op.params))
        for name, value in arguments.items():
            for text in _texts(value):
                if name in paths:
                    self.check_value(name, text)
                elif "\x00" in text or ".." in re.split(r"[\\/]+", text):
                    raise ToolError(
                        f"parameter {name!r} = {text!r} is refused: it contains '..' or a NUL byte"
                    )


# --- confirmation ------------------------------------------------------------------------------------------


class Confirmation(BaseModel):
    """What the client's user is asked before a destructive tool runs."""

    confirm: bool = Field(description="Run it")


class NotAsked(BaseModel):
    """The resolver's answer when nobody could be asked (the client declared no elicitation)."""


class NotNeeded(BaseModel):
    """The resolver's answer for a call that changes nothing a person must agree to (a build in Docker)."""


CONFIRM_PARAM = "confirm"
CONFIRMATION_PARAM = "mcp_confirmation"
_Answer = Confirmation | NotAsked | NotNeeded | Elicit[Confirmation]
NeedsConfirmation = Callable[[dict[str, Any]], str | None]
"""Why a call with these arguments needs a person's agreement (the question's first line), or None."""


def can_elicit(ctx: Context[Any, Any]) -> bool:
    """Whether the connected client declared form elicitation (so a person can be asked)."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def confirmation_resolver(
    tool_name: str,
    fields: Sequence[str],
    policy: ConfirmPolicy,
    precheck: Callable[[dict[str, Any]], None],
    needed: NeedsConfirmation,
) -> Callable[..., Awaitable[_Answer]]:
    """A resolver for ``Resolve(...)``: an accepted elicitation, or ``confirm=true`` under policy ``param``.

    It sees the tool's arguments by name, so the question shows them. When the client cannot be asked it
    answers ``NotAsked`` and the tool refuses with a message that says what to do (never a protocol error).
    ``precheck`` (the path and host policies) runs first, so nobody is asked about a call that would be refused
    anyway; ``needed`` says whether these arguments need a person at all, and why.
    """

    async def ask(**kwargs: Any) -> _Answer:
        ctx: Context[Any, Any] = kwargs.pop("mcp_context")
        confirmed = bool(kwargs.pop(CONFIRM_PARAM, False))
        precheck(kwargs)
        reason = needed(kwargs)
        if reason is None:
            return NotNeeded()
        if confirmed and policy == "param":
            return Confirmation(confirm=True)
        if not can_elicit(ctx):
            return NotAsked()
        arguments = json.dumps(kwargs, sort_keys=True, default=str)
        return Elicit(f"{tool_name} {reason}\nArguments: {arguments}\nRun it?", Confirmation)

    # The tool has a confirm argument only under policy "param".
    names = (*fields, CONFIRM_PARAM) if policy == "param" else tuple(fields)
    parameters = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    parameters.append(inspect.Parameter("mcp_context", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    ask.__signature__ = inspect.Signature(parameters, return_annotation=_Answer)  # type: ignore[attr-defined]
    ask.__annotations__ = {"mcp_context": Context, "return": _Answer}
    ask.__name__ = ask.__qualname__ = f"confirm_{tool_name}"
    return ask


def refusal(tool_name: str, op: Operation, outcome: object, policy: ConfirmPolicy) -> str | None:
    """None when ``outcome`` (the resolved confirmation) allows the call; otherwise why it is refused."""
    action = getattr(outcome, "action", None)
    data = getattr(outcome, "data", None)  # a resolver's plain answer arrives as an accepted one
    if isinstance(data, NotNeeded):
        return None
    if action == "accept" and isinstance(data, Confirmation):
        if data.confirm:
            return None
        return f"{tool_name} was not run: the user answered no."
    if action in ("decline", "cancel"):
        done = "declined" if action == "decline" else "cancelled"
        return f"{tool_name} was not run: the user {done} the confirmation."
    if policy == "elicit":
        return (
            f"{tool_name} was not run: it needs a person's confirmation ({op.summary}), which this server asks "
            "through the client (elicitation), and this client cannot ask. Run it from a client that supports "
            "elicitation, or from the command line; a confirm argument is not taken as the user's agreement "
            "(only a server started with --confirm param accepts it)."
        )
    return (
        f"{tool_name} is destructive ({op.summary}) and was not confirmed. Ask the user; if they agree, call "
        f"{tool_name} again with {CONFIRM_PARAM}=true."
    )
