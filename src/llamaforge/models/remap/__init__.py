"""``models.remap``: rewrite a GGUF file's tensor names and metadata, streamed and verified.

:mod:`~llamaforge.models.remap.rewrite` plans, streams and verifies the rewrite; :mod:`~llamaforge.models.remap.names`
maps tensor names, :mod:`~llamaforge.models.remap.metadata` applies the metadata edits of a rules file and
:mod:`~llamaforge.models.remap.rules` reads and checks those files (``recipes/remaps/*.toml``). The name table
shared with the llama.cpp patch stays :mod:`llamaforge.models.remap_table`: its module path is written into
``patches/llama.cpp/0001-qwen3-tensor-name-remap.patch``, whose bytes key every build.
"""

from __future__ import annotations

from llamaforge.models.remap.rewrite import (
    MatchRules,
    MetadataRules,
    RemapResult,
    RemapRules,
    TypedValue,
    list_rules,
    load_rules,
    parse_rules,
    remap_gguf,
    rules_dir,
)

__all__ = [
    "MatchRules",
    "MetadataRules",
    "RemapResult",
    "RemapRules",
    "TypedValue",
    "list_rules",
    "load_rules",
    "parse_rules",
    "remap_gguf",
    "rules_dir",
]
