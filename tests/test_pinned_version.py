"""The llama.cpp version is named from the build recipe, never written into the code.

Messages and decisions take it from :func:`llamaforge.build.recipes.pinned_llama_cpp`, which reads the default
recipe's pin. The only llama.cpp build tags (``bNNNN``) left in the source are the comment lines below, each
naming the upstream release whose code a formula, table or check was read from: a historical fact of that
code, true whatever the recipe pins later. Each module that follows upstream code says so once.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from llamaforge.build.recipes import pinned_llama_cpp
from llamaforge.core.errors import SmokeFailed
from llamaforge.smoke.bench import parse_llama_bench

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("src", "mcp_server", "templates")
BUILD_TAG = re.compile(r"\bb\d{4,6}\b")

# A fragment of each allowed line (kept free of the tag and of the file's path, so a moved file keeps its
# entry), and the upstream code the line says was followed.
ALLOWED = {
    "``ssm.*`` keys follow llama.cpp": "tiny qwen35 models: tensor set and keys of src/models/qwen35*.cpp",
    "with MLA (multi-head latent attention) for llama.cpp": "tiny DeepSeek-V2: the layout deepseek2.cpp loads",
    "reuse earlier layers' KV cache, for llama.cpp": "tiny Gemma 4: KV sharing as src/models/gemma4.cpp",
    "The checks follow llama.cpp": "the GGUF header checks follow gguf_init_from_reader",
    "the RPC server's target and binary at": "the RPC server's target name in tools/rpc",
    "keeps a CPU-resident weight": "CPU buffer placement and size reporting of the loader",
    "places and sizes its buffers); the planner": "the fit planner follows the loader's placement",
    "sliding-window attention layers in llama.cpp": "SWA patterns of load_swa_pattern and src/models/*.cpp",
    "puts the devices in this order": "device order of llama_model_load_from_file_impl",
    "``common_params_fit_impl``": "the --fit log lines parsed come from common_params_fit_impl",
    "The KV cache types llama.cpp": "the -ctk/-ctv types llama-server accepts",
    "(``ggml/src/ggml-alloc.c``,": "the compute-buffer replay follows ggml-alloc's allocator",
    "How much memory llama.cpp": "the memory model follows the loader's buffers",
    "largest shipped template": "the chat-template audit's limits are sized from upstream's templates",
    "the file's tensors against what llama.cpp": "required tensors per arch from src/models/<arch>.cpp",
    "each tensor's dimensions against the ones llama.cpp": "tensor shapes per arch from src/models/<arch>.cpp",
    "(ggml/src/ggml-backend-reg.cpp,": "CPU module isolation follows ggml_backend_load_best",
    "(ggml/src/CMakeLists.txt,": "the features of each CPU variant ggml builds",
    "(field names as in tools/server at": "llama-server's /completion field names",
}


def _tagged_lines() -> list[tuple[str, str]]:
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if BUILD_TAG.search(line):
                    found.append((f"{path.relative_to(REPO)}:{number}", line))
    return found


def test_only_the_listed_comments_name_a_llama_cpp_build() -> None:
    unlisted = [f"{where}: {line.strip()}" for where, line in _tagged_lines() if not _entries(line)]
    assert unlisted == [], (
        "name the llama.cpp version with llamaforge.build.recipes.pinned_llama_cpp(), not a literal "
        f"(or, for a comment that cites the upstream code a formula follows, list it in ALLOWED): {unlisted}"
    )


def test_each_listed_comment_is_one_line_and_still_there() -> None:
    lines = [line for _where, line in _tagged_lines()]
    for fragment in ALLOWED:
        assert sum(fragment in line for line in lines) == 1, (
            f"ALLOWED entry matches no line or several: {fragment}"
        )


def test_the_listed_comments_cite_the_pinned_release() -> None:
    """When the recipe's pin moves, these comments name the old release: re-read the upstream code each cites
    against the new one, then update the comment (and the formula, if upstream changed)."""
    tags = {match for _where, line in _tagged_lines() for match in BUILD_TAG.findall(line)}
    assert tags == {pinned_llama_cpp()}, tags


def test_the_version_comes_from_the_default_recipe() -> None:
    recipe = tomllib.loads((REPO / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8"))
    assert pinned_llama_cpp() == f"b{recipe['source']['build_number']}"
    assert pinned_llama_cpp("default") == pinned_llama_cpp("github")


def test_a_recipe_that_cannot_be_read_still_gives_words() -> None:
    assert pinned_llama_cpp("no-such-recipe") == "the pinned llama.cpp"


def _entries(line: str) -> list[str]:
    return [fragment for fragment in ALLOWED if fragment in line]


def test_a_message_names_the_recipes_version() -> None:
    with pytest.raises(SmokeFailed) as failure:
        parse_llama_bench('[{"build_commit": "abc"}]')
    assert f"formats llamaforge knows ({pinned_llama_cpp()})" in (failure.value.hint or "")
