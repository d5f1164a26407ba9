"""models.inspect: facts from the header of a local file, and of a remote one read through HTTP range requests
from a real server on 127.0.0.1 (always shut down)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import numpy as np
import pytest

from llamaforge.core.errors import InvalidOption, ModelError
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf.header import GGUFFormatError, read_header
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.models.inspect import inspect_model, layer_kinds
from llamaforge.models.remote import HttpRangeSource, resolve_remote_url

pytestmark = pytest.mark.quick

TOKEN = "hf_secret_token_for_tests"


def write_vocab(path: Path, n_tokens: int) -> Path:
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"token-{i}" for i in range(n_tokens)])
    writer.add_token_types([1] * n_tokens)
    writer.add_token_merges(["t o", "to k"])
    writer.add_eos_token_id(n_tokens - 1)
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served")
    small_vocab = write_vocab(root / "vocab-300.gguf", 300)
    big_vocab = write_vocab(root / "vocab-20k.gguf", 20_000)
    wide = TinyModelSpec(n_layer=4, n_embd=256, n_ff=1024, dtype="f32")
    return {
        "wide": write_tiny_model(root / "wide.gguf", wide, small_vocab).path,  # ~13 MB, 8 KB header
        "bigvocab": write_tiny_model(
            root / "bigvocab.gguf", TinyModelSpec(), big_vocab
        ).path,  # 400 KB header
        "moe": write_tiny_model(root / "moe.gguf", TinyModelSpec(arch="qwen3moe"), small_vocab).path,
        "hybrid": write_tiny_model(
            root / "hybrid.gguf",
            TinyModelSpec(arch="qwen35", n_layer=8, full_attention_interval=4),
            small_vocab,
        ).path,
    }


# --------------------------------------------------------------------------------------------- server


@dataclass
class RangeServer:
    """What the loopback server served; ``ignore_range`` makes it answer 200 with the whole file; ``faults``
    are what the next requests get instead of their answer: an HTTP status, or 0 to close the connection."""

    root: Path
    url: str = ""
    requests: list[dict[str, str]] = field(default_factory=list)
    bytes_sent: int = 0
    ignore_range: bool = False
    finished: int = 0
    faults: list[int] = field(default_factory=list)

    def settle(self) -> None:
        """Wait until every request seen so far has been answered (the client may return first)."""
        deadline = time.monotonic() + 5
        while self.finished < len(self.requests) and time.monotonic() < deadline:
            time.sleep(0.01)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        try:
            self._answer()
        finally:
            self.server.state.finished += 1

    def _answer(self) -> None:
        state = self.server.state
        state.requests.append(
            {
                "path": self.path,
                "range": self.headers.get("Range", ""),
                "authorization": self.headers.get("Authorization", ""),
            }
        )
        if state.faults:
            fault = state.faults.pop(0)
            if fault:
                self.send_error(fault)
            else:
                self.close_connection = True  # no answer at all: the client sees the connection end
            return
        path = state.root / self.path.rsplit("/", 1)[-1]  # /owner/repo/resolve/main/x.gguf -> x.gguf
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if state.ignore_range or match is None:
            body, status = data, 200
        else:
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data):
                self.send_error(416)
                return
            body, status = data[start : end + 1], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        try:
            for start_at in range(0, len(body), 1 << 16):
                self.wfile.write(body[start_at : start_at + (1 << 16)])
                state.bytes_sent += len(body[start_at : start_at + (1 << 16)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up (it refuses 200 answers to range requests)

    def log_message(self, *_args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: RangeServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


@pytest.fixture
def server(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[RangeServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a CI proxy must not see loopback requests
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    state = RangeServer(root=files["wide"].parent)
    httpd = _Server(state)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


# ---------------------------------------------------------------------------------------------- local


def test_inspect_local_moe(files: dict[str, Path]) -> None:
    result = inspect_model(str(files["moe"]))
    assert result["remote"] is False and result["source"] == str(files["moe"])
    model = result["model"]
    reader = gguf.GGUFReader(files["moe"])  # a known-good file
    assert model["architecture"] == "qwen3moe"
    assert model["parameters"] == sum(int(t.n_elements) for t in reader.tensors) == 113024
    assert model["parameters_human"] == "113.02 K"  # what llama.cpp prints as "model params"
    assert model["layers"] == {
        "block_count": 2,
        "attention": 2,
        "recurrent": 0,
        "mtp": 0,
        "full_attention_interval": None,
        "attention_layers": [0, 1],
    }
    assert (model["context_length"], model["expert_count"], model["expert_used_count"]) == (4096, 4, 2)
    assert model["file_type"] == model["dominant_type"] == model["guessed_file_type"] == "F16"
    assert model["quant_histogram"]["F16"]["count"] + model["quant_histogram"]["F32"]["count"] == 27
    assert model["file_size"] == files["moe"].stat().st_size
    assert model["tokenizer"] == {
        "model": "gpt2",
        "pre": "qwen2",
        "vocab_size": 300,
        "merges": 2,
        "bos_token_id": None,
        "eos_token_id": 299,
    }
    assert model["chat_template"]["present"] and model["chat_template"]["bytes"] > 0


def test_hybrid_layers(files: dict[str, Path]) -> None:
    model = inspect_model(str(files["hybrid"]))["model"]
    assert model["architecture"] == "qwen35"
    assert model["layers"]["attention_layers"] == [3, 7]  # (i+1) % 4 == 0
    assert (model["layers"]["attention"], model["layers"]["recurrent"]) == (2, 6)


def test_layer_kinds_variants(tmp_path: Path) -> None:
    """Interval default 4 for hybrid archs, an explicit recurrent_layers array, MTP blocks at the end."""

    def header(arch: str, **keys: object) -> list[str]:
        path = tmp_path / f"{arch}-{len(keys)}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        for key, value in keys.items():
            if isinstance(value, list):
                writer.add_array(f"{arch}.{key}", value)
            else:
                writer.add_uint32(f"{arch}.{key}", int(value))  # type: ignore[call-overload]
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return list(layer_kinds(read_header(path)))

    assert header("qwen3next", block_count=8) == ["recurrent"] * 3 + ["attention"] + ["recurrent"] * 3 + [
        "attention"
    ]
    assert header("qwen35", block_count=5, full_attention_interval=2, nextn_predict_layers=1) == [
        "recurrent",
        "attention",
        "recurrent",
        "attention",
        "mtp",
    ]
    assert header("qwen35moe", block_count=3, **{"attention.recurrent_layers": [True, False, True]}) == [
        "recurrent",
        "attention",
        "recurrent",
    ]
    assert header("qwen3", block_count=2) == ["attention", "attention"]


def test_recipe_without_local_file_needs_remote(tmp_path: Path, lf_home: Path) -> None:
    recipe = tmp_path / "far.toml"
    recipe.write_text('source = "https://example.invalid/x.gguf"\n', encoding="utf-8")
    with pytest.raises(InvalidOption, match="not a local file") as caught:
        inspect_model(str(recipe))
    assert "--remote" in (caught.value.hint or "")


# --------------------------------------------------------------------------------------------- remote


def test_remote_reads_a_small_fraction(server: RangeServer, files: dict[str, Path]) -> None:
    url = f"{server.url}/models/wide.gguf"
    result = inspect_model(url)
    server.settle()
    size = files["wide"].stat().st_size
    assert result["remote"] is True and result["source"] == url
    assert result["bytes_fetched"] == server.bytes_sent < size * 0.01
    assert result["fraction_fetched"] < 0.01 and result["requests"] == len(server.requests) == 1
    assert all(r["range"].startswith("bytes=") for r in server.requests)
    assert all(r["authorization"] == "" for r in server.requests)  # no token for plain URLs
    local = inspect_model(str(files["wide"]))["model"]
    assert result["model"] == local
    assert local["file_size"] == size and local["embedding_length"] == 256


def test_remote_prefix_grows_until_the_header_parses(server: RangeServer, files: dict[str, Path]) -> None:
    result = inspect_model(f"{server.url}/bigvocab.gguf")
    header_bytes = read_header(files["bigvocab"]).data_offset
    assert header_bytes > 300_000
    assert result["requests"] >= 3  # 64 KiB, 128 KiB, 256 KiB, ...
    assert header_bytes <= result["bytes_fetched"] < 2 * header_bytes + (64 << 10)
    assert result["bytes_fetched"] < files["bigvocab"].stat().st_size
    assert result["model"]["tokenizer"]["vocab_size"] == 20_000
    starts = [int(r["range"].split("=")[1].split("-")[0]) for r in server.requests]
    assert starts == sorted(starts) and starts[0] == 0  # never the same byte twice


def test_remote_hf_url_with_token(
    server: RangeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    url, headers = resolve_remote_url("hf://Qwen/Tiny-GGUF/sub dir/moe.gguf", "v1.0")
    assert url == f"{server.url}/Qwen/Tiny-GGUF/resolve/v1.0/sub%20dir/moe.gguf"
    assert headers == {"Authorization": f"Bearer {TOKEN}"}
    result = inspect_model("hf://Qwen/Tiny-GGUF/moe.gguf")
    assert server.requests[0]["path"] == "/Qwen/Tiny-GGUF/resolve/main/moe.gguf"
    assert server.requests[0]["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(result) and result["model"]["architecture"] == "qwen3moe"
    # the operation: a recipe with a hub source and --remote, its revision used
    recipe = tmp_path / "tiny.toml"
    recipe.write_text('source = "hf://Qwen/Tiny-GGUF/moe.gguf"\nrevision = "abc"\n', encoding="utf-8")
    op = operations()["models.inspect"]
    data = result_json(
        op.run(op.params.model_validate({"target": str(recipe), "remote": True}), OperationContext())
    )
    assert data["remote"] and server.requests[-1]["path"] == "/Qwen/Tiny-GGUF/resolve/abc/moe.gguf"


def test_remote_errors_are_typed(server: RangeServer, files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="HTTP 404") as missing:
        inspect_model(f"{server.url}/nope.gguf")
    assert missing.value.hint == "check the repository, revision and file name"
    server.ignore_range = True
    with pytest.raises(ModelError, match="ignored the Range request"):
        inspect_model(f"{server.url}/wide.gguf")
    server.settle()
    assert (
        server.bytes_sent < files["wide"].stat().st_size
    )  # the client hung up instead of downloading it all
    server.ignore_range = False
    corrupt = files["wide"].parent / "corrupt.gguf"
    data = bytearray(files["moe"].read_bytes())
    at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8
    data[at : at + 8] = ((1 << 63) - 1).to_bytes(8, "little")  # the array length that hangs GGUFReader
    corrupt.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match="array length"):
        inspect_model(f"{server.url}/corrupt.gguf")
    with pytest.raises(InvalidOption):
        resolve_remote_url("ms://Qwen/x/y.gguf")


def test_range_source_bounds(server: RangeServer, files: dict[str, Path]) -> None:
    source = HttpRangeSource(f"{server.url}/wide.gguf", initial_bytes=1000)
    assert source.size == files["wide"].stat().st_size and source.bytes_fetched == 1000
    assert source.read_at(0, 4) == b"GGUF"
    assert source.read_at(1500, 10) == files["wide"].read_bytes()[1500:1510]
    assert source.bytes_fetched == 2000  # doubled, no more
    with pytest.raises(ModelError, match="not complete after"):
        HttpRangeSource(f"{server.url}/wide.gguf", initial_bytes=1000, max_bytes=1500).read_at(0, 1400)


def test_remote_reads_retry_network_trouble(server: RangeServer, files: dict[str, Path]) -> None:
    """The header read goes through the one range-and-retry client (core.http) that model downloads use."""
    logs: list[str] = []
    server.faults = [503, 0]  # a busy server, then a connection closed without an answer
    source = HttpRangeSource(
        f"{server.url}/wide.gguf", initial_bytes=1000, reporter=lambda event: logs.append(event.message)
    )
    assert source.read_at(0, 4) == b"GGUF"
    assert len(server.requests) == 3
    assert [line for line in logs if line.startswith("retrying")] == [
        "retrying range request 1/3",
        "retrying range request 2/3",
    ]


def test_remote_reads_give_up_or_do_not_retry(server: RangeServer, files: dict[str, Path]) -> None:
    server.faults = [503, 503, 503]
    with pytest.raises(ModelError, match="HTTP 503"):
        HttpRangeSource(f"{server.url}/wide.gguf", initial_bytes=1000)
    assert len(server.requests) == 3  # three attempts, then the error
    server.requests.clear()
    with pytest.raises(ModelError, match="HTTP 404") as missing:
        HttpRangeSource(f"{server.url}/absent.gguf", initial_bytes=1000)
    assert missing.value.hint == "check the repository, revision and file name"
    assert len(server.requests) == 1  # a 404 will not change: asked once


def test_file_type_line_names_the_type_with_most_bytes(tmp_path: Path) -> None:
    # Three small F32 norms outnumber one large F16 embedding: by count F32 wins, by bytes F16 does.
    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float16))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    result = inspect_model(str(path))
    model = result["model"]
    histogram = model["quant_histogram"]
    assert (histogram["F32"]["count"], histogram["F16"]["count"]) == (3, 1)
    assert histogram["F16"]["bytes"] > histogram["F32"]["bytes"]
    assert model["dominant_type"] == "F16"
    assert model["guessed_file_type"] == "F32"  # llama.cpp's own guess counts tensors
    assert model["file_type"] is None

    from rich.console import Console

    from llamaforge.models.ops_verify import ModelInspectResult
    from llamaforge.models.render import models_inspect_cli, models_inspect_html

    console = Console(record=True, width=160)
    typed = ModelInspectResult.model_validate(result)
    models_inspect_cli(typed, console)
    assert re.search(r"file type\s+│?\s*- \(most bytes F16\)", console.export_text())
    assert "most bytes F16" in models_inspect_html(typed)


def test_values_the_header_does_not_give_show_as_a_dash(tmp_path: Path) -> None:
    """An architecture that is a number (no string): the summary printed "None (-)", "None: …", "None tokens"."""
    from io import StringIO

    from rich.console import Console

    from llamaforge.models.render import _model_table

    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "qwen3")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = inspect_model(str(tmp_path / "odd.gguf"))["model"]  # no block_count, context or vocabulary
    model["architecture"] = None  # as describe() reports an architecture that is no string
    out = StringIO()
    _model_table("odd.gguf", model, Console(file=out, width=120))
    text = out.getvalue()
    assert "None" not in text, text
    assert "- (" in text and "-: 0 attention" in text and "- tokens" in text
