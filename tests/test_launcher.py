"""The one llama.cpp argv builder and load-log parser (the launcher runs llama-server in test_smoke and test_fit)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llamaforge.serve.fit import DeviceMemory
from llamaforge.serve.launcher import FIELD_FLAGS, HOST, SERVER_FLAGS, LlamaFlags, cli_argv, server_argv
from llamaforge.serve.loadlog import BUFFER_KINDS, parse_load_log

pytestmark = pytest.mark.quick

MiB = 1 << 20


def test_flags_leave_llamacpp_defaults_alone() -> None:
    assert LlamaFlags().args() == []
    flags = LlamaFlags(
        n_gpu_layers=99,
        n_cpu_moe=2,
        ctx=8192,
        parallel=2,
        cache_type_k="q8_0",
        cache_type_v="q8_0",
        flash_attn="on",
        ubatch=256,
        batch=2048,
        threads=4,
        threads_batch=8,
        fit="off",
        warmup=False,
        kv_unified=False,
        log_verbosity=4,
        verbose=True,
    )
    assert flags.args() == [
        "-ngl",
        "99",
        "--n-cpu-moe",
        "2",
        "-c",
        "8192",
        "--parallel",
        "2",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "-ub",
        "256",
        "-b",
        "2048",
        "-t",
        "4",
        "-tb",
        "8",
        "-fit",
        "off",
        "-lv",
        "4",
        "--no-warmup",
        "--no-kv-unified",
        "-v",
    ]
    assert LlamaFlags(kv_unified=True).args() == ["--kv-unified"]


def test_each_field_writes_the_flag_the_table_names_and_extra_flags_come_last() -> None:
    """FIELD_FLAGS is what --server-args checks against: the flags llamaforge writes itself."""
    changed = {
        "warmup": False,
        "kv_unified": True,
        "swa_full": True,
        "repack": False,
        "verbose": True,
        "rpc": ("10.0.0.2:50052",),
        "tensor_split": (1.0, 1.0),
        "flash_attn": "on",
        "fit": "off",
    }
    for field in dataclasses.fields(LlamaFlags):
        if field.name == "extra":
            continue
        args = LlamaFlags(**{field.name: changed.get(field.name, 1)}).args()
        assert args[0] == FIELD_FLAGS[field.name], field.name
    assert set(FIELD_FLAGS) == {field.name for field in dataclasses.fields(LlamaFlags)} - {"extra"}
    flags = LlamaFlags(ctx=512, repack=False, extra=("--jinja", "--alias", "a b"))
    assert flags.args() == ["-c", "512", "--no-repack", "--jinja", "--alias", "a b"]
    argv = server_argv(Path("/b/llama-server"), Path("/m.gguf"), flags, port=1)
    assert [part for part in argv if part.startswith("-")][: len(SERVER_FLAGS)] == list(SERVER_FLAGS)


def test_server_listens_on_loopback_by_default() -> None:
    argv = server_argv(Path("/b/llama-server"), Path("/m.gguf"), LlamaFlags(ctx=512), port=8080)
    assert argv == [
        "/b/llama-server",
        "-m",
        "/m.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--no-webui",
        "-c",
        "512",
    ]
    assert HOST == "127.0.0.1"
    assert server_argv(Path("s"), Path("m"), LlamaFlags(), port=1, host="0.0.0.0")[4] == "0.0.0.0"


def test_cli_argv() -> None:
    argv = cli_argv(
        Path("/b/llama-cli"),
        Path("/m.gguf"),
        LlamaFlags(ctx=512, fit="off", warmup=False, verbose=True),
        prompt="hi",
        n_predict=1,
    )
    assert argv == [
        "/b/llama-cli",
        "-m",
        "/m.gguf",
        "-n",
        "1",
        "-p",
        "hi",
        "-st",
        "--simple-io",
        "-c",
        "512",
        "-fit",
        "off",
        "--no-warmup",
        "-v",
    ]


def test_load_log_sums_buffer_types_of_the_last_load() -> None:
    log = """\
llama_model_loader: loaded meta data with 27 key-value pairs and 27 tensors from m.gguf
load_tensors:   CPU_Mapped model buffer size =   100.00 MiB
llama_model_loader: loaded meta data with 27 key-value pairs and 27 tensors from m.gguf
load_tensors:   CPU_Mapped model buffer size =    10.00 MiB
load_tensors:   CPU_Mapped model buffer size =     5.00 MiB
load_tensors:        CUDA0 model buffer size =    20.00 MiB
"""
    parsed = parse_load_log(log.splitlines())
    assert parsed.buffers == {"weights": {"CPU_Mapped": 15 * MiB, "CUDA0": 20 * MiB}}
    assert parsed.total("weights") == 35 * MiB and parsed.total("compute") == 0
    assert parsed.kv_cache is None and parsed.model_params is None
    # One naming: a measurement and the fit planner's estimate compare field by field.
    assert tuple(field.name for field in dataclasses.fields(DeviceMemory)) == BUFFER_KINDS
