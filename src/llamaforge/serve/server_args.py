"""Extra llama-server flags (``--server-args "…"`` of deploy, deploy.render and smoke), checked against the
build's own ``llama-server --help``.

The text is split like a shell would (:func:`shlex.split`, no variables or globs), then read flag by flag with
the option table of the build's help (:func:`parse_server_help`): every flag must be one of its names (a
``--long_name`` is read as ``--long-name``, as llama.cpp does), followed by the values its help names (none,
one, or two for ``START END``). Refused, each with a clear error: a flag the build does not know (with the
closest names, or the option whose help mentions the word: ``--mlock`` → ``--load-mode``), a word that is no
flag, a flag without its value, a value the help pins down that is not one it allows (a number, one of a list
of choices, on/off/auto), a value with a control character, the flags llamaforge sets itself (the
model, address and port, and whatever a front sets from its own options), secrets (``--api-key``,
``--hf-token``…: a command line is readable by every user of the host and is written into unit files), and
the flags that make llama-server print and exit. The help is read once per build and kept in
``$LLAMAFORGE_HOME/cache/server-help/``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import textwrap
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from llamaforge.core.errors import InvalidOption, ToolFailed
from llamaforge.core.paths import home, write_text_atomic
from llamaforge.core.validation import closest, did_you_mean
from llamaforge.runners.process import LOCAL, ProcessRunner

OPTION = "--server-args"
_COLUMN = 40  # where llama-server's help starts an option's description
_NAME = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9._-]*$")
_TWO_VALUES = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_KEY = "the API key is made per release and passed as a file (deploy --listen beyond loopback)"
#: Why flags are refused whatever the front, by one of each option's names.
ALWAYS_REFUSED: Final = {
    # a command line is readable by every user of the host and lands in unit files
    "--api-key": f"llamaforge passes no secret this way: {_KEY}",
    "--api-key-file": f"llamaforge passes no secret this way: {_KEY}",
    "--hf-token": "llamaforge passes no secret this way: fetch the model with `invoke models.fetch` (HF_TOKEN "
    "stays here) and pass --model",
    "--ssl-key-file": "llamaforge passes no secret this way: terminate TLS in a proxy in front of llama-server",
    # the model is llamaforge's -m
    "--model-url": "llamaforge sets the model: use --model",
    "--hf-repo": "llamaforge sets the model: use --model",
    "--hf-file": "llamaforge sets the model: use --model",
    "--docker-repo": "llamaforge sets the model: use --model",
    "--models-dir": "llamaforge sets the model: use --model",
    "--models-preset": "llamaforge sets the model: use --model",
    # clients of the server would reach the host's files or run programs there
    "--path": "it serves the host's files to every client",
    "--media-path": "it lets clients read the host's files",
    "--tools": "it lets clients run tools (read files, run commands) on the host",
    "--tools-runtime": "it lets clients run tools on the host",
    "--agent": "it lets clients run tools on the host",
    "--mcp-servers-config": "it lets clients run tools on the host",
    "--mcp-servers-json": "it lets clients run tools on the host",
    "--ui-mcp-proxy": "it lets clients reach other servers through the host",
    "--slot-save-path": "it lets clients write files on the host",
    "--log-prompts-dir": "it writes every prompt to the host's disk",
    # print and exit
    "--help": "it makes llama-server print and exit instead of serving",
    "--version": "it makes llama-server exit",
    "--cache-list": "it makes llama-server exit",
    "--list-devices": "it makes llama-server exit",
    "--completion-bash": "it makes llama-server exit",
}
_DOWNLOADS = (
    "it downloads files on the host: fetch a model with `invoke models.fetch` and pass it with --model"
)
# The values llama-server's help pins down, checked here so that a typo fails before any host is touched (any
# other value, a path or a pattern, is llama-server's to read):
# a number, for the placeholders its numeric options use; the words such an option's help quotes ('auto', 'all')
_NUMERIC = frozenset({"N", "INDEX", "SEED", "P", "L", "SECONDS", "SIMILARITY", "<0|1>", "<0...100>"})
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_QUOTED = re.compile(r"'([a-z]+)'")
# on/off switches, as llama.cpp's common_arg_utils reads them (is_truthy, is_falsey, is_autoy)
_SWITCHES = {
    "[on|off]": ("on", "off", "enabled", "disabled", "true", "false", "1", "0"),
    "[on|off|auto]": ("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1"),
}
# a list of choices: {none,linear,yarn}, or a TYPE whose help says "allowed values: f32, f16, …"
_CHOICES = re.compile(r"^\{([A-Za-z0-9_-]+(?:,[A-Za-z0-9_-]+)+)\}$")
_ALLOWED = re.compile(r"allowed values: ([A-Za-z0-9_]+(?:, [A-Za-z0-9_]+)+)")


@dataclass(frozen=True)
class ServerOption:
    """One option of llama-server's help: its names, how many values follow it, and its help text."""

    names: tuple[str, ...]
    values: int
    placeholder: str = ""
    help: str = ""


