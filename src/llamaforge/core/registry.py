"""The registry of operations: written once here, read by every front (Invoke, the MCP server, Jupyter).

An operation takes a typed parameter model, reports progress through ``OperationContext.reporter``, honours
``OperationContext.cancel`` and returns a typed :class:`Result` (its model is the function's return annotation).
A failing verdict raises ``OperationFailed`` with that result. Fronts only parse arguments and present results:
the CLI's ``--json``, a job's result, the MCP tool's ``outputSchema`` and ``structuredContent`` and the notebook
views all read ``result_json(result)``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Reporter, null_reporter
from llamaforge.core.paths import lexists
from llamaforge.core.validation import suggest


@dataclass
class OperationContext:
    """What a front hands to an operation: where progress goes and how to cancel."""

    reporter: Reporter = null_reporter
    cancel: CancelToken = field(default_factory=CancelToken)


# Every front imports every operation's models, and a run uses one or two: each model builds its validator
# when first used, not when its module is imported (a cache hit would otherwise build some sixty of them).
# No parameter means "forever" or "not a number": inf and nan are refused like any wrong value.
_MODEL_CONFIG = ConfigDict(extra="forbid", defer_build=True, allow_inf_nan=False)


class Params(BaseModel):
    """Base of operation parameter models."""

    model_config = _MODEL_CONFIG

    @field_validator("*")
    @classmethod
    def _a_path_a_file_system_holds(cls, value: Any, info: ValidationInfo) -> Any:
        if not (info.field_name and is_path_field(cls.model_fields[info.field_name])):
            return value
        # '' is no path: read as "not given", --recipe '' locked every recipe and --load-check '' skipped the load
        if value == "":
            raise ValueError(
                "an empty path names nothing: give a file, a directory or a name, or leave it out"
            )
        for path in value if isinstance(value, (list, tuple)) else (value,):
            # PathTooLong: the readers behind the parameter would stop on an OSError; a URL (hf://, a signed
            # https:// link with a long query) is fetched, not looked up on this file system
            if isinstance(path, Path) or (isinstance(path, str) and "://" not in path):
                lexists(path)
        return value


#: A count llama.cpp reads with ``std::stoi`` (``-c``, ``-t``, ``-np``, ``-ngl``), or Kubernetes as an int32
#: (replicas): larger values would pass here and fail, or wrap, there.
Int32 = Annotated[int, Field(le=2**31 - 1)]

#: llama-server's slots (``--parallel``): the pinned llama.cpp holds at most LLAMA_MAX_SEQ = 256 sequences
#: (src/llama-cparams.h) and refuses a context with more ("n_seq_max must be <= 256"), so a plan for more is
#: one no server can run.
Slots = Annotated[int, Field(ge=1, le=256)]

#: The longest wait any option may ask for (a week, in seconds): a larger one overflows the clocks that
#: threads and sockets wait on (``OverflowError: timestamp out of range``).
MAX_WAIT_S = 7 * 24 * 3600

PATH_MARKER = "x-llamaforge-path"


def path_field(default: Any = PydanticUndefined, *, description: str, **options: Any) -> Any:
    """A parameter field that holds a file-system path, or a name-or-path looked up in the shipped data.

    Fronts that guard the file system (the MCP path policy) check every field declared this way; the marker
    is also in the JSON schema, so a client sees which inputs are paths.
    """
    return Field(default, description=description, json_schema_extra={PATH_MARKER: True}, **options)


def is_path_field(info: FieldInfo) -> bool:
    """Whether the field was declared with :func:`path_field`."""
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get(PATH_MARKER) is True


class Result(BaseModel):
    """Base of operation result models and of their parts: the one JSON shape every front reads."""

    model_config = _MODEL_CONFIG


def empty_list() -> list[Any]:
    """A new empty list: the ``default_factory`` of list fields that a cache hit builds. pydantic reads the
    signature of every factory, and ``list``'s is text that costs a process the tokenizer's regex."""
    return []


def _is_none(value: object) -> bool:
    return value is None


def absent(description: str | None = None) -> Any:
    """A result field the JSON has only sometimes: ``None`` leaves the key out (e.g. ``plot`` without --plot)."""
    return Field(None, exclude_if=_is_none, description=description)


def result_json(result: BaseModel) -> dict[str, Any]:
    """An operation's result as JSON data: what ``--json`` prints, a job keeps and an MCP tool returns."""
    return result.model_dump(mode="json", by_alias=True)


# How a result looks to a person: printed on a rich Console for the CLI, as HTML in a notebook. Each operation
# names its own (they sit beside it) as "module:function", imported only when a result is shown: a front that
# prints JSON never imports rich's tables or the chart code. A renderer takes the operation's typed Result model
# (its parameter is annotated with it, so mypy checks every field it reads); the fronts fall back to a generic
# view of the JSON.
CliRenderer = Callable[[Any, Any], None]
HtmlRenderer = Callable[[Any], str]


def _renderer(where: str | None) -> Any:
    if where is None:
        return None
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


_R = TypeVar("_R", bound=Result)
OperationFunction = Callable[[Any, OperationContext], _R]


