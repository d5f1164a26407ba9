"""``models.verify``: is this GGUF intact, what its recipe promises, and loadable?

Order matters: the hardened header pre-parse (:mod:`llamaforge.gguf.header`) runs first, so nothing
unchecked reaches any other reader; then one streaming sha256 pass, the structure (layout, vocabulary rows),
the recipe's expectations, the tensor set of the architecture, the quantisation histogram and a static audit
of the chat template; optionally a real load with a built llama.cpp. The recipe-independent part of the
verdict is cached under ``<home>/verify-cache`` keyed on the file's (device, inode, size, mtime_ns, ctime_ns)
and on the code that made it (:func:`analysis_digest`), with its sha256 stored, so a cache hit neither re-parses
nor re-hashes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from llamaforge.build.recipes import pinned_llama_cpp
from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.exits import crash_hint, crash_words, describe_exit, exit_signal, loaded_cpu_module
from llamaforge.core.guard import refuse_if_read_only
from llamaforge.core.paths import home, read_json_object, write_text_atomic
from llamaforge.core.version import __version__
from llamaforge.models.chat_template import check_templates
from llamaforge.models.findings import Finding, Status
from llamaforge.models.tensor_set import check_tensor_set
from llamaforge.models.tensor_shapes import check_tensor_shapes
from llamaforge.runners.process import LOCAL, ProcessRunner

# The readers are imported by the checks that use them.
if TYPE_CHECKING:
    from llamaforge.gguf.header import GGUFHeader
    from llamaforge.models.recipes import ModelRecipe

CHECKS: Final = ("header", "sha256", "structure", "tensors", "expectations", "template", "load")
# Bump when the cache entry's format changes.
VERIFY_CACHE_VERSION: Final = 4
# The modules whose code makes the cached verdict: an entry made by other code (an upgrade, a fix, a new check)
# is not trusted, whatever the version number says, and neither is one made with other gguf tensor tables.
ANALYSIS_MODULES: Final = (
    "llamaforge.gguf.header",
    "llamaforge.models.chat_template",
    "llamaforge.models.file_types",
    "llamaforge.models.inspect",
    "llamaforge.models.tensor_set",
    "llamaforge.models.tensor_shapes",
    "llamaforge.models.verify",
    "llamaforge.serve.shape",
)
_HASH_BUFFER: Final = 8 << 20


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


# -------------------------------------------------------------------------------------------- structure


def check_structure(header: GGUFHeader) -> list[Finding]:
    """What llama.cpp will refuse beyond the header format: layout, architecture keys, vocabulary rows."""
    from llamaforge.models.inspect import array_length

    findings: list[Finding] = []
    arch = header.architecture
    if arch is None:
        given = header.metadata.get("general.architecture")
        message = (
            "general.architecture is missing"
            if given is None
            else f"general.architecture is {repr(given)[:60]}, not a string naming an architecture"
        )
        findings.append(Finding("structure", "fail", "general.architecture", message))
    elif not isinstance(header.metadata.get(f"{arch}.block_count"), int):
        findings.append(Finding("structure", "fail", f"{arch}.block_count", f"{arch}.block_count is missing"))
    if not header.packed:
        findings.append(
            Finding(
                "structure",
                "fail",
                "tensor offsets",
                f"tensor data is not packed in order; llama.cpp {pinned_llama_cpp()} refuses such files",
            )
        )
    trailing = header.file_size - header.data_end
    if trailing >= header.alignment:
        findings.append(
            Finding("structure", "warn", "file size", f"{trailing} bytes after the last tensor's data")
        )
    n_vocab = array_length(header.metadata.get("tokenizer.ggml.tokens"))
    if n_vocab is None:
        findings.append(Finding("structure", "warn", "tokenizer.ggml.tokens", "no vocabulary in the file"))
    n_embd = _hyper_parameters(header, findings)
    for tensor in header.tensors:
        if tensor.name in ("token_embd.weight", "output.weight") and n_vocab is not None:
            rows = tensor.shape[1] if len(tensor.shape) > 1 else 1
            if rows != n_vocab:
                message = f"{tensor.name} has {rows} rows but the vocabulary {n_vocab} tokens"
                findings.append(Finding("structure", "fail", tensor.name, message))
        embedding = tensor.name in ("token_embd.weight", "output.weight")
        if embedding and n_embd and tensor.shape and tensor.shape[0] != n_embd:
            message = (
                f"{tensor.name} rows are {tensor.shape[0]} wide, but {arch}.embedding_length is {n_embd}"
            )
            findings.append(Finding("structure", "fail", tensor.name, message))
    return findings


def _hyper_parameters(header: GGUFHeader, findings: list[Finding]) -> int | None:
    """The width of the model (embedding_length) when its hyper-parameters are counts llama.cpp can read, as
    the planner reads them; a fail finding naming the key when not. A file without tensors (a vocabulary) has
    none to check."""
    from llamaforge.serve.shape import MissingHyperParameters, model_shape

    arch = header.architecture
    if not header.tensors or arch is None:
        return None
    try:
        return model_shape(header).n_embd
    except MissingHyperParameters:
        # absent keys are the architecture's business (mamba has no heads); 0 is damage
        keys = (f"{arch}.{name}" for name in ("block_count", "embedding_length", "attention.head_count"))
        if zero := [key for key in keys if header.metadata.get(key) == 0]:
            findings.append(
                Finding("structure", "fail", f"{arch} hyper-parameters", f"{', '.join(zero)} is 0")
            )
        return None
    except InvalidOption as error:
        subject = f"{header.architecture} hyper-parameters"
        findings.append(
            Finding("structure", "fail", subject, error.message.removeprefix(f"{header.source}: "))
        )
        return None


# ---------------------------------------------------------------------------------------- expectations


def check_expectations(
    model: Mapping[str, Any], recipe: ModelRecipe, size: int, sha256: str
) -> list[Finding]:
    """Named mismatches between the file's facts and what ``recipe`` pins and expects."""
    from llamaforge.models.file_types import normal_file_type

    findings: list[Finding] = []

    def mismatch(check: str, subject: str, message: str) -> None:
        findings.append(Finding(check, "fail", subject, message))

    if recipe.sha256 and recipe.sha256 != sha256:
        mismatch("sha256", "sha256", f"sha256 is {sha256}, the recipe pins {recipe.sha256}")
    if recipe.size and recipe.size != size:
        mismatch("expectations", "size", f"size is {size} bytes, the recipe pins {recipe.size}")
    expect = recipe.expect
    if expect.architecture and model["architecture"] != expect.architecture:
        mismatch(
            "expectations",
            "architecture",
            f"architecture is {model['architecture']!r}, the recipe expects {expect.architecture!r}",
        )
    context = model["context_length"]
    if expect.min_context_length and not (isinstance(context, int) and context >= expect.min_context_length):
        mismatch(
            "expectations",
            "context_length",
            f"context_length is {context}, the recipe expects at least {expect.min_context_length}",
        )
    if expect.file_type:
        actual = model["file_type"] or model["guessed_file_type"] or "?"
        if normal_file_type(actual) != normal_file_type(expect.file_type):
            mismatch(
                "expectations", "file_type", f"file_type is {actual}, the recipe expects {expect.file_type}"
            )
    for key, actual in (
        ("block_count", model["layers"]["block_count"]),
        ("expert_count", model["expert_count"]),
        ("expert_used_count", model["expert_used_count"]),
    ):
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
            if done >= next_report or done == size:
                cancel.raise_if_cancelled()
                reporter(
                    Event(
                        "progress",
                        f"sha256 {path.name}",
                        stage="verify",
                        completed=done,
                        total=size,
                        unit="bytes",
                    )
                )
                next_report = done + (256 << 20)
    return digest.hexdigest()


