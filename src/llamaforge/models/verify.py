"""``models.verify``: is this GGUF intact, what its recipe promises, and loadable?

Order matters: the hardened header pre-parse (:mod:`llamaforge.gguf.header`) runs first, so nothing
unchecked reaches any other reader; then one streaming sha256 pass, the structure (layout, vocabulary rows),
the recipe's expectations, the tensor set of the architecture, the quantisation histogram and a static audit
of the chat template; optionally a real load with a built llama.cpp. The recipe-independent part of the
verdict is cached under ``<home>/verify-cache`` keyed on the file's (device, inode, size, mtime_ns), with its
sha256 stored, so a cache hit neither re-parses nor re-hashes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from llamaforge import __version__
from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.paths import home, write_text_atomic
from llamaforge.runners.process import LOCAL, ProcessRunner

# The readers are imported by the checks that use them: every front imports this module (for Status).
if TYPE_CHECKING:
    from llamaforge.gguf.header import GGUFHeader
    from llamaforge.models.recipes import ModelRecipe

Status = Literal["ok", "warn", "fail", "skipped"]
CHECKS: Final = ("header", "sha256", "structure", "tensors", "expectations", "template", "load")
# Bump when the analysis changes, so old cache entries are not trusted.
VERIFY_CACHE_VERSION: Final = 1
_HASH_BUFFER: Final = 8 << 20


@dataclass(frozen=True)
class Finding:
    """One result of a check: ``subject`` names the tensor, key or field concerned."""

    check: str
    status: Status
    subject: str
    message: str


@dataclass
class VerifyReport:
    """The verdict on one model file."""

    path: str
    size: int
    sha256: str
    model: dict[str, Any]
    findings: list[Finding]
    recipe: str | None = None
    cached: bool = False
    seconds: float = 0.0
    checks_run: set[str] = field(default_factory=set)
    load_check: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not any(finding.status == "fail" for finding in self.findings)

    def checks(self) -> dict[str, Status]:
        """The worst status per check (``skipped`` when it did not run)."""
        rank = {"ok": 0, "warn": 1, "fail": 2}
        result: dict[str, Status] = {}
        for name in CHECKS:
            if name not in self.checks_run:
                result[name] = "skipped"
                continue
            statuses = [f.status for f in self.findings if f.check == name and f.status in rank]
            result[name] = max(statuses, key=lambda s: rank[s], default="ok")
        return result

    def to_json(self) -> dict[str, Any]:
        """JSON-able form; ``exit_code`` is ModelError's when a check failed."""
        return {
            "path": self.path,
            "ok": self.ok,
            "exit_code": 0 if self.ok else ModelError.exit_code,
            "recipe": self.recipe,
            "size": self.size,
            "sha256": self.sha256,
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
            "checks": self.checks(),
            "findings": [finding.__dict__ for finding in self.findings],
            "model": self.model,
            "load_check": self.load_check,
        }


# --------------------------------------------------------------------------------------------- tensors

_Alternatives = tuple[tuple[str, ...], ...]  # a requirement: any one alternative, all of its kinds


def _need(*kinds: str) -> tuple[_Alternatives, ...]:
    return tuple(((kind,),) for kind in kinds)


_QKV: Final[_Alternatives] = (("ATTN_QKV",), ("ATTN_Q", "ATTN_K", "ATTN_V"))
_GATE_UP_EXPS: Final[_Alternatives] = (("FFN_GATE_UP_EXP",), ("FFN_GATE_EXP", "FFN_UP_EXP"))
_QWEN3_ATTN: Final = (_QKV, *_need("ATTN_OUT", "ATTN_Q_NORM", "ATTN_K_NORM"))
_DENSE_FFN: Final = _need("FFN_GATE", "FFN_DOWN", "FFN_UP")
_SHARED_MOE: Final = (*_need("FFN_GATE_INP", "FFN_DOWN_EXP"), _GATE_UP_EXPS,
                      *_need("FFN_GATE_INP_SHEXP", "FFN_GATE_SHEXP", "FFN_UP_SHEXP", "FFN_DOWN_SHEXP"))  # fmt: skip
_DELTANET: Final = _need("SSM_CONV1D", "SSM_DT", "SSM_A", "SSM_NORM", "SSM_OUT")


@dataclass(frozen=True)
class _ArchRules:
    """Tensors llama.cpp b11312 requires (models/<arch>.cpp), per kind of layer."""

    every: tuple[_Alternatives, ...]
    attention: tuple[_Alternatives, ...] = ()
    recurrent: tuple[_Alternatives, ...] = ()


