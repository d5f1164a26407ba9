"""What a llama.cpp tree's CMake files declare, read without running CMake: its options (``option``,
``cmake_dependent_option``, ``set(… CACHE …)``), the deprecated names it maps or refuses (llama.cpp's
``llama_option_depr(TYPE OLD [NEW])`` helper and ``message(… "OLD is deprecated, use NEW instead")``), and its
targets (``add_executable``, ``add_library``, ``add_custom_target``, with ``set_target_properties(… OUTPUT_NAME
…)``).

The reader tokenizes CMake's command syntax (comments, quoted and bracket arguments, nested parentheses) and follows
the plain ``set(VAR value)`` of each file in order, so llama.cpp's ``set(TARGET llama-server)`` +
``add_executable(${TARGET} …)`` idiom resolves. It does not evaluate conditions: an option declared in any branch
is declared, with every default it is given.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")
_VARIABLE = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MESSAGE_TYPES = frozenset(
    {"FATAL_ERROR", "SEND_ERROR", "WARNING", "AUTHOR_WARNING", "DEPRECATION", "NOTICE"}
)
_DEPRECATED = re.compile(
    r"^([A-Z][A-Z0-9_]+) is deprecated(?:,? use ([A-Z][A-Z0-9_]+)(=\S+)? instead| and will be ignored)"
)
_SKIPPED_DIRS = frozenset({".git", "build", "node_modules"})


@dataclass(frozen=True)
class Command:
    """One command invocation: its name (lower case), its arguments (quotes removed) and where it is."""

    name: str
    args: list[str]
    line: int


@dataclass(frozen=True)
class Option:
    """A declared option or cache variable and the default one declaration gives it (as written)."""

    name: str
    default: str
    how: str  # "option", "cmake_dependent_option", "cache BOOL" …
    where: str  # file:line, relative to the tree
    forced: bool = False  # set(… CACHE … FORCE): the tree overwrites any value given on the command line
    doc: str = ""


@dataclass(frozen=True)
class Deprecation:
    """A name the tree still recognises only to warn about, map to another option, or refuse."""

    old: str
    new: str | None  # the option it now sets, None when it is ignored
    level: str  # FATAL_ERROR (the configure step fails), WARNING, DEPRECATION …
    where: str
    value: str | None = None  # "=all" when the message names the value to use


@dataclass(frozen=True)
class Target:
    """A target the tree defines: its name, kind, the directory of its CMakeLists.txt and its output name."""

    name: str
    kind: str  # executable, library, custom
    directory: str
    where: str
    output_name: str | None = None


@dataclass
class CMakeScan:
    """Everything :func:`scan_tree` reads from one tree."""

    options: dict[str, list[Option]] = field(default_factory=dict)
    deprecations: dict[str, Deprecation] = field(default_factory=dict)
    targets: dict[str, Target] = field(default_factory=dict)
    words: set[str] = field(default_factory=set)  # every name written in a command's arguments

    def defaults(self, name: str) -> list[str]:
        """The distinct defaults the declarations of ``name`` give, in the order they appear; a ``FORCE``d value
        in some branch is an override, not a default, unless every declaration is forced."""
        declared = self.options.get(name, [])
        chosen = [option for option in declared if not option.forced] or declared
        return list(dict.fromkeys(option.default for option in chosen))


def _skip_bracket(text: str, index: int) -> tuple[str, int] | None:
    """The content of a bracket argument or comment ``[==[ … ]==]`` starting at ``index``, and the index after it."""
    match = _BRACKET_OPEN.match(text, index)
    if match is None:
        return None
    close = f"]{match.group(1)}]"
    end = text.find(close, match.end())
    end = len(text) if end < 0 else end
    return text[match.end() : end], end + len(close)


def _arguments(text: str, index: int) -> tuple[list[str], int]:
    """The arguments of the invocation whose ``(`` was just before ``index``, and the index after its ``)``."""
    args: list[str] = []
    depth = 1
    length = len(text)
    while index < length:
        char = text[index]
        if char in " \t\r\n":
            index += 1
        elif char == "#":
            bracket = _skip_bracket(text, index + 1)
            if bracket is not None:
                index = bracket[1]
            else:
                newline = text.find("\n", index)
                index = length if newline < 0 else newline
        elif char == '"':
            end = index + 1
            while end < length and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            args.append(text[index + 1 : end].replace('\\"', '"'))
            index = end + 1
        elif char == "[" and (bracket := _skip_bracket(text, index)) is not None:
            args.append(bracket[0])
            index = bracket[1]
        elif char == "(":
            depth += 1
            args.append("(")
            index += 1
        elif char == ")":
            depth -= 1
            index += 1
            if depth == 0:
                return args, index
            args.append(")")
        else:
            end = index
            while end < length and text[end] not in ' \t\r\n()#"':
                end += 2 if text[end] == "\\" else 1
            args.append(text[index:end])
            index = end
    return args, index


def commands(text: str) -> Iterator[Command]:
    """Every command invocation of a CMake file, in order (a syntax it cannot read ends the file there)."""
    index = 0
    line = 1
    length = len(text)
    while index < length:
        char = text[index]
        if char in " \t\r\n":
            line += char == "\n"
            index += 1
            continue
        if char == "#":
            bracket = _skip_bracket(text, index + 1)
            if bracket is not None:
                end = bracket[1]
            else:
                newline = text.find("\n", index)
                end = length if newline < 0 else newline
        else:
            match = _IDENT.match(text, index)
            opening = match.end() if match else index
            while opening < length and text[opening] in " \t":
                opening += 1
            if match is None or opening >= length or text[opening] != "(":
                newline = text.find("\n", index)  # not a command: skip the line
                end = length if newline < 0 else newline + 1
            else:
                args, end = _arguments(text, opening + 1)
                yield Command(match.group(0).lower(), args, line)
        line += text.count("\n", index, end)
        index = end


def _cmake_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        if any(part in _SKIPPED_DIRS for part in path.relative_to(root).parts[:-1]):
            continue
        if path.is_file() and (path.name == "CMakeLists.txt" or path.suffix == ".cmake"):
            files.append(path)
    return files


def _substitute(value: str, variables: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda match: variables.get(match.group(1), match.group(0)), value)


def _cache_variable(args: list[str]) -> tuple[str, str, bool, str] | None:
    """``set(NAME value… CACHE TYPE "doc" [FORCE])``: the type, the value, whether it is forced, the doc."""
    if "CACHE" not in args[1:]:
        return None
    at = args.index("CACHE", 1)
    kind = args[at + 1] if len(args) > at + 1 else "STRING"
    rest = [arg for arg in args[at + 2 :] if arg != "FORCE"]
    return kind, ";".join(args[1:at]), "FORCE" in args[at + 2 :], " ".join(rest)


def _default(raw: str, assigned: dict[str, list[str]]) -> str:
    """A default as written; one that is a variable gets the values the file assigns it (``${GGML_NATIVE_DEFAULT}
    (OFF|ON)``), which depend on conditions this reader does not evaluate."""
    match = _VARIABLE.fullmatch(raw)
    if match is None or match.group(1) not in assigned:
        return raw
    return f"{raw} ({'|'.join(sorted(set(assigned[match.group(1)])))})"


def _read_file(scan: CMakeScan, root: Path, path: Path) -> None:
    relative = path.relative_to(root).as_posix()
    directory = path.parent.relative_to(root).as_posix()
    variables: dict[str, str] = {}
    listed = list(commands(path.read_text(encoding="utf-8", errors="replace")))
    assigned: dict[str, list[str]] = {}
    for command in listed:
        if command.name == "set" and len(command.args) == 2:
            assigned.setdefault(command.args[0], []).append(command.args[1])
    for command in listed:
        raw = command.args
        args = [_substitute(arg, variables) for arg in raw]
        where = f"{relative}:{command.line}"
        for arg in raw:
            scan.words.update(_WORD.findall(arg))
        if not args:
            continue
        name = args[0]
        if command.name == "option" and len(args) >= 2:
            default = _default(raw[2], assigned) if len(raw) > 2 else "OFF"
            doc = raw[1] if len(raw) > 1 else ""
            scan.options.setdefault(name, []).append(Option(name, default, "option", where, doc=doc))
        elif command.name == "cmake_dependent_option" and len(args) >= 3:
            default = _default(raw[2], assigned)
            scan.options.setdefault(name, []).append(
                Option(name, default, "cmake_dependent_option", where, doc=raw[1])
            )
        elif command.name == "set" and len(args) >= 2:
            cache = _cache_variable(raw)
            if cache is None:
                if len(args) == 2:  # a plain variable of this file: followed, as ${TARGET} is everywhere
                    variables[name] = args[1]
            elif cache[0] != "INTERNAL":
                kind, default, forced, doc = cache
                scan.options.setdefault(name, []).append(
                    Option(name, _default(default, assigned), f"cache {kind}", where, forced, doc)
                )
        elif command.name.endswith("option_depr"):
            level, rest = (args[0], args[1:]) if args[0] in _MESSAGE_TYPES else ("WARNING", args)
            if rest and _IDENT.fullmatch(rest[0]):
                new = rest[1] if len(rest) > 1 and _IDENT.fullmatch(rest[1]) else None
                scan.deprecations[rest[0]] = Deprecation(rest[0], new, level, where)
        elif command.name == "message" and len(args) >= 2 and args[0] in _MESSAGE_TYPES:
            said = _DEPRECATED.match(" ".join(args[1:]))
            if said is not None:
                value = said.group(3)[1:] if said.group(3) else None
                scan.deprecations[said.group(1)] = Deprecation(
                    said.group(1), said.group(2), args[0], where, value
                )
        elif command.name in ("add_executable", "add_library", "add_custom_target"):
            if "::" in name or "$" in name or any(arg in ("ALIAS", "IMPORTED") for arg in args[1:3]):
                continue
            kind = {"add_executable": "executable", "add_library": "library"}.get(command.name, "custom")
            scan.targets.setdefault(name, Target(name, kind, directory, where))
        elif command.name == "set_target_properties" and "OUTPUT_NAME" in args:
            output = (
                args[args.index("OUTPUT_NAME") + 1] if args.index("OUTPUT_NAME") + 1 < len(args) else None
            )
            for target in args[: args.index("PROPERTIES")] if "PROPERTIES" in args else args[:1]:
                if target in scan.targets and output:
                    known = scan.targets[target]
                    scan.targets[target] = Target(
                        known.name, known.kind, known.directory, known.where, output
                    )


def scan_tree(root: Path) -> CMakeScan:
    """Read every CMakeLists.txt and ``*.cmake`` file under ``root``."""
    scan = CMakeScan()
    for path in _cmake_files(root):
        _read_file(scan, root, path)
    return scan