def _identity(stat: os.stat_result) -> dict[str, int]:
    # ctime too: a file rewritten in place with its mtime put back (os.utime) changes it, and no user can set it
    return {
        "dev": stat.st_dev,
        "inode": stat.st_ino,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }


def cache_dir() -> Path:
    """Where verdicts are cached."""
    return home() / "verify-cache"


@functools.cache
def analysis_digest(modules: tuple[str, ...] = ANALYSIS_MODULES) -> str:
    """A digest of the code that makes a verdict (``modules``' source, the gguf package's version, llamaforge's
    version and the cache format): part of every cache entry's name."""
    digest = hashlib.sha256(f"{__version__}/{VERIFY_CACHE_VERSION}/gguf {package_version('gguf')}".encode())
    for name in modules:
        source = importlib.util.find_spec(name)
        origin = source.origin if source is not None else None
        digest.update(name.encode() + (Path(origin).read_bytes() if origin else b"-"))
    return digest.hexdigest()[:16]


def _cache_path(identity: Mapping[str, int]) -> Path:
    key = "|".join(str(identity[k]) for k in ("dev", "inode", "size", "mtime_ns", "ctime_ns"))
    version = analysis_digest()
    return cache_dir() / (hashlib.sha256(f"{version}|{key}".encode()).hexdigest()[:32] + ".json")


