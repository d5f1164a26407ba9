"""Render llamaforge's Jinja templates: one ``render()``, StrictUndefined, every value quoted for the language it
lands in: ``q`` for POSIX shells, ``ps`` for PowerShell, ``json`` for a Dockerfile's exec form, ``yaml`` for YAML
(``compose`` and ``kube`` add the ``$`` escapes Compose's and Kubernetes' own interpolation take), ``systemd``,
``systemd_env`` and ``systemd_text`` for unit files. A value no quoting can carry (a control character in a
unit or a YAML file) is refused with :class:`~llamaforge.core.errors.InvalidOption`, never written.

``render_cached()`` is ``render()`` for the build files (builder Dockerfiles, build scripts), whose text a build
plan needs on every run, a cache hit included: the text is kept under ``home()/cache/rendered/``, named by a
digest of everything rendering reads (every template file's content, this module's source, Jinja's installed
files, the Python version, the template name and the context), so any edit renders again and a cache hit needs
no Jinja at all. A kept text starts with a line naming that digest and the text's sha256; one that does not
match (cut short, edited, copied under another digest's name) is rendered again. Deploy files are never cached:
their contexts may hold what must not be written to disk.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.core.errors import InvalidOption
from llamaforge.core.paths import data_dir, home, write_text_atomic
from llamaforge.core.validation import check_image_reference

if TYPE_CHECKING:
    import jinja2

# Bump when the meaning of a cached text changes in a way the digest does not see.
_RENDER_CACHE_FORMAT = 1
_RENDER_CACHE_KEEP = 64  # texts kept; the oldest go when one more is written


def _shell_quote(value: object) -> str:
    return shlex.quote(str(value))


def _powershell_quote(value: object) -> str:
    # A single-quoted PowerShell string is literal; a quote inside it is written twice.
    return "'" + str(value).replace("'", "''") + "'"


def _dockerfile_json(value: object) -> str:
    # Exec-form instructions take a JSON array; json.dumps gives the exact quoting Docker expects.
    return json.dumps(value)


def _dockerfile_string(value: object) -> str:
    # A double-quoted word of LABEL or ENV: Docker unescapes \\ and \" there and substitutes $VAR, so $ is
    # escaped too; a line break cannot be written in one.
    text = _refuse_control(str(value), "a Dockerfile instruction")
    return json.dumps(text, ensure_ascii=False).replace("$", "\\$")


def _image_reference(value: object) -> str:
    # A FROM line takes the reference unquoted: it must follow Docker's grammar, nothing else.
    try:
        return check_image_reference(str(value))
    except ValueError as error:
        raise InvalidOption(str(error), hint="an image reference such as debian:bookworm-slim") from None


def _cmake_word(value: object) -> str:
    # An unquoted CMake argument (a program or a path): plain characters only, refused otherwise.
    text = str(value)
    if not re.fullmatch(r"[A-Za-z0-9_.+/-]+", text):
        raise InvalidOption(f"{text!r} cannot be an unquoted CMake argument", hint="plain characters only")
    return text


def _cmake_string(value: object) -> str:
    # A CMake quoted argument: \\, \" and \$ (a variable reference) escaped; a ; stays (it is the value's).
    text = _refuse_control(str(value), "a CMake file")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


# A word systemd reads back as it is: no quote, backslash, specifier, variable, separator or blank.
_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_=:,./+-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What YAML may hold unescaped in a double-quoted scalar (YAML 1.1's printable set, which JSON's escaping misses).
_YAML_UNPRINTABLE = re.compile("[\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def _refuse_control(value: str, where: str) -> str:
    if _CONTROL.search(value):
        raise InvalidOption(
            f"{value!r} has a control character (a newline, a tab …), which {where} cannot hold",
            hint="give the value without control characters",
        )
    return value


def _systemd_word(value: object, *, variables: bool) -> str:
    """One word of a unit setting that unquotes and C-unescapes its words (``ExecStart=``, ``Environment=``,
    ``ReadOnlyPaths=``): ``%`` doubled (a specifier), ``$`` doubled where systemd expands variables
    (``variables``: command lines), and double quotes with ``\\`` and ``\"`` around anything but plain
    characters (a lone ``;`` separates commands, a blank splits words). systemd reads a command's prefixes
    (``-``, ``+``, ``@`` …) after unquoting, so a command's first word must be an absolute path: the caller's
    to check."""
    text = _refuse_control(str(value), "a systemd unit")
    text = text.replace("%", "%%")
    if variables:
        text = text.replace("$", "$$")
    if _SYSTEMD_PLAIN.fullmatch(text.replace("%", "").replace("$", "")):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_argument(value: object) -> str:
    # an ExecStart= word: systemd expands $VAR and ${VAR} in command lines
    return _systemd_word(value, variables=True)


def _systemd_value(value: object) -> str:
    # Environment=, ReadOnlyPaths=, CacheDirectory=: "$" has no meaning there
    return _systemd_word(value, variables=False)


def _systemd_text(value: object) -> str:
    # Description= and other free text: taken as written, but for specifiers; one line
    return _refuse_control(str(value), "a systemd unit").replace("%", "%%")


def _yaml_scalar(value: object, dollar: str = "$") -> str:
    """``value`` as YAML: a string as a double-quoted scalar (JSON's quoting, plus ``\\u`` escapes for the
    characters YAML may not hold as they are), numbers and booleans as they are, lists and dicts in flow
    style; ``dollar`` replaces each ``$`` of a string (``$$`` where the reader interpolates)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_scalar(item, dollar) for item in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{_yaml_scalar(str(key), dollar)}: {_yaml_scalar(item, dollar)}" for key, item in value.items()
        )
        return "{" + ", ".join(items) + "}"
    text = json.dumps(str(value).replace("$", dollar), ensure_ascii=False)
    return _YAML_UNPRINTABLE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _yaml(value: object) -> str:
    return _yaml_scalar(value)