# Global tensors required everywhere: output is optional (tied embeddings), rope_freqs too.
_GLOBAL_REQUIRED: Final = ("TOKEN_EMBD", "OUTPUT_NORM")
_ARCH_RULES: Final[Mapping[str, _ArchRules]] = {
    "qwen2": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_OUT", "FFN_NORM"), _QKV, *_DENSE_FFN)),
    "qwen3": _ArchRules(every=(*_need("ATTN_NORM", "FFN_NORM"), *_QWEN3_ATTN, *_DENSE_FFN)),
    "qwen3moe": _ArchRules(every=(*_need("ATTN_NORM", "FFN_NORM", "FFN_GATE_INP"), *_QWEN3_ATTN,
                                  *_need("FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP"))),
    "qwen35": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_DENSE_FFN), attention=_QWEN3_ATTN,
                         recurrent=(*_DELTANET, *_need("SSM_BETA", "SSM_ALPHA"))),
    "qwen35moe": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_SHARED_MOE), attention=_QWEN3_ATTN,
                            recurrent=(*_DELTANET, *_need("SSM_BETA", "SSM_ALPHA"))),
    "qwen3next": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_SHARED_MOE), attention=_QWEN3_ATTN,
                            recurrent=(*_DELTANET, *_need("SSM_BETA_ALPHA"),
                                       (("SSM_IN",), ("ATTN_QKV", "ATTN_GATE")))),
    # src/models/gemma2.cpp, gemma3.cpp at b11312: post-norms after attention and FFN (gguf calls blk.N.ffn_norm
    # FFN_PRE_NORM for these archs); gemma3 adds Q/K norms.
    "gemma2": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_OUT", "ATTN_POST_NORM", "FFN_PRE_NORM", "FFN_POST_NORM"),
                                _QKV, *_DENSE_FFN)),
    "gemma3": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_POST_NORM", "FFN_PRE_NORM", "FFN_POST_NORM"),
                                *_QWEN3_ATTN, *_DENSE_FFN)),
}  # fmt: skip
_SUFFIX: Final[Mapping[str, str]] = {"SSM_A": "", "SSM_DT": ".bias"}
_NEXTN: Final = ("NEXTN_EH_PROJ", "NEXTN_EMBED_TOKENS", "NEXTN_ENORM", "NEXTN_HNORM",
                 "NEXTN_SHARED_HEAD_HEAD", "NEXTN_SHARED_HEAD_NORM")  # fmt: skip


def _tensor_name(kind: str, bid: int | None) -> str:
    import gguf

    template = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]])
    return (template.format(bid=bid) if bid is not None else template) + _SUFFIX.get(kind, ".weight")


def check_tensor_set(header: GGUFHeader) -> tuple[list[str], list[str], list[Finding]]:
    """``(missing, unknown, findings)`` for the file's tensors against ``gguf.MODEL_TENSORS`` of its arch.

    Unknown: names no tensor kind of the arch produces (or blocks past ``block_count``). Missing: tensors
    llama.cpp requires, per layer kind (attention or recurrent for hybrid archs); optional ones (``output``
    with tied embeddings, ``rope_freqs``, biases, MTP blocks) never count as missing.
    """
    import gguf

    from llamaforge.models.inspect import layer_kinds

    arch = header.architecture or ""
    model_arch = next((m for m, name in gguf.MODEL_ARCH_NAMES.items() if name == arch), None)
    if model_arch is None:
        return [], [], [Finding("tensors", "fail", "general.architecture",
                                f"architecture {arch!r} is not known to gguf 0.19.0 / llama.cpp")]  # fmt: skip
    kinds = layer_kinds(header)
    templates: dict[str, str] = {}  # "blk.{bid}.attn_q" / "output" -> kind name
    for tensor_kind in [*gguf.MODEL_TENSORS[model_arch], *(gguf.MODEL_TENSOR[k] for k in _NEXTN)]:
        templates[str(gguf.TENSOR_NAMES[tensor_kind])] = tensor_kind.name
    present: dict[int | None, set[str]] = {}
    unknown: list[str] = []
    for tensor in header.tensors:
        found = _classify(tensor.name, templates, len(kinds))
        if found is not None and found[0] in _NEXTN and (found[1] is None or kinds[found[1]] != "mtp"):
            found = None  # nextn.* tensors live in the MTP blocks only
        if found is None:
            unknown.append(tensor.name)
        else:
            present.setdefault(found[1], set()).add(found[0])
    missing = [_tensor_name(kind, None) for kind in _GLOBAL_REQUIRED if kind not in present.get(None, set())]
    rules = _ARCH_RULES.get(arch)
    findings: list[Finding] = []
    if rules is None:
        # Without llama.cpp's per-layer rules (dense/MoE and attention/recurrent patterns vary by arch), a
        # guess would raise false alarms: only names and the global tensors are checked.
        findings.append(Finding("tensors", "ok", arch, f"no per-layer rules for {arch}: checked tensor names "
                                "and the global tensors only"))  # fmt: skip
    else:
        for bid, kind in enumerate(kinds):
            if kind == "mtp":
                continue
            layer_rules = rules.every + (rules.attention if kind == "attention" else rules.recurrent)
            missing += _missing_in_layer(layer_rules, present.get(bid, set()), bid)
    findings += [Finding("tensors", "fail", name, f"unknown tensor {name} for {arch}") for name in unknown]
    findings += [Finding("tensors", "fail", name, f"missing tensor {name}") for name in missing]
    return missing, unknown, findings


