"""The chat-template check of ``models.verify``: a static audit of ``tokenizer.chat_template`` (and its named
variants) in a sandboxed Jinja parse, flagging what template-injection payloads reach for.

Nothing is rendered and nothing is evaluated: the audit walks the parsed tree and reads its constants. Jinja's
own constant folding would compute ``9 ** (9 ** 8)`` or ``"x" * 1500000000`` on the way (minutes of CPU or
gigabytes of memory, in one C call that no signal interrupts); here strings are joined only from string
constants, within a budget, and arithmetic is never done. A template beyond the limits below is a failed
finding, never a long wait.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeGuard

from llamaforge.models.findings import Finding, Status

# The audit's limits. llama.cpp b11312's largest shipped template has 16 KiB and under 900 nodes.
MAX_TEMPLATE_CHARS: Final = 256 << 10
MAX_NODES: Final = 50_000
MAX_JOINED_CHARS: Final = 1 << 20  # characters built by joining string constants, all joins together
MAX_FLAGS: Final = 50
MAX_REPEAT: Final = 10_000  # a larger constant factor in ``*`` is flagged

# Names and attributes a chat template never needs but template-injection payloads reach for.
_DANGEROUS_NAMES: Final = frozenset(
    {
        "os",
        "sys",
        "subprocess",
        "builtins",
        "__builtins__",
        "import",
        "__import__",
        "importlib",
        "eval",
        "exec",
        "compile",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "config",
        "request",
        "self",
        "lipsum",
        "cycler",
        "joiner",
        "url_for",
        "get_flashed_messages",
        "session",
        "g",
        "application",
    }
)
# Python introspection only: never a chat message's field, as an attribute or as an item.
_INTROSPECTION: Final = frozenset(
    {
        "mro",
        "func_globals",
        "func_code",
        "f_globals",
        "f_locals",
        "f_back",
        "f_builtins",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "co_code",
        "tb_frame",
        "tb_next",
        "im_func",
        "im_self",
        "im_class",
        "import_module",
        "load_module",
        "jinja_env",
    }
)
_DANGEROUS_ATTRS: Final = _INTROSPECTION | frozenset(
    {
        "os",
        "popen",
        "system",
        "environ",
        "modules",
        "eval",
        "exec",
        "compile",
        "open",
        "builtins",
        "globals",
        "locals",
        "getattr",
        "setattr",
        "subclasses",
        "spawn",
        "check_output",
        "environment",
    }
)
_DUNDER: Final = re.compile(r"__\w+__")
# "{0.__class__}", "{x[key]}": str.format walking objects
_FORMAT_TRAVERSAL: Final = re.compile(r"\{[^{}]*[.\[]")
# Filters that only reshape a string (never to more than a few times its length): followed when joining.
_STRING_FILTERS: Final[Mapping[str, Callable[[str], str]]] = {
    "lower": str.lower,
    "upper": str.upper,
    "trim": str.strip,
    "title": str.title,
    "capitalize": str.capitalize,
    "string": str,
    "reverse": lambda text: text[::-1],
}


class _TooLarge(Exception):
    """The template is beyond one of the audit's limits (the message says which)."""


def _generation_tag() -> type[Any]:
    """HF's ``{% generation %}…{% endgeneration %}`` (assistant masks), so templates using it parse."""
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.parser import Parser

    class GenerationTag(Extension):
        tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationTag


def _walk(tree: Any) -> list[Any]:
    """Every node of ``tree``, each before its descendants, without recursion (an attribute chain parses into
    a tree as deep as it is long); raises :class:`_TooLarge` past :data:`MAX_NODES`."""
    found: list[Any] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if len(found) > MAX_NODES:
            raise _TooLarge(f"has more than {MAX_NODES} template nodes")
        stack.extend(reversed(list(node.iter_child_nodes())))
    return found


class _Joiner:
    """The string a node stands for when it is built from string constants only (``'__cla' ~ 'ss__'``,
    ``'__CLASS__'|lower``), else None. Each node is visited once, after its children, and every character
    built counts against :data:`MAX_JOINED_CHARS`."""

    def __init__(self) -> None:
        self._values: dict[int, str | None] = {}
        self._budget = MAX_JOINED_CHARS

    def _spend(self, text: str) -> str:
        self._budget -= len(text)
        if self._budget < 0:
            raise _TooLarge(f"joins more than {MAX_JOINED_CHARS} characters of string constants")
        return text

    def visit(self, node: Any) -> list[str]:
        """Record ``node``'s string; return the strings built at ``node``: each run of constant parts it joins,
        or what its filter made of a constant."""
        from jinja2 import nodes

        value: str | None = None
        built: list[str] = []
        if isinstance(node, nodes.Const) and isinstance(node.value, str):
            value = node.value
        elif isinstance(node, (nodes.Concat, nodes.Add)):
            parts = node.nodes if isinstance(node, nodes.Concat) else [node.left, node.right]
            pieces = [self._values.pop(id(part), None) for part in parts]
            runs: list[list[str]] = [[]]
            for piece in pieces:
                if piece is None:
                    runs.append([])
                else:
                    runs[-1].append(piece)
            built = [self._spend("".join(run)) for run in runs if len(run) > 1]
            if None not in pieces:  # one run: the whole join is a constant string
                value = built[0] if built else "".join(runs[0])
        elif isinstance(node, nodes.Filter) and node.node is not None:
            inner = self._values.pop(id(node.node), None)
            reshape = _STRING_FILTERS.get(node.name)
            if inner is not None and reshape is not None and not (node.args or node.kwargs or node.dyn_args):
                value = self._spend(reshape(inner))
                built = [value] if value != inner else []
        self._values[id(node)] = value
        return built


