"""Helpers shared by tests: run the real Invoke front, make archives and recipes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import mcp_types

REPO = Path(__file__).resolve().parents[1]
MINI = Path(__file__).parent / "data" / "mini-project"
GOLDEN = Path(__file__).parent / "golden"
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def invoke(
    *args: str, env: dict[str, str] | None = None, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Run ``invoke ARGS`` from the repository root (the user's entry point)."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def invoke_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``invoke ARGS --json`` and parse stdout; fails with stderr shown on a non-zero exit."""
    result = invoke(*args, "--json", env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def make_archive(source_dir: Path, archive: Path, prefix: str = "mini") -> str:
    """tar.gz ``source_dir`` under ``prefix/``; returns its sha256."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source_dir, arcname=prefix)
    return hashlib.sha256(archive.read_bytes()).hexdigest()


def mini_recipe(tmp_path: Path, targets: list[str], name: str = "mini") -> Path:
    """A build recipe for the tiny stand-in project, as a TOML file."""
    archive = tmp_path / "mini.tar.gz"
    sha = make_archive(MINI, archive)
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""description = "stand-in project for executor tests"
targets = {json.dumps(targets)}
patches = "{tmp_path / "no-series"}"

[source]
kind = "archive"
url = "{archive}"
sha256 = "{sha}"
subdir = "mini"
commit = "{COMMIT}"
build_number = 11312
date = 2026-10-01

[cmake]
CMAKE_BUILD_TYPE = "Release"

[images.cpu]
tag = "llamaforge/debian:bookworm"
""",
        encoding="utf-8",
    )
    (tmp_path / "no-series").mkdir(exist_ok=True)
    (tmp_path / "no-series" / "series").write_text("# no patches\n", encoding="utf-8")
    return path


def write_mini_vocab(path: Path, n_tokens: int = 300, chat_template: str | None = None) -> Path:
    """A tokenizer-only GGUF shaped like llama.cpp's ggml-vocab-*.gguf, small enough to parse in milliseconds
    (the real qwen2 vocabulary has 151 936 tokens)."""
    import gguf

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("mini")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"tok{i}" for i in range(n_tokens)])
    writer.add_token_types([1] * n_tokens)
    writer.add_token_merges(["t o", "to k"])
    writer.add_eos_token_id(n_tokens - 1)
    writer.add_bos_token_id(n_tokens - 1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def marked_containers(client: Any, jobs: int) -> set[str]:
    """Ids of the llamaforge containers (running or not) of builds run with ``jobs`` compile jobs.

    Other processes on this machine may build at the same time: a test passes a distinctive ``jobs`` count
    and looks only at containers whose environment carries it.
    """
    owned = client.containers.list(all=True, filters={"label": "org.llamaforge.owned"})
    return {c.id for c in owned if f"LLAMAFORGE_JOBS={jobs}" in (c.attrs.get("Config", {}).get("Env") or [])}


def check_golden(name: str, text: str) -> None:
    """``text`` equals tests/golden/NAME (LLAMAFORGE_UPDATE_GOLDEN=1 rewrites the file instead)."""
    path = GOLDEN / name
    if os.environ.get("LLAMAFORGE_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, f"{name} drifted; rerun with LLAMAFORGE_UPDATE_GOLDEN=1"


def stub_gguf(path: Path, arch: str = "qwen3") -> Path:
    """A small well-formed GGUF with one zero tensor: it passes the --model checks. llama.cpp cannot serve it, and
    with an architecture it does not know (``unloadable_model``) llama-server exits while loading it."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def unloadable_model(path: Path) -> Path:
    """A well-formed GGUF of an architecture llama.cpp does not know: llama-server exits while loading it."""
    return stub_gguf(path, "no-such-arch")


UD2 = b"\x0f\x0b"  # x86's "undefined instruction": the CPU raises SIGILL on it


def symbol_offset(data: bytes, name: str) -> int:
    """The file offset of the dynamic symbol ``name`` of a little-endian ELF64 shared object."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a little-endian ELF64 file"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + index * shentsize) for index in range(shnum)]
    dynsym = next(section for section in sections if section[1] == 11)  # SHT_DYNSYM
    strings = sections[dynsym[6]][4]  # the offset of its string table (sh_link)
    for entry in range(dynsym[4], dynsym[4] + dynsym[5], dynsym[9]):
        name_at, _info, _other, _section, value, _size = struct.unpack_from("<IBBHQQ", data, entry)
        start = strings + name_at
        if value and data[start : data.index(b"\0", start)] == name.encode():
            for index in range(phnum):
                kind, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from(
                    "<IIQQQQQQ", data, phoff + index * phentsize
                )
                if kind == 1 and vaddr <= value < vaddr + filesz:  # PT_LOAD
                    return int(value - vaddr + offset)
    raise LookupError(name)


def copy_build(source: Path, home: Path, label: str) -> tuple[str, Path]:
    """A copy of the build ``source`` in ``home``'s build store under a key of its own; its key and directory."""
    manifest = json.loads((source / "manifest.json").read_text(encoding="utf-8"))
    key = f"{label}{manifest['key']}"[:32]
    directory = home / "builds" / key
    shutil.copytree(source, directory, symlinks=True)
    (directory / "manifest.json").write_text(json.dumps({**manifest, "key": key}), encoding="utf-8")
    return key, directory


def sigill_copy(source: Path, home: Path) -> tuple[str, Path]:
    """A copy of the build ``source`` (:func:`copy_build`) whose every CPU module runs ``ud2`` at the start of
    ``ggml_graph_compute``: llama.cpp loads the module and the model, and the CPU raises SIGILL on the first
    graph, as the AMX tiles did. Its key and directory."""
    key, directory = copy_build(source, home, "sigill")
    modules = sorted((directory / "bin").glob("libggml-cpu-*.so"))
    assert modules, "the build has no CPU backend modules"
    for module in modules:
        data = bytearray(module.read_bytes())
        at = symbol_offset(bytes(data), "ggml_graph_compute")
        data[at : at + len(UD2)] = UD2
        module.write_bytes(bytes(data))
    return key, directory


def error_text(result: mcp_types.CallToolResult) -> str:
    """The text of an MCP tool call that failed (an assertion error when it did not)."""
    assert result.is_error, result.structured_content
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


def cpu_header(cpuinfo: str) -> str:
    """The suite's header line about this machine's CPU: model, cores, AMX or not, ggml's feature names."""
    from llamaforge.smoke.cpu_features import host_cpu

    model, features = host_cpu(cpuinfo)
    amx = "AMX" if "AMX_INT8" in features else "no AMX"
    return f"cpu: {model}, {os.cpu_count()} cores, {amx}; features: {' '.join(features) or 'none known'}"