def _interpolated_yaml(value: object) -> str:
    # Compose interpolates $VAR and ${VAR} in every value, Kubernetes $(VAR) in command, args and env values;
    # both read $$ as one $.
    return _yaml_scalar(value, "$$")


def _environment() -> jinja2.Environment:
    import jinja2  # only when a template is rendered: a cached build file needs no Jinja

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
    env.filters["dockerfile"] = _dockerfile_string
    env.filters["cmake"] = _cmake_string
    env.filters["cmake_word"] = _cmake_word
    env.filters["image"] = _image_reference
    env.filters["yaml"] = _yaml
    env.filters["compose"] = _interpolated_yaml
    env.filters["kube"] = _interpolated_yaml
    env.filters["systemd"] = _systemd_argument
    env.filters["systemd_env"] = _systemd_value
    env.filters["systemd_text"] = _systemd_text
    return env


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context``; a missing variable is an error, never empty text."""
    return _environment().get_template(template).render(**context)


def render_cached(template: str, **context: Any) -> str:
    """``render(template, **context)``, kept in the cache under a digest of everything rendering reads. A
    context that is not plain data (str, int, float, bool, None, lists, tuples, dicts) is rendered each time;
    an unreadable or unwritable cache only costs the rendering."""
    digest = _render_digest(template, context)
    if digest is None:
        return render(template, **context)
    path = home() / "cache" / "rendered" / f"{digest}.txt"
    kept = _read_kept(path, digest)
    if kept is not None:
        return kept
    text = render(template, **context)
    try:
        write_text_atomic(path, _kept_header(digest, text) + text)
        _prune(path.parent)
    except OSError:
        pass  # a read-only home: the text is still right, only not kept
    return text


def _kept_header(digest: str, text: str) -> str:
    """The first line of a kept text: the digest it is kept under and the sha256 of the text that follows."""
    return f"llamaforge-rendered {digest} sha256:{hashlib.sha256(text.encode()).hexdigest()}\n"


def _read_kept(path: Path, digest: str) -> str | None:
    """The text kept at ``path`` when its first line names ``digest`` and the sha256 of the rest; None when it
    is missing, unreadable, cut short, edited or kept under another digest (then it is rendered again)."""
    try:  # bytes, decoded: the sha256 covers the exact text, with no newline translation
        header, newline, text = path.read_bytes().decode("utf-8").partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return text if newline and header + newline == _kept_header(digest, text) else None


def _render_digest(template: str, context: dict[str, Any]) -> str | None:
    """A digest of everything ``render`` reads, or None when the context cannot be written down exactly."""
    try:
        plain = _tagged(context)
    except TypeError:
        return None
    digest = hashlib.sha256(f"{_code_digest()}\n{template}\n".encode())
    digest.update(json.dumps(plain, sort_keys=True).encode())
    root = data_dir("templates")
    for path in sorted(root.rglob("*")):
        if path.is_file():  # every template: one may include or import another
            digest.update(f"\n{path.relative_to(root).as_posix()}\n".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


@functools.cache
def _code_digest() -> str:
    """The code that renders, once per process: this module (the filters, the environment's settings), Jinja's
    and MarkupSafe's installed files (read without importing them) and the Python version (``shlex``)."""
    digest = hashlib.sha256(f"{_RENDER_CACHE_FORMAT}\n{sys.version}\n".encode())
    digest.update(Path(__file__).read_bytes())
    for package in ("jinja2", "markupsafe"):
        spec = importlib.util.find_spec(package)
        for module in sorted(Path(spec.origin).parent.glob("*.py")) if spec and spec.origin else ():
            stat = module.stat()
            digest.update(f"{module}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _tagged(value: Any) -> Any:
    """``value`` as JSON data that keeps its exact Python type (a tuple and a list render differently, an enum
    member is no plain string) and the order of its dicts (a loop over one renders in that order)."""
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind in (int, float):
        return {"t": kind.__name__, "v": repr(value)}
    if kind in (list, tuple):
        return {"t": kind.__name__, "v": [_tagged(item) for item in value]}
    if kind is dict:
        return {"t": "dict", "v": [[_tagged(key), _tagged(item)] for key, item in value.items()]}
    raise TypeError(f"not plain data: {kind.__name__}")


def _prune(directory: Path) -> None:
    """Keep the newest ``_RENDER_CACHE_KEEP`` texts."""
    texts = sorted(directory.glob("*.txt"), key=lambda path: path.stat().st_mtime_ns, reverse=True)
    for old in texts[_RENDER_CACHE_KEEP:]:
        old.unlink(missing_ok=True)