def _classify(name: str, templates: Mapping[str, str], n_layer: int) -> tuple[str, int | None] | None:
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    bid = int(match.group(1)) if match else None
    if bid is not None and (bid >= n_layer or match is None or match.group(1) != str(bid)):
        return None
    base = f"blk.{{bid}}.{match.group(2)}" if match else name
    for suffix in ("", ".weight", ".bias"):
        if suffix and not base.endswith(suffix):
            continue
        kind = templates.get(base.removesuffix(suffix) if suffix else base)
        if kind is not None:
            return kind, bid
    return None


def _missing_in_layer(rules: Iterable[_Alternatives], present: set[str], bid: int) -> list[str]:
    missing: list[str] = []
    for alternatives in rules:
        if any(all(kind in present for kind in option) for option in alternatives):
            continue
        closest = max(alternatives, key=lambda option: (sum(k in present for k in option), len(option)))
        missing += [_tensor_name(kind, bid) for kind in closest if kind not in present]
    return missing


# -------------------------------------------------------------------------------------------- structure


def check_structure(header: GGUFHeader) -> list[Finding]:
    """What llama.cpp will refuse beyond the header format: layout, architecture keys, vocabulary rows."""
    from llamaforge.models.inspect import array_length

    findings: list[Finding] = []
    arch = header.architecture
    if arch is None:
        findings.append(
            Finding("structure", "fail", "general.architecture", "general.architecture is missing")
        )
    elif not isinstance(header.metadata.get(f"{arch}.block_count"), int):
        findings.append(Finding("structure", "fail", f"{arch}.block_count", f"{arch}.block_count is missing"))
    if not header.packed:
        findings.append(Finding("structure", "fail", "tensor offsets",
                                "tensor data is not packed in order; llama.cpp b11312 refuses such files"))  # fmt: skip
    trailing = header.file_size - header.data_end
    if trailing >= header.alignment:
        findings.append(Finding("structure", "warn", "file size",
                                f"{trailing} bytes after the last tensor's data"))  # fmt: skip
    n_vocab = array_length(header.metadata.get("tokenizer.ggml.tokens"))
    if n_vocab is None:
        findings.append(Finding("structure", "warn", "tokenizer.ggml.tokens", "no vocabulary in the file"))
    for tensor in header.tensors:
        if tensor.name in ("token_embd.weight", "output.weight") and n_vocab is not None:
            rows = tensor.shape[1] if len(tensor.shape) > 1 else 1
            if rows != n_vocab:
                message = f"{tensor.name} has {rows} rows but the vocabulary {n_vocab} tokens"
                findings.append(Finding("structure", "fail", tensor.name, message))
    return findings


# -------------------------------------------------------------------------------------- chat template

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


# ---------------------------------------------------------------------------------------- expectations


def _normal_file_type(name: str) -> str:
    return name.upper().removeprefix("UD-").removeprefix("MOSTLY_").removeprefix("ALL_")