@dataclass(frozen=True)
class Operation:
    """One capability, as every front sees it."""

    name: str
    summary: str
    params: type[Params]
    result: type[Result]
    run: Callable[[Any, OperationContext], Result]
    read_only: bool
    destructive: bool = False
    long_running: bool = False
    positional: tuple[str, ...] = ()
    cli: str | None = None
    html: str | None = None
    # A boolean parameter that makes a call destructive (``upgrade``'s ``apply``): the rest of its calls are not.
    destructive_when: str | None = None

    def destroys(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call with ``arguments`` is destructive."""
        return self.destructive or bool(self.destructive_when and arguments.get(self.destructive_when))

    @property
    def render_cli(self) -> CliRenderer | None:
        """The rich renderer of this operation's result, or None for the generic view."""
        renderer: CliRenderer | None = _renderer(self.cli)
        return renderer

    @property
    def render_html(self) -> HtmlRenderer | None:
        """The HTML renderer of this operation's result, or None for the generic view."""
        renderer: HtmlRenderer | None = _renderer(self.html)
        return renderer


REGISTRY: dict[str, Operation] = {}
_discovered = False


def operations() -> dict[str, Operation]:
    """Every registered operation by name. The first call imports each domain's operation modules: any module
    named ``ops`` or ``ops_*`` in a subpackage of llamaforge, nested ones included, registers its operations
    when imported."""
    global _discovered  # noqa: PLW0603 - discovery runs once per process
    if not _discovered:
        _discovered = True
        for module in _operation_modules():
            importlib.import_module(module)
    return REGISTRY


def find_operation(
    name: str, registry: Mapping[str, Operation] | None = None, *, short_names: bool = False
) -> Operation:
    """The operation called ``name`` in ``registry`` (default: every registered one); with ``short_names``, also
    the only one whose last part is ``name`` (``fit`` -> ``models.fit``). InvalidOption otherwise, with
    "did you mean …?" and the known names, or the candidates of an ambiguous short name."""
    registry = registry if registry is not None else operations()
    if name in registry:
        return registry[name]
    leaves = (
        [op for full, op in sorted(registry.items()) if full.rsplit(".", 1)[-1] == name]
        if short_names
        else []
    )
    if len(leaves) == 1:
        return leaves[0]
    if leaves:
        raise InvalidOption(
            f"{name!r} is ambiguous", hint="say which: " + ", ".join(op.name for op in leaves)
        )
    raise InvalidOption(
        f"unknown operation {name!r}",
        hint=suggest(name, registry, end=" ") + "known: " + ", ".join(sorted(registry)),
    )


def _operation_modules() -> list[str]:
    """Every module named ``ops`` or ``ops_*`` in a subpackage of llamaforge, at any depth
    (``llamaforge.deploy.topology.ops``), in a stable order."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for init in sorted(root.rglob("__init__.py")):
        package = init.parent
        if package == root or not _is_package_path(root, package):
            continue
        dotted = ".".join(("llamaforge", *package.relative_to(root).parts))
        for module in pkgutil.iter_modules([str(package)]):
            if not module.ispkg and (module.name == "ops" or module.name.startswith("ops_")):
                found.append(f"{dotted}.{module.name}")
    return sorted(found)


def _is_package_path(root: Path, package: Path) -> bool:
    """Whether every folder from ``root`` down to ``package`` is a package (a folder of data that happens to
    hold an ``__init__.py`` below a plain folder is not importable)."""
    folder = package
    while folder != root:
        if not (folder / "__init__.py").is_file():
            return False
        folder = folder.parent
    return True


def operation(
    name: str,
    params: type[Params],
    *,
    read_only: bool,
    destructive: bool = False,
    destructive_when: str | None = None,
    long_running: bool = False,
    positional: tuple[str, ...] = (),
    cli: str | None = None,
    html: str | None = None,
) -> Callable[[OperationFunction[_R]], OperationFunction[_R]]:
    """Register the decorated function as operation ``name``: its docstring's first paragraph (on one line) is
    the summary, its return annotation (a :class:`Result` model) the result every front publishes;
    ``destructive_when`` names a boolean parameter that makes a call destructive; ``cli`` and ``html`` name
    (``"module:function"``) the functions that show that result (the typed model) to a person (default: a
    generic view of its JSON)."""

    def register(function: OperationFunction[_R]) -> OperationFunction[_R]:
        summary = " ".join(inspect.cleandoc(function.__doc__ or name).split("\n\n")[0].split())
        result = typing.get_type_hints(function).get("return")
        if not (isinstance(result, type) and issubclass(result, Result)):
            raise TypeError(f"operation {name}: the return annotation must be a Result model, not {result!r}")
        REGISTRY[name] = Operation(
            name,
            summary,
            params,
            result,
            function,
            read_only,
            destructive,
            long_running,
            positional,
            cli,
            html,
            destructive_when,
        )
        if destructive_when is not None and destructive_when not in params.model_fields:
            raise TypeError(f"operation {name}: destructive_when names no parameter: {destructive_when!r}")
        return function

    return register
