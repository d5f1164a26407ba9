"""One failure channel: an operation that ends with a failing verdict fails the same way in every front.

The CLI exits with the operation's exit code and still prints the result, a job ends ``failed`` and keeps the
result, Jupyter raises with the result attached, and an MCP tool result has ``isError: true`` with the result
as structured content. Verify and fit verdicts need no build; the smoke verdict runs a real llama-bench.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, invoke, write_mini_vocab

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

import mcp_types
from mcp import Client
from mcp_server import ServerOptions, build_server

from llamaforge.core.errors import DoesNotFit, ModelError, OperationFailed, SmokeFailed
from llamaforge.core.jobs import JobManager
from llamaforge.core.registry import OperationContext, operations, result_json
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.serve.fit import GiB, plan_fit

pytestmark = [
    pytest.mark.quick,
    pytest.mark.filterwarnings(
        # IPython's own modules still use APIs their dependencies deprecated; only those, only here.
        "ignore::DeprecationWarning:IPython.*",
        "ignore::DeprecationWarning:traitlets.*",
    ),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("failing-model")
    vocab = write_mini_vocab(out / "vocab.gguf", 1000)
    return write_tiny_model(out / "tiny-qwen3.gguf", TinyModelSpec(arch="qwen3", n_layer=4), vocab).path


@pytest.fixture
def wrong_recipe(tiny_model: Path, tmp_path: Path) -> Path:
    """A model recipe whose expectations the tiny model does not meet (it has 4 blocks, not 3)."""
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f'source = "{tiny_model.as_uri()}"\n[expect]\nblock_count = 3\n', encoding="utf-8")
    return recipe


def _too_small_gpu(model: Path) -> dict[str, str]:
    """A 1 GiB GPU and a margin that leave half the fully offloaded model: a pinned full offload cannot fit."""
    full = plan_fit(model, vram_bytes=8 * GiB, ctx=4096, margin_bytes=0)
    return {"vram": "1GiB", "margin": str(GiB - full.gpu_memory.total // 2)}


def _failed(result: mcp_types.CallToolResult) -> tuple[str, dict[str, Any]]:
    assert result.is_error, result.structured_content
    assert result.structured_content is not None, "a failing verdict still carries its result"
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text, result.structured_content


# --- the operation itself ---------------------------------------------------------------------------------


def test_a_failing_verdict_raises_with_the_result(
    wrong_recipe: Path, tiny_model: Path, lf_home: Path
) -> None:
    verify = operations()["models.verify"]
    with pytest.raises(OperationFailed) as failed:
        verify.run(verify.params.model_validate({"target": str(wrong_recipe)}), OperationContext())
    assert failed.value.exit_code == ModelError.exit_code
    data = result_json(failed.value.result)
    assert data["ok"] is False and data["checks"]["expectations"] == "fail" and data["exit_code"] == 9

    fit = operations()["models.fit"]
    params = {
        "model": str(tiny_model),
        **_too_small_gpu(tiny_model),
        "ctx": 4096,
        "n_gpu_layers": 5,
    }
    with pytest.raises(OperationFailed) as refused:
        fit.run(fit.params.model_validate(params), OperationContext())
    assert refused.value.exit_code == DoesNotFit.exit_code and "does not fit" in refused.value.message
    assert result_json(refused.value.result)["fits"] is False


# --- jobs -------------------------------------------------------------------------------------------------


def test_a_failing_verdict_is_a_failed_job_that_keeps_its_result(wrong_recipe: Path, lf_home: Path) -> None:
    jobs = JobManager()
    status = jobs.wait(jobs.start("models.verify", {"target": str(wrong_recipe)}), timeout=120)
    assert status.state == "failed"
    assert status.error is not None and status.error.type == "OperationFailed"
    assert status.error.exit_code == ModelError.exit_code and "FAILED verification" in status.error.message
    assert status.result is not None and status.result["ok"] is False
    assert any(finding["status"] == "fail" for finding in status.result["findings"])


# --- MCP --------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_failing_verdict_is_an_mcp_error_with_structured_content(
    wrong_recipe: Path, tiny_model: Path, tmp_path: Path, lf_home: Path
) -> None:
    jobs = JobManager()
    roots = (tmp_path, tiny_model.parent)
    async with Client(build_server(ServerOptions(allow_roots=roots), jobs=jobs)) as client:
        # A long-running operation (through its job) ...
        text, verdict = _failed(await client.call_tool("models_verify", {"target": str(wrong_recipe)}))
        assert "FAILED verification" in text and "job:" in text
        assert verdict["ok"] is False and verdict["exit_code"] == ModelError.exit_code
        assert verdict["checks"]["expectations"] == "fail"
        # ... its background twin ...
        started = await client.call_tool("models_verify_start", {"target": str(wrong_recipe)})
        assert started.structured_content is not None
        status = jobs.wait(started.structured_content["job_id"], timeout=120)
        shown = await client.call_tool("job_status", {"job_id": status.id})
        assert not shown.is_error and shown.structured_content is not None
        assert shown.structured_content["state"] == "failed"
        assert shown.structured_content["result"]["checks"]["expectations"] == "fail"
        assert shown.structured_content["error"]["exit_code"] == ModelError.exit_code
        # ... and a short one, run inline.
        arguments = {
            "model": str(tiny_model),
            **_too_small_gpu(tiny_model),
            "ctx": 4096,
            "n_gpu_layers": 5,
        }
        text, plan = _failed(await client.call_tool("models_fit", arguments))
        assert "does not fit" in text and plan["fits"] is False and plan["n_gpu_layers"] == 5
        # A passing verdict is still a plain success.
        good = await client.call_tool("models_verify", {"target": str(tiny_model)})
        assert not good.is_error and good.structured_content is not None and good.structured_content["ok"]


# --- CLI and Jupyter --------------------------------------------------------------------------------------


def test_cli_exit_codes_and_output_of_a_failing_verdict(
    wrong_recipe: Path, tiny_model: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "LLAMAFORGE_HOME": str(tmp_path / "home")}
    failed = invoke("models.verify", str(wrong_recipe), "--json", env=env, timeout=120)
    assert failed.returncode == ModelError.exit_code, failed.stderr
    assert json.loads(failed.stdout)["checks"]["expectations"] == "fail"  # the result is still printed
    assert "FAILED verification" in failed.stderr
    human = invoke("models.verify", str(wrong_recipe), env=env, timeout=120)
    assert human.returncode == ModelError.exit_code and "FAILED" in human.stdout
    fit = invoke(
        "models.fit",
        str(tiny_model),
        "--vram",
        _too_small_gpu(tiny_model)["vram"],
        "--ctx",
        "4096",
        "--margin",
        _too_small_gpu(tiny_model)["margin"],
        "--n-gpu-layers",
        "5",
        "--json",
        env=env,
        timeout=120,
    )
    assert fit.returncode == DoesNotFit.exit_code, fit.stderr
    assert json.loads(fit.stdout)["fits"] is False


def test_jupyter_raises_with_the_result_attached(wrong_recipe: Path, lf_home: Path) -> None:
    pytest.importorskip("IPython")
    from llamaforge.fronts.jupyter import NotebookError, OperationResult, run

    with pytest.raises(NotebookError) as failed:
        run("models.verify", target=str(wrong_recipe))
    error = failed.value
    assert error.exit_code == ModelError.exit_code and error.error_type == "OperationFailed"
    assert isinstance(error.result, OperationResult) and error.result["checks"]["expectations"] == "fail"
    shown = "\n".join(error._render_traceback_())
    assert "FAILED" in shown and "FAILED verification" in shown  # the result's table, then the error


# --- smoke (a real llama-bench run) -----------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.anyio
async def test_failing_smoke_over_mcp_is_an_error_carrying_its_verdict(
    stock_build: Path, tiny_model: Path, tmp_path: Path, lf_home: Path
) -> None:
    roots = (stock_build, tiny_model.parent)
    arguments = {
        "build": str(stock_build),
        "model": str(tiny_model),
        "thresholds": ["min_tg_tps=100000000"],
        "skip_server": True,
        "repetitions": 1,
        "pp": 8,
        "tg": 4,
        "threads": 1,
    }
    async with Client(build_server(ServerOptions(allow_roots=roots)), read_timeout_seconds=600) as client:
        text, report = _failed(await client.call_tool("smoke", arguments))
    assert "FAILED its verdict" in text and "min_tg_tps" in text
    assert report["verdict"]["passed"] is False and report["exit_code"] == SmokeFailed.exit_code
    [check] = [check for check in report["verdict"]["checks"] if check["name"] == "min_tg_tps"]
    assert check["status"] == "fail" and check["threshold"] == 100000000 and check["value"] > 0
    assert report["bench"]["tests"] and Path(report["files"]["summary.md"]).is_file()