def check_expectations(
    model: Mapping[str, Any], recipe: ModelRecipe, size: int, sha256: str
) -> list[Finding]:
    """Named mismatches between the file's facts and what ``recipe`` pins and expects."""
    findings: list[Finding] = []

    def mismatch(check: str, subject: str, message: str) -> None:
        findings.append(Finding(check, "fail", subject, message))

    if recipe.sha256 and recipe.sha256 != sha256:
        mismatch("sha256", "sha256", f"sha256 is {sha256}, the recipe pins {recipe.sha256}")
    if recipe.size and recipe.size != size:
        mismatch("expectations", "size", f"size is {size} bytes, the recipe pins {recipe.size}")
    expect = recipe.expect
    if expect.architecture and model["architecture"] != expect.architecture:
        mismatch("expectations", "architecture",
                 f"architecture is {model['architecture']!r}, the recipe expects {expect.architecture!r}")  # fmt: skip
    context = model["context_length"]
    if expect.min_context_length and not (isinstance(context, int) and context >= expect.min_context_length):
        mismatch("expectations", "context_length",
                 f"context_length is {context}, the recipe expects at least {expect.min_context_length}")  # fmt: skip
    if expect.file_type:
        actual = model["file_type"] or model["guessed_file_type"] or "?"
        if _normal_file_type(actual) != _normal_file_type(expect.file_type):
            mismatch(
                "expectations", "file_type", f"file_type is {actual}, the recipe expects {expect.file_type}"
            )
    for key, actual in (("block_count", model["layers"]["block_count"]), ("expert_count", model["expert_count"]),
                        ("expert_used_count", model["expert_used_count"])):  # fmt: skip
        wanted = getattr(expect, key)
        if wanted is not None and actual != wanted:
            mismatch("expectations", key, f"{key} is {actual}, the recipe expects {wanted}")
    if expect.chat_template and not model["chat_template"]["present"]:
        mismatch(
            "expectations", "chat_template", "tokenizer.chat_template is missing, the recipe expects one"
        )
    return findings


# ------------------------------------------------------------------------------------------ sha256, cache


