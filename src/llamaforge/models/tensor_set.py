"""The tensor-set check of ``models.verify``: the file's tensors against what llama.cpp b11312 requires of its
architecture (``gguf.MODEL_TENSORS`` for the names, per-layer rules from ``src/models/<arch>.cpp``: attention
and recurrent layers of hybrid models apart)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from llamaforge.models.findings import Finding

if TYPE_CHECKING:
    from llamaforge.gguf.header import GGUFHeader

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
_SUFFIX: Final[Mapping[str, str]] = {"SSM_A": "", "SSM_DT": ".bias"}
_NEXTN: Final = (
    "NEXTN_EH_PROJ",
    "NEXTN_EMBED_TOKENS",
    "NEXTN_ENORM",
    "NEXTN_HNORM",
    "NEXTN_SHARED_HEAD_HEAD",
    "NEXTN_SHARED_HEAD_NORM",
)


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
        findings.append(
            Finding(
                "tensors",
                "ok",
                arch,
                f"no per-layer rules for {arch}: checked tensor names and the global tensors only",
            )
        )
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