def _big_int(node: Any) -> TypeGuard[Any]:
    """A constant integer too large for any repeat a chat template needs (``'=' * 80`` is fine)."""
    from jinja2 import nodes

    return isinstance(node, nodes.Const) and isinstance(node.value, int) and abs(node.value) > MAX_REPEAT


def _audit_tree(tree: Any) -> list[tuple[int, str]]:
    """``(line, message)`` for everything in ``tree`` a chat template never needs."""
    from jinja2 import nodes

    every = _walk(tree)
    flags: list[tuple[int, str]] = []

    def flag(node: nodes.Node, message: str) -> None:
        flags.append((node.lineno, f"{message} (line {node.lineno})"))

    local_names = {n.name for n in every if isinstance(n, nodes.Name) and n.ctx in ("store", "param")}
    local_names |= {n.name for n in every if isinstance(n, nodes.Macro)}
    for node in every:
        if isinstance(node, nodes.Name):
            if node.ctx == "load" and node.name in _DANGEROUS_NAMES and node.name not in local_names:
                flag(node, f"uses the name {node.name!r}")
        elif isinstance(node, nodes.Getattr):
            if node.attr.startswith("_") or node.attr in _DANGEROUS_ATTRS:
                flag(node, f"reaches for the attribute {node.attr!r}")
            elif node.attr in ("format", "format_map"):
                receiver = node.node.value if isinstance(node.node, nodes.Const) else None
                if not isinstance(receiver, str) or _FORMAT_TRAVERSAL.search(receiver):
                    flag(node, f"calls .{node.attr} on a string that is not a constant or walks attributes")
        elif isinstance(node, nodes.Getitem):
            key = node.arg.value if isinstance(node.arg, nodes.Const) else None
            if isinstance(key, str) and (key.startswith("_") or key in _INTROSPECTION):
                flag(node, f"reaches for the item {key!r}")
        elif isinstance(node, nodes.Const):
            if isinstance(node.value, str) and _DUNDER.search(node.value):
                flag(node, f"holds the dunder string {node.value[:40]!r}")
        elif isinstance(node, nodes.Filter):
            if node.name == "attr":
                flag(node, "uses the |attr filter")
        elif isinstance(node, nodes.Pow):
            flag(node, "raises to a power (**): rendering it can take unbounded time and memory")
        elif isinstance(node, nodes.Mul):
            factors = [side.value for side in (node.left, node.right) if _big_int(side)]
            if factors:
                flag(
                    node,
                    f"multiplies by {str(factors[0])[:24]}: rendering it builds a string or number that large",
                )
        elif isinstance(node, (nodes.Import, nodes.FromImport, nodes.Include, nodes.Extends)):
            flag(node, f"uses {{% {type(node).__name__.lower()} %}}, which reaches outside the template")
    joiner = _Joiner()
    for node in reversed(every):  # descendants first
        for text in joiner.visit(node):
            if _DUNDER.search(text):
                flag(node, f"builds the dunder string {text[:40]!r}")
    return flags


def audit_chat_template(source: str) -> tuple[bool, list[str]]:
    """``(parses, flags)``: parse ``source`` in a sandboxed Jinja environment (never rendering or evaluating
    any of it) and flag every name, attribute, filter, string or tag a chat template never needs
    (``__class__``, ``mro``, ``cycler``, ``os``, ``|attr``, ``{% import %}``, format strings walking
    attributes, …). ``parses`` is False only when Jinja rejects the syntax; a template beyond the audit's
    limits (:data:`MAX_TEMPLATE_CHARS`, :data:`MAX_NODES`, :data:`MAX_JOINED_CHARS`, nesting) parses but is
    flagged as too large to audit."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if len(source) > MAX_TEMPLATE_CHARS:
        return True, [
            f"is {len(source)} characters long: too large to audit (the limit is {MAX_TEMPLATE_CHARS})"
        ]
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as error:
        return False, [f"does not parse with Jinja2: {error.message} (line {error.lineno})"]
    except (ValueError, OverflowError) as error:  # e.g. an integer literal of more than 4300 digits
        return False, [f"does not parse with Jinja2: {str(error).partition(';')[0][:160]}"]
    except RecursionError:
        return True, ["nests expressions too deeply to audit"]
    try:
        flags = _audit_tree(tree)
    except _TooLarge as error:
        return True, [f"{error}: too large to audit"]
    messages = [message for _line, message in sorted(set(flags))]
    if len(messages) > MAX_FLAGS:
        messages = [*messages[:MAX_FLAGS], f"and {len(messages) - MAX_FLAGS} more flags like these"]
    return True, messages


def check_templates(metadata: Mapping[str, Any]) -> list[Finding]:
    """Audit ``tokenizer.chat_template`` and its named variants (``tokenizer.chat_template.tool_use``…)."""
    from llamaforge.gguf.header import LongString

    findings: list[Finding] = []
    for key, value in metadata.items():
        if not key.startswith("tokenizer.chat_template"):
            continue
        if isinstance(value, LongString):
            findings.append(
                Finding("template", "fail", key, f"{value.length}-byte template is too long to audit")
            )
            continue
        if not isinstance(value, str):
            findings.append(Finding("template", "fail", key, "chat template is not a string"))
            continue
        parses, flags = audit_chat_template(value)
        status: Status = "fail" if parses else "warn"
        findings += [Finding("template", status, key, message) for message in flags]
    return findings