def hash_file(path: Path, size: int, reporter: Reporter, cancel: CancelToken) -> str:
    """sha256 of ``path`` in one streaming pass (OpenSSL's SHA through hashlib, no per-chunk allocation)."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_BUFFER)
    view = memoryview(buffer)
    done = 0
    next_report = 0
    with path.open("rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := handle.readinto(view):
            digest.update(view[:n])
            done += n
            if done >= next_report:
                cancel.raise_if_cancelled()
                reporter(Event("progress", f"sha256 {path.name}", stage="verify", completed=done, total=size))
                next_report = done + (256 << 20)
    return digest.hexdigest()


def _identity(stat: os.stat_result) -> dict[str, int]:
    return {"dev": stat.st_dev, "inode": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_dir() -> Path:
    """Where verdicts are cached."""
    return home() / "verify-cache"


def _cache_path(identity: Mapping[str, int]) -> Path:
    key = "|".join(str(identity[k]) for k in ("dev", "inode", "size", "mtime_ns"))
    version = f"{__version__}/{VERIFY_CACHE_VERSION}"
    return cache_dir() / (hashlib.sha256(f"{version}|{key}".encode()).hexdigest()[:32] + ".json")


def _cache_load(identity: Mapping[str, int]) -> dict[str, Any] | None:
    path = _cache_path(identity)
    try:
        entry: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if entry.get("version") != VERIFY_CACHE_VERSION or entry.get("identity") != dict(identity):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256", ""))):
        return None
    return entry


def _cache_store(identity: Mapping[str, int], sha256: str, analysis: dict[str, Any]) -> None:
    target = _cache_path(identity)
    entry = {
        "version": VERIFY_CACHE_VERSION,
        "identity": dict(identity),
        "sha256": sha256,
        "analysis": analysis,
    }
    write_text_atomic(target, json.dumps(entry, sort_keys=True))


def analyse_header(header: GGUFHeader) -> dict[str, Any]:
    """The recipe-independent verdict on a parsed header: model facts, structure, tensor set, template."""
    from llamaforge.models.inspect import describe

    missing, unknown, tensor_findings = check_tensor_set(header)
    findings = [*check_structure(header), *tensor_findings, *check_templates(header.metadata)]
    model = describe(header)
    model["missing_tensors"] = missing
    model["unknown_tensors"] = unknown
    return {"model": model, "findings": [finding.__dict__ for finding in findings]}


# ------------------------------------------------------------------------------------------- load check


def llama_cli(build: Path) -> Path:
    """The ``llama-cli`` of a build directory (or its ``bin/``), or the binary itself."""
    for candidate in (build, build / "bin" / "llama-cli", build / "llama-cli"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise InvalidOption(
        f"no llama-cli in {build}", hint="pass a build key (`invoke builds.list`) or its directory"
    )


def load_check(
    path: Path,
    build: Path,
    *,
    context: int = 512,
    timeout: float = 600.0,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> dict[str, Any]:
    """Load ``path`` with the build's ``llama-cli`` (one token, ``-fit off``, verbose log) and report the
    buffers llama.cpp allocated, or why it refused the file."""
    from llamaforge.serve.launcher import LlamaFlags, cli_argv
    from llamaforge.serve.loadlog import parse_load_log

    binary = llama_cli(build)
    flags = LlamaFlags(ctx=context, fit="off", warmup=False, verbose=True)
    command = cli_argv(binary, path, flags, prompt="hi", n_predict=1)
    reporter(Event("stage", f"loading {path.name} with {binary}", stage="verify"))
    run = runner.run(command, merge_stderr=True, timeout_s=timeout, cancel=cancel, warn=True)
    lines = run.stdout.splitlines()
    loaded = parse_load_log(lines)
    errors = [line for line in lines if re.search(r"\bE\b.*(error|failed)|error:", line)]
    result: dict[str, Any] = {"buffers_mib": loaded.buffers_mib()}
    for name, cache in (("kv_cache", loaded.kv_cache), ("recurrent_state", loaded.recurrent_state)):
        if cache is not None:
            result[name] = dataclasses.asdict(cache)
    if loaded.model_params is not None:
        result["model_params"] = loaded.model_params
    result.update({"command": command, "returncode": run.exit_code, "context": context,
                   "loaded": run.ok and "weights" in loaded.buffers, "errors": errors[-10:],
                   "tail": lines[-15:] if run.exit_code else []})  # fmt: skip
    return result


# --------------------------------------------------------------------------------------------- verify


def verify_model(
    path: str | os.PathLike[str],
    recipe: ModelRecipe | None = None,
    *,
    load_check_build: Path | None = None,
    use_cache: bool = True,
    reporter: Reporter = null_reporter,
    cancel: CancelToken | None = None,
    runner: ProcessRunner = LOCAL,
) -> VerifyReport:
    """Verify the GGUF at ``path`` (against ``recipe`` when given): header pre-parse, sha256, structure,
    expectations, tensor set, quant histogram, chat template audit and, with ``load_check_build``, a real load.

    A malformed header raises :class:`~llamaforge.gguf.header.GGUFFormatError`; every other problem is a
    failed finding in the report.
    """
    from llamaforge.gguf.header import read_header

    cancel = cancel or CancelToken()
    started = time.monotonic()
    file = Path(path)
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise ModelError(
            f"model file {file} does not exist", hint="check the path, or fetch it first"
        ) from None
    except OSError as error:
        raise ModelError(f"cannot read {file}: {error.strerror}", hint="check the path") from None
    identity = _identity(stat)
    entry = _cache_load(identity) if use_cache else None
    if entry is not None:
        reporter(
            Event("info", f"cached verdict for {file.name} (same inode, size and mtime)", stage="verify")
        )
        sha256, analysis = str(entry["sha256"]), dict(entry["analysis"])
    else:
        reporter(Event("stage", f"checking the header of {file}", stage="verify"))
        analysis = analyse_header(read_header(file))
        cancel.raise_if_cancelled()
        reporter(Event("stage", f"sha256 of {stat.st_size} bytes", stage="verify"))
        sha256 = hash_file(file, stat.st_size, reporter, cancel)
        after = _identity(file.stat())
        if after != identity:
            raise ModelError(
                f"{file} changed while it was being verified", hint="verify it again once it is written"
            )
        if use_cache:
            _cache_store(identity, sha256, analysis)
    findings = [Finding(**item) for item in analysis["findings"]]
    checks_run = {"header", "sha256", "structure", "tensors", "template"}
    if recipe is not None:
        findings += check_expectations(analysis["model"], recipe, stat.st_size, sha256)
        checks_run.add("expectations")
    report = VerifyReport(
        path=str(file), size=stat.st_size, sha256=sha256, model=analysis["model"], findings=findings,
        recipe=recipe.name if recipe else None, cached=entry is not None, checks_run=checks_run,
    )  # fmt: skip
    if load_check_build is not None:
        result = load_check(file, load_check_build, reporter=reporter, cancel=cancel, runner=runner)
        report.load_check = result
        report.checks_run.add("load")
        if not result["loaded"]:
            reason = result["errors"][-1] if result["errors"] else f"exit code {result['returncode']}"
            report.findings.append(
                Finding("load", "fail", "llama-cli", f"llama.cpp did not load the model: {reason}")
            )
    report.seconds = time.monotonic() - started
    return report
