"""The tensor-set check of ``models.verify``: the file's tensors against what llama.cpp b11312 requires of its
architecture (``gguf.MODEL_TENSORS`` for the names, per-layer rules from ``src/models/<arch>.cpp``: attention
and recurrent layers of hybrid models apart)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from llamaforge.models.findings import Finding
from llamaforge.serve.shape import MAX_COUNT  # a larger block_count is the structure check's finding

if TYPE_CHECKING:
    from llamaforge.gguf.header import GGUFHeader
    from llamaforge.models.inspect import LayerKind

_Alternatives = tuple[tuple[str, ...], ...]  # a requirement: any one alternative, all of its kinds


def _need(*kinds: str) -> tuple[_Alternatives, ...]:
    return tuple(((kind,),) for kind in kinds)


_QKV: Final[_Alternatives] = (("ATTN_QKV",), ("ATTN_Q", "ATTN_K", "ATTN_V"))
_GATE_UP_EXPS: Final[_Alternatives] = (("FFN_GATE_UP_EXP",), ("FFN_GATE_EXP", "FFN_UP_EXP"))
_QWEN3_ATTN: Final = (_QKV, *_need("ATTN_OUT", "ATTN_Q_NORM", "ATTN_K_NORM"))
_DENSE_FFN: Final = _need("FFN_GATE", "FFN_DOWN", "FFN_UP")
_SHARED_MOE: Final = (
    *_need("FFN_GATE_INP", "FFN_DOWN_EXP"),
    _GATE_UP_EXPS,
    *_need("FFN_GATE_INP_SHEXP", "FFN_GATE_SHEXP", "FFN_UP_SHEXP", "FFN_DOWN_SHEXP"),
)
_DELTANET: Final = _need("SSM_CONV1D", "SSM_DT", "SSM_A", "SSM_NORM", "SSM_OUT")


@dataclass(frozen=True)
class _ArchRules:
    """Tensors llama.cpp requires (models/<arch>.cpp), per kind of layer."""

    every: tuple[_Alternatives, ...]
    attention: tuple[_Alternatives, ...] = ()
    recurrent: tuple[_Alternatives, ...] = ()


# Global tensors required everywhere: output is optional (tied embeddings), rope_freqs too.
_GLOBAL_REQUIRED: Final = ("TOKEN_EMBD", "OUTPUT_NORM")
_ARCH_RULES: Final[Mapping[str, _ArchRules]] = {
    "qwen2": _ArchRules(every=(*_need("ATTN_NORM", "ATTN_OUT", "FFN_NORM"), _QKV, *_DENSE_FFN)),
    "qwen3": _ArchRules(every=(*_need("ATTN_NORM", "FFN_NORM"), *_QWEN3_ATTN, *_DENSE_FFN)),
    "qwen3moe": _ArchRules(
        every=(
            *_need("ATTN_NORM", "FFN_NORM", "FFN_GATE_INP"),
            *_QWEN3_ATTN,
            *_need("FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP"),
        )
    ),
    "qwen35": _ArchRules(
        every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_DENSE_FFN),
        attention=_QWEN3_ATTN,
        recurrent=(*_DELTANET, *_need("SSM_BETA", "SSM_ALPHA")),
    ),
    "qwen35moe": _ArchRules(
        every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_SHARED_MOE),
        attention=_QWEN3_ATTN,
        recurrent=(*_DELTANET, *_need("SSM_BETA", "SSM_ALPHA")),
    ),
    "qwen3next": _ArchRules(
        every=(*_need("ATTN_NORM", "ATTN_POST_NORM"), *_SHARED_MOE),
        attention=_QWEN3_ATTN,
        recurrent=(*_DELTANET, *_need("SSM_BETA_ALPHA"), (("SSM_IN",), ("ATTN_QKV", "ATTN_GATE"))),
    ),
    # src/models/gemma2.cpp, gemma3.cpp: post-norms after attention and FFN (gguf calls blk.N.ffn_norm
    # FFN_PRE_NORM for these archs); gemma3 adds Q/K norms.
    "gemma2": _ArchRules(
        every=(
            *_need("ATTN_NORM", "ATTN_OUT", "ATTN_POST_NORM", "FFN_PRE_NORM", "FFN_POST_NORM"),
            _QKV,
            *_DENSE_FFN,
        )
    ),
    "gemma3": _ArchRules(
        every=(
            *_need("ATTN_NORM", "ATTN_POST_NORM", "FFN_PRE_NORM", "FFN_POST_NORM"),
            *_QWEN3_ATTN,
            *_DENSE_FFN,
        )
    ),
}
# a tensor kind missing from more blocks than this is one finding naming its blocks, not one per block
_LISTED_BLOCKS: Final = 4
_LISTED_RUNS: Final = 8
_SUFFIX: Final[Mapping[str, str]] = {"SSM_A": "", "SSM_DT": ".bias"}
_NEXTN: Final = (
    "NEXTN_EH_PROJ",
    "NEXTN_EMBED_TOKENS",
    "NEXTN_ENORM",
    "NEXTN_HNORM",
    "NEXTN_SHARED_HEAD_HEAD",
    "NEXTN_SHARED_HEAD_NORM",
)


def _tensor_name(kind: str, bid: int | str | None) -> str:
    import gguf

    template = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]])
    return (template.format(bid=bid) if bid is not None else template) + _SUFFIX.get(kind, ".weight")


def check_tensor_set(header: GGUFHeader) -> tuple[list[str], list[str], list[Finding]]:
    """``(missing, unknown, findings)`` for the file's tensors against ``gguf.MODEL_TENSORS`` of its arch.

    Unknown: names no tensor kind of the arch produces (or blocks past ``block_count``). Missing: tensors
    llama.cpp requires, per layer kind (attention or recurrent for hybrid archs); optional ones (``output``
    with tied embeddings, ``rope_freqs``, biases, MTP blocks) never count as missing. A tensor missing from
    more than a few blocks is one entry naming its blocks (``blk.4..4999.attn_q.weight``), so the findings
    stay small whatever ``block_count`` claims; with a ``block_count`` llama.cpp cannot read (the structure
    check's finding) the blocks are not checked at all.
    """
    import gguf

    from llamaforge.models.inspect import layer_kinds

    arch = header.architecture
    if arch is None:  # the structure check names what the key holds
        reason = "no architecture (general.architecture) to check the tensors against"
        return [], [], [Finding("tensors", "fail", "general.architecture", reason)]
    model_arch = next((m for m, name in gguf.MODEL_ARCH_NAMES.items() if name == arch), None)
    if model_arch is None:
        return (
            [],
            [],
            [
                Finding(
                    "tensors",
                    "fail",
                    "general.architecture",
                    f"architecture {arch!r} is not known to gguf 0.19.0 / llama.cpp",
                )
            ],
        )
    findings: list[Finding] = []
    block_count = header.metadata.get(f"{arch}.block_count")
    readable = block_count is None or _is_count(block_count)
    kinds = layer_kinds(header) if readable else []
    if not readable:
        shown = repr(block_count) if len(repr(block_count)) <= 60 else repr(block_count)[:57] + "..."
        findings.append(
            Finding(
                "tensors",
                "warn",
                f"{arch}.block_count",
                f"per-layer tensors skipped: {arch}.block_count is {shown}, not a count llama.cpp can read "
                "(see the structure check)",
            )
        )
    elif isinstance(block_count, int) and block_count > len(kinds):
        findings.append(
            Finding(
                "tensors",
                "warn",
                f"{arch}.block_count",
                f"blocks {len(kinds)}..{block_count - 1} skipped: {arch}.block_count is {block_count}, more "
                f"blocks than are checked ({len(kinds)})",
            )
        )
    templates: dict[str, str] = {}  # "blk.{bid}.attn_q" / "output" -> kind name
    for tensor_kind in [*gguf.MODEL_TENSORS[model_arch], *(gguf.MODEL_TENSOR[k] for k in _NEXTN)]:
        templates[str(gguf.TENSOR_NAMES[tensor_kind])] = tensor_kind.name
    # without a count to hold them to, block tensors are checked by name only
    n_layer = len(kinds) if readable else MAX_COUNT + 1
    present: dict[int | None, set[str]] = {}
    unknown: list[str] = []
    for tensor in header.tensors:
        found = _classify(tensor.name, templates, n_layer)
        in_mtp = (
            found is not None and found[1] is not None and found[1] < len(kinds) and kinds[found[1]] == "mtp"
        )
        if found is not None and found[0] in _NEXTN and not in_mtp:
            found = None  # nextn.* tensors live in the MTP blocks only
        if found is None:
            unknown.append(tensor.name)
        else:
            present.setdefault(found[1], set()).add(found[0])
    missing = [_tensor_name(kind, None) for kind in _GLOBAL_REQUIRED if kind not in present.get(None, set())]
    missing_findings = [Finding("tensors", "fail", name, f"missing tensor {name}") for name in missing]
    rules = _ARCH_RULES.get(arch)
    if rules is None:
        # Without llama.cpp's per-layer rules (dense/MoE and attention/recurrent patterns vary by arch), a
        # guess would raise false alarms: only names and the global tensors are checked.
        findings.append(
            Finding(
                "tensors",
                "ok",
                arch,
                f"no per-layer rules for {arch}: checked tensor names and the global tensors only",
            )
        )
    else:
        for name, finding in _missing_in_layers(rules, kinds, present):
            missing.append(name)
            missing_findings.append(finding)
    findings += [Finding("tensors", "fail", name, f"unknown tensor {name} for {arch}") for name in unknown]
    findings += missing_findings
    return missing, unknown, findings


def _is_count(value: object) -> bool:
    """True for a block count llama.cpp reads (into a 32-bit field), as the structure check holds it."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


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


def _missing_in_layers(
    rules: _ArchRules, kinds: list[LayerKind], present: Mapping[int | None, set[str]]
) -> list[tuple[str, Finding]]:
    """``(name, finding)`` per missing block tensor, in block order; a tensor kind missing from more than
    ``_LISTED_BLOCKS`` blocks is one entry naming its blocks."""
    blocks: dict[str, list[int]] = {}  # tensor kind -> the blocks missing it, ascending
    order: dict[str, tuple[int, int]] = {}  # tensor kind -> (first block, position there): the listing order
    lacking_by_layer: dict[tuple[str, frozenset[str]], list[str]] = {}
    for bid, kind in enumerate(kinds):
        if kind == "mtp":
            continue
        have = present.get(bid, set())
        key = (kind, frozenset(have))
        lacking = lacking_by_layer.get(key)
        if lacking is None:  # blocks of one kind with the same tensors lack the same ones: decided once
            layer_rules = rules.every + (rules.attention if kind == "attention" else rules.recurrent)
            lacking = lacking_by_layer[key] = _missing_in_layer(layer_rules, have)
        for position, tensor_kind in enumerate(lacking):
            blocks.setdefault(tensor_kind, []).append(bid)
            order.setdefault(tensor_kind, (bid, position))
    entries: list[tuple[tuple[int, int], str, Finding]] = []
    for tensor_kind, bids in blocks.items():
        if len(bids) <= _LISTED_BLOCKS:
            for bid in bids:
                name = _tensor_name(tensor_kind, bid)
                where = (bid, order[tensor_kind][1])
                entries.append((where, name, Finding("tensors", "fail", name, f"missing tensor {name}")))
            continue
        runs = _runs(bids)
        if len(runs) == 1:
            name = _tensor_name(tensor_kind, f"{bids[0]}..{bids[-1]}")
            message = f"missing tensor {name} ({len(bids)} blocks)"
        else:
            name = _tensor_name(tensor_kind, "*")
            shown = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs[:_LISTED_RUNS])
            more = f" and {len(runs) - _LISTED_RUNS} more" if len(runs) > _LISTED_RUNS else ""
            message = f"missing tensor {name} in {len(bids)} blocks of {bids[0]}..{bids[-1]}: {shown}{more}"
        entries.append((order[tensor_kind], name, Finding("tensors", "fail", name, message)))
    entries.sort(key=lambda entry: entry[0])
    return [(name, finding) for _, name, finding in entries]


def _runs(bids: list[int]) -> list[tuple[int, int]]:
    """Ascending ``bids`` as ``(first, last)`` runs of consecutive blocks."""
    runs: list[tuple[int, int]] = []
    for bid in bids:
        if runs and runs[-1][1] == bid - 1:
            runs[-1] = (runs[-1][0], bid)
        else:
            runs.append((bid, bid))
    return runs


def _missing_in_layer(rules: Iterable[_Alternatives], present: set[str]) -> list[str]:
    """The tensor kinds one layer lacks: of each requirement unmet, the kinds of its closest alternative."""
    missing: list[str] = []
    for alternatives in rules:
        if any(all(kind in present for kind in option) for option in alternatives):
            continue
        closest = max(alternatives, key=lambda option: (sum(k in present for k in option), len(option)))
        missing += [kind for kind in closest if kind not in present]
    return missing
