"""A call's arguments: unknown ones refused with "did you mean", wrong ones worded like the command line's errors.

The SDK validates a call's arguments against the tool function's signature before the tool runs. Left alone, its
model drops arguments it does not know (a misspelt ``ctxx`` runs the call with the default) and its errors are
pydantic's own text (the value, the error type and a link to pydantic's site). Every tool of the server is a
:class:`CheckedTool`: its input schema says ``additionalProperties: false``, and its arguments are checked before
the SDK's validation, each problem worded by :func:`llamaforge.core.validation.describe_errors` (the CLI's
formatter) and each unknown name given the closest known one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import Field, ValidationError, create_model

from llamaforge.core.errors import InvalidOption
from llamaforge.core.validation import booleans_for_numbers, closest, describe_errors
from llamaforge.fronts.mcp.output import Output


def argument_names(metadata: FuncMetadata) -> list[str]:
    """The arguments a tool takes, as a caller spells them."""
    return [info.alias or name for name, info in metadata.arg_model.model_fields.items()]


def _refusal(
    what: str, known: Sequence[str], unknown: Sequence[str], problems: list[str]
) -> InvalidOption | None:
    if not problems:
        return None
    hints = [
        f"did you mean {close[0]!r} instead of {name!r}?"
        for name in unknown
        if (close := closest(name, known))
    ]
    if unknown and not hints:
        hints.append(f"{what} takes: {', '.join(known)}" if known else f"{what} takes no arguments")
    return InvalidOption(f"invalid arguments for {what}: {'; '.join(problems)}", hint=" ".join(hints) or None)


def argument_error(tool: str, metadata: FuncMetadata, arguments: Mapping[str, Any]) -> InvalidOption | None:
    """Why ``arguments`` do not fit ``tool`` (unknown names, missing or wrong values), or None when they fit."""
    known = argument_names(metadata)
    unknown = [name for name in arguments if name not in known]
    problems = [f"{name}: unknown argument" for name in unknown]
    problems += _booleans_as_numbers(metadata, arguments)
    try:
        metadata.validate_arguments({name: value for name, value in arguments.items() if name in known})
    except ValidationError as error:
        problems.append(describe_errors(error))
    return _refusal(tool, known, unknown, problems)


def _booleans_as_numbers(metadata: FuncMetadata, arguments: Mapping[str, Any]) -> list[str]:
    """``true`` / ``false`` given for a number, alone or in a list: pydantic's lax mode reads them as 1 and 0
    (``port: true`` would render port 1, ``concurrency: [true]`` one client), so they are refused here."""
    properties = metadata.arg_model.model_json_schema(by_alias=True).get("properties", {})
    return [
        f"{where}: {json.dumps(value)} is not a number"
        for name, given in arguments.items()
        if name in properties
        for where, value in booleans_for_numbers(name, given, properties[name])
    ]


class CheckedTool(Tool):
    """A tool whose arguments are checked by :func:`argument_error` before the SDK validates them; its input
    schema and argument model refuse properties it does not declare."""

    output: Output = Field(default_factory=Output, exclude=True)

    @classmethod
    def of(cls, fn: Callable[..., Any], output: Output, **kwargs: Any) -> CheckedTool:
        """The tool for ``fn`` (``kwargs`` as for ``Tool.from_function``), its errors masked by ``output``."""
        tool = Tool.from_function(fn, **kwargs)
        loose = tool.fn_metadata.arg_model
        strict = create_model(loose.__name__, __base__=loose, __cls_kwargs__={"extra": "forbid"})
        fields = {name: getattr(tool, name) for name in Tool.model_fields}
        fields["fn_metadata"] = tool.fn_metadata.model_copy(update={"arg_model": strict})
        fields["parameters"] = strict.model_json_schema(by_alias=True)
        return cls(**fields, output=output)

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        """Refuse arguments that do not fit, in the CLI's words; then run as the SDK does."""
        refused = argument_error(self.name, self.fn_metadata, arguments)
        if refused is not None:
            raise self.output.error(refused.render())
        return await super().run(arguments, context, convert_result=convert_result)


class CheckedPrompt(Prompt):
    """A prompt whose arguments are checked like a tool's: an unknown or missing one is an invalid-params error
    worded like the CLI's (the SDK answers "Internal server error")."""

    output: Output = Field(default_factory=Output, exclude=True)

    @classmethod
    def of(cls, fn: Callable[..., Any], output: Output, **kwargs: Any) -> CheckedPrompt:
        """The prompt for ``fn`` (``kwargs`` as for ``Prompt.from_function``), its errors masked by ``output``."""
        prompt = Prompt.from_function(fn, **kwargs)
        return cls(**{name: getattr(prompt, name) for name in Prompt.model_fields}, output=output)

    async def render(self, arguments: dict[str, Any] | None, context: Context[Any, Any]) -> Any:
        """Refuse arguments that do not fit, in the CLI's words; then render as the SDK does."""
        given = arguments or {}
        declared = self.arguments or []
        known = [argument.name for argument in declared]
        unknown = [name for name in given if name not in known]
        problems = [f"{name}: unknown argument" for name in unknown]
        problems += [
            f"{item.name}: Field required" for item in declared if item.required and item.name not in given
        ]
        refused = _refusal(f"prompt {self.name}", known, unknown, problems)
        if refused is not None:
            raise MCPError(code=INVALID_PARAMS, message=self.output.text(refused.render()))
        return await super().render(arguments, context)