def _cache_load(identity: Mapping[str, int]) -> dict[str, Any] | None:
    entry = read_json_object(_cache_path(identity))
    return entry if entry is not None and _is_entry(entry, identity) else None


def _is_entry(entry: object, identity: Mapping[str, int]) -> bool:
    """True for a cache entry of this format, of the file ``identity`` names, whole (a damaged one is a miss)."""
    if not isinstance(entry, dict):
        return False
    if entry.get("version") != VERIFY_CACHE_VERSION or entry.get("identity") != dict(identity):
        return False
    if not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256", ""))):
        return False
    analysis = entry.get("analysis")
    if not (isinstance(analysis, dict) and isinstance(analysis.get("model"), dict)):
        return False
    findings = analysis.get("findings")
    return isinstance(findings, list) and all(_is_finding(item) for item in findings)


def _is_finding(item: object) -> bool:
    """True for a cached finding :class:`Finding` can be made of again."""
    fields = {field.name for field in dataclasses.fields(Finding)}
    return isinstance(item, dict) and set(item) == fields and all(isinstance(v, str) for v in item.values())


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
    from llamaforge.models.inspect import describe, layer_kinds

    if header.tensors:
        missing, unknown, tensor_findings = check_tensor_set(header)
        tensor_findings += check_tensor_shapes(header, layer_kinds(header))
    else:  # one finding, not one "missing tensor" per tensor the architecture needs
        missing, unknown = [], []
        tensor_findings = [
            Finding(
                "tensors",
                "fail",
                "tensors",
                "vocab-only: no tensors (a vocabulary file: llama.cpp cannot load it as a model)",
            )
        ]
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
    refuse_if_read_only(f"run {binary} to load the model (load_check)")
    flags = LlamaFlags(ctx=context, fit="off", warmup=False, verbose=True)
    command = cli_argv(binary, path, flags, prompt="hi", n_predict=1)
    reporter(Event("stage", f"loading {path.name} with {binary}", stage="verify"))
    run = runner.run(command, merge_stderr=True, timeout_s=timeout, cancel=cancel, warn=True)
    lines = run.stdout.splitlines()
    loaded = parse_load_log(lines)
    errors = [line for line in lines if re.search(r"\bE\b.*(error|failed)|error:", line)]
    # llama.cpp's own reason comes first ("error loading model: check_tensor_dims: tensor … has wrong shape"),
    # the lines after it only say that loading stopped
    cause = next(
        (found.group(1) for line in lines if (found := re.search(r"error loading model: (.+)", line))), None
    )
    result: dict[str, Any] = {"buffers_mib": loaded.buffers_mib()}
    for name, cache in (("kv_cache", loaded.kv_cache), ("recurrent_state", loaded.recurrent_state)):
        if cache is not None:
            result[name] = dataclasses.asdict(cache)
    if loaded.model_params is not None:
        result["model_params"] = loaded.model_params
    result.update(
        {
            "command": command,
            "returncode": run.exit_code,
            "context": context,
            "loaded": run.ok and "weights" in loaded.buffers,
            "errors": errors[-10:],
            "cause": cause,
            "tail": lines[-15:] if run.exit_code else [],
        }
    )
    result.update(_ending(run.exit_code, lines))
    return result


def _ending(code: int, lines: list[str]) -> dict[str, Any]:
    """How llama-cli ended (``exit``) and the CPU module it ran (``cpu_module``); for a crash, ``crash`` says it
    in words and ``hint`` what to try."""
    module = loaded_cpu_module(lines)
    ending: dict[str, Any] = {"exit": describe_exit(code), "cpu_module": module}
    sig = exit_signal(code)
    if sig is not None:
        ending.update({"crash": crash_words("llama-cli", sig, module), "hint": crash_hint(sig, module)})
    return ending


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
        path=str(file),
        size=stat.st_size,
        sha256=sha256,
        model=analysis["model"],
        findings=findings,
        recipe=recipe.name if recipe else None,
        cached=entry is not None,
        checks_run=checks_run,
    )
    if load_check_build is not None:
        result = load_check(file, load_check_build, reporter=reporter, cancel=cancel, runner=runner)
        report.load_check = result
        report.checks_run.add("load")
        if not result["loaded"]:
            if "crash" in result:  # a crash is the reason, whatever llama.cpp logged before it
                reason = f"{result['crash']}; {result['hint']}"
            else:
                reason = result["cause"] or (result["errors"][-1] if result["errors"] else result["exit"])
            report.findings.append(
                Finding("load", "fail", "llama-cli", f"llama.cpp did not load the model: {reason}")
            )
    report.seconds = time.monotonic() - started
    return report