def _normal(flag: str) -> str:
    # llama.cpp reads a long flag's '_' as '-'
    return flag.replace("_", "-") if flag.startswith("--") else flag


def parse_server_help(text: str) -> dict[str, ServerOption]:
    """The options of ``llama-server --help``, by each of their names."""
    options: dict[str, ServerOption] = {}
    current: ServerOption | None = None
    for line in text.splitlines():
        if line.startswith("-----"):  # a section title
            current = None
        elif not line.startswith("-"):
            if current is not None and line.strip():
                current = _described(options, current, line.strip())
        else:
            described = len(line) > _COLUMN and line[_COLUMN - 2 : _COLUMN] == "  " and line[_COLUMN] != " "
            head, description = (line[:_COLUMN], line[_COLUMN:].strip()) if described else (line, "")
            names: list[str] = []
            words = head.split()
            while words and _NAME.match(words[0].rstrip(",")):
                names.append(words.pop(0).rstrip(","))
            if not names:
                current = None
                continue
            two = len(words) == 2 and all(_TWO_VALUES.match(word) for word in words)
            current = ServerOption(tuple(names), 2 if two else 1 if words else 0, " ".join(words), "")
            current = _described(options, current, description)
    return options


def _described(options: dict[str, ServerOption], option: ServerOption, text: str) -> ServerOption:
    """``option`` with ``text`` added to its help, stored under each of its names."""
    described = ServerOption(option.names, option.values, option.placeholder, f"{option.help} {text}".strip())
    for name in option.names:
        options[name] = described
    return described


def refusal(option: ServerOption, owned: Mapping[str, str]) -> str | None:
    """Why ``option`` may not be given (``owned``: the flags the front sets, to what sets them), or None."""
    for name in option.names:
        if name in owned:
            return f"llamaforge sets it: {owned[name]}"
        if name in ALWAYS_REFUSED:
            return ALWAYS_REFUSED[name]
    if "download" in option.help.lower() or any(name.endswith("-url") for name in option.names):
        return _DOWNLOADS
    return None


def value_expected(option: ServerOption, value: str) -> str | None:
    """What ``option`` takes, when ``value`` is not that; None when it is, or when the help does not pin the
    value down (a path, a pattern, free text)."""
    placeholder = option.placeholder
    if placeholder in _SWITCHES:
        return None if value in _SWITCHES[placeholder] else _either(placeholder.strip("[]").split("|"))
    listed = _CHOICES.match(placeholder) or (_ALLOWED.search(option.help) if placeholder == "TYPE" else None)
    if listed:
        choices = listed.group(1).replace(" ", "").split(",")
        return None if value in choices else f"one of {', '.join(choices)}"
    if placeholder in _NUMERIC:
        words = _QUOTED.findall(option.help)
        if _NUMBER.match(value) or value in words:
            return None
        return _either(["a number", *(f"'{word}'" for word in words)])
    return None


