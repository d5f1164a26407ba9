"""The chat-template check of ``models.verify``: a static audit of ``tokenizer.chat_template`` (and its named
variants) in a sandboxed Jinja parse, flagging what template-injection payloads reach for; nothing is rendered."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from llamaforge.models.findings import Finding, Status

# Names and attributes a chat template never needs but template-injection payloads reach for.
_DANGEROUS_NAMES: Final = frozenset({
    "os", "sys", "subprocess", "builtins", "__builtins__", "import", "__import__", "importlib", "eval", "exec",
    "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars", "config", "request",
    "self", "lipsum", "cycler", "joiner", "url_for", "get_flashed_messages", "session", "g", "application",
})  # fmt: skip
# Python introspection only: never a chat message's field, as an attribute or as an item.
_INTROSPECTION: Final = frozenset({
    "mro", "func_globals", "func_code", "f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "co_code", "tb_frame", "tb_next", "im_func", "im_self",
    "im_class", "import_module", "load_module", "jinja_env",
})  # fmt: skip
_DANGEROUS_ATTRS: Final = _INTROSPECTION | frozenset({
    "os", "popen", "system", "environ", "modules", "eval", "exec", "compile", "open", "builtins", "globals",
    "locals", "getattr", "setattr", "subclasses", "spawn", "check_output", "environment",
})  # fmt: skip
_DUNDER: Final = re.compile(r"__\w+__")
# "{0.__class__}", "{x[key]}": str.format walking objects
_FORMAT_TRAVERSAL: Final = re.compile(r"\{[^{}]*[.\[]")


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


def audit_chat_template(source: str) -> tuple[bool, list[str]]:
    """``(parses, flags)``: parse ``source`` in a sandboxed Jinja environment (never rendering it) and flag
    every name, attribute, filter, string or tag a chat template never needs (``__class__``, ``mro``,
    ``cycler``, ``os``, ``|attr``, ``{% import %}``, format strings walking attributes, …)."""
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as error:
        return False, [f"does not parse with Jinja2: {error.message} (line {error.lineno})"]
    flags: list[tuple[int, str]] = []

    def flag(node: nodes.Node, message: str) -> None:
        flags.append((node.lineno, f"{message} (line {node.lineno})"))

    local_names = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    local_names |= {m.name for m in tree.find_all(nodes.Macro)}
    for name_node in tree.find_all(nodes.Name):
        if (
            name_node.ctx == "load"
            and name_node.name in _DANGEROUS_NAMES
            and name_node.name not in local_names
        ):
            flag(name_node, f"uses the name {name_node.name!r}")
    for attr in tree.find_all(nodes.Getattr):
        if attr.attr.startswith("_") or attr.attr in _DANGEROUS_ATTRS:
            flag(attr, f"reaches for the attribute {attr.attr!r}")
        elif attr.attr in ("format", "format_map"):
            receiver = attr.node.value if isinstance(attr.node, nodes.Const) else None
            if not isinstance(receiver, str) or _FORMAT_TRAVERSAL.search(receiver):
                flag(attr, f"calls .{attr.attr} on a string that is not a constant or walks attributes")
    for item in tree.find_all(nodes.Getitem):
        key = item.arg.value if isinstance(item.arg, nodes.Const) else None
        if isinstance(key, str) and (key.startswith("_") or key in _INTROSPECTION):
            flag(item, f"reaches for the item {key!r}")
    for const in tree.find_all(nodes.Const):
        if isinstance(const.value, str) and _DUNDER.search(const.value):
            flag(const, f"holds the dunder string {const.value[:40]!r}")
    for concat in tree.find_all((nodes.Concat, nodes.Add)):
        try:
            folded = concat.as_const(nodes.EvalContext(env))
        except Exception:  # noqa: BLE001, S112 - not constant: nothing to fold
            continue
        if isinstance(folded, str) and _DUNDER.search(folded):
            flag(concat, f"builds the dunder string {folded[:40]!r}")
    for filter_node in tree.find_all(nodes.Filter):
        if filter_node.name == "attr":
            flag(filter_node, "uses the |attr filter")
    for tag in tree.find_all((nodes.Import, nodes.FromImport, nodes.Include, nodes.Extends)):
        flag(tag, f"uses {{% {type(tag).__name__.lower()} %}}, which reaches outside the template")
    return True, [message for _line, message in sorted(set(flags))]


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