def _either(items: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


_CACHE: dict[str, dict[str, ServerOption]] = {}
_CACHE_LOCK = threading.Lock()


def server_help(binary: Path, build_key: str | None, runner: ProcessRunner = LOCAL) -> str:
    """``llama-server --help`` of a build: read from ``$LLAMAFORGE_HOME/cache/server-help/KEY.txt`` when a build
    of the store (``build_key``) was asked before, else run (and kept for a build of the store)."""
    cached = home() / "cache" / "server-help" / f"{build_key}.txt" if build_key else None
    if cached is not None and (kept := _read_kept_help(cached)) is not None:
        return kept
    if not binary.is_file():
        raise InvalidOption(
            f"the build has no {binary.name} to check {OPTION} with ({binary})",
            hint="add llama-server to the recipe's targets",
        )
    result = runner.run([str(binary), "--help"], warn=True, timeout_s=60)
    if not result.ok or "--port" not in result.stdout:
        raise ToolFailed(
            f"{binary} --help did not print llama-server's options, so {OPTION} cannot be checked",
            command=result.argv,
            returncode=result.exit_code,
            tail=(result.stdout + result.stderr).splitlines()[-10:],
            hint="the build's llama-server must run on this machine to be asked (a CUDA build needs no GPU for "
            "--help, but its libraries); drop --server-args to go on without them",
        )
    if cached is not None:
        write_text_atomic(cached, f"sha256 {_digest(result.stdout)}\n{result.stdout}")
    return result.stdout


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_kept_help(path: Path) -> str | None:
    """The help kept in ``path`` when its first line's sha256 still matches it; None when there is none, or it
    was truncated, emptied or edited since (read so, every flag after the cut would be refused as unknown)."""
    try:
        first, _, text = path.read_text(encoding="utf-8").partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return text if first == f"sha256 {_digest(text)}" else None


def server_options(
    binary: Path, build_key: str | None, runner: ProcessRunner = LOCAL
) -> dict[str, ServerOption]:
    """The parsed options of a build's llama-server (:func:`server_help`), once per build and process."""
    key = build_key or str(binary.resolve())
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = parse_server_help(server_help(binary, build_key, runner))
        return _CACHE[key]


def split_server_args(text: str | None) -> tuple[str, ...]:
    """``--server-args`` split as a shell would (quotes, backslashes; no variables or globs); InvalidOption for
    unbalanced quotes or a control character (a newline included)."""
    if not text or not text.strip():
        return ()
    if _CONTROL.search(text):
        raise InvalidOption(
            f"{OPTION} holds a control character (a newline or tab): {text!r}",
            hint="give the flags on one line, separated by spaces",
        )
    try:
        return tuple(shlex.split(text))
    except ValueError as error:
        raise InvalidOption(
            f"{OPTION} {text!r} cannot be split: {error}",
            hint="quote a value with spaces whole: --server-args \"--alias 'my model'\"",
        ) from None


def _unknown(flag: str, options: Mapping[str, ServerOption]) -> InvalidOption:
    near = closest(flag, options, n=2, cutoff=0.75)
    if not near:  # the word in another option's help (a flag folded into another's values)
        word = re.compile(rf"\b{re.escape(flag.lstrip('-'))}\b")
        near = sorted({option.names[-1] for option in options.values() if word.search(option.help)})[:2]
    return InvalidOption(
        f"{OPTION}: {flag} is not a flag of this build's llama-server",
        hint=did_you_mean(near or closest(flag, options, n=2), end=" ")
        + "`llama-server --help` of the build lists its flags",
    )


def _with_equals(word: str, options: Mapping[str, ServerOption], owned: Mapping[str, str]) -> InvalidOption:
    """``--flag=value``: llama-server reads no '='; the value (maybe a secret) is not repeated."""
    name = _normal(word.partition("=")[0])
    option = options.get(name) or ServerOption((name,), 1)
    reason = refusal(option, owned)
    if reason is not None:
        return InvalidOption(f"{OPTION}: {name} cannot be given", hint=reason)
    return InvalidOption(
        f"{OPTION}: {name}=… is not how llama-server takes a value",
        hint=f"write {name} VALUE, with a space (llama-server reads no '=')",
    )


def check_server_args(
    args: Sequence[str], options: Mapping[str, ServerOption], owned: Mapping[str, str]
) -> tuple[str, ...]:
    """``args`` read against ``options`` (see the module docstring); ``owned`` maps the flags llamaforge sets
    itself (any one name of each) to what sets them. Returns the flags as given, long names normalized."""
    out: list[str] = []
    index, before = 0, None
    while index < len(args):
        word = args[index]
        flag = _normal(word)
        option = options.get(flag)
        if option is None:
            if word.startswith("-") and "=" in word:
                raise _with_equals(word, options, owned)
            if word.startswith("-"):
                raise _unknown(flag, options)
            after = f"{before} before it takes no value" if before else "it comes before any flag"
            raise InvalidOption(
                f"{OPTION}: {word!r} is no flag, and {after}",
                hint="write flags and their values as llama-server takes them: --alias NAME",
            )
        reason = refusal(option, owned)
        if reason is not None:
            names = f" ({', '.join(option.names)})" if len(option.names) > 1 else ""
            raise InvalidOption(f"{OPTION}: {word}{names} cannot be given", hint=reason)
        values = list(args[index + 1 : index + 1 + option.values])
        if len(values) < option.values:
            needs = "a value" if option.values == 1 else f"{option.values} values"
            raise InvalidOption(
                f"{OPTION}: {word} needs {needs} ({option.placeholder})",
                hint=f"e.g. {word} {option.placeholder}",
            )
        expected = value_expected(option, values[0]) if option.values == 1 else None
        if expected is not None:
            raise InvalidOption(
                f"{OPTION}: {word} takes {expected}, not {values[0]!r}",
                hint=f"the build's llama-server --help: {word} {option.placeholder}: "
                + textwrap.shorten(option.help, 160, placeholder=" …"),
            )
        out += [flag, *values]
        index, before = index + 1 + option.values, word
    return tuple(out)


def server_args_for(
    text: str | None,
    binary: Path,
    build_key: str | None,
    owned: Mapping[str, str],
    runner: ProcessRunner = LOCAL,
) -> tuple[str, ...]:
    """``--server-args`` split and checked against the build's llama-server (nothing is run for none)."""
    args = split_server_args(text)
    return check_server_args(args, server_options(binary, build_key, runner), owned) if args else ()


def precheck_server_args(text: str | None, owned: Mapping[str, str]) -> tuple[str, ...]:
    """What can be refused before the build exists (smoke may build it first): the split, and the flags refused
    whatever the build, by the names given."""
    args = split_server_args(text)
    for word in args:
        name = _normal(word.partition("=")[0])  # the name alone: a value after '=' may be a secret
        reason = refusal(ServerOption((name,), 0), owned)
        if word.startswith("-") and reason is not None:
            raise InvalidOption(f"{OPTION}: {name} cannot be given", hint=reason)
    return args
