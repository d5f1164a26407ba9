"""The MCP front through the real SDK client: in-memory, over stdio and over streamable HTTP.

Tool names, inputs and annotations come from the operation registry; a test fails when an operation has no
tool (or no Invoke task). Docker-marked tests drive a real build job of the tiny stand-in project.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import Field

from helpers import REPO, error_text, marked_containers, mini_recipe

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_server import ServerOptions, build_server

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import Event
from llamaforge.core.jobs import JobManager
from llamaforge.core.registry import OperationContext, Params, Result, operation, operations
from llamaforge.fronts.mcp.policy import path_fields

pytestmark = [pytest.mark.quick, pytest.mark.anyio]
# A server subprocess imports this checkout's mcp_server/ and src/ (not whatever llamaforge is installed).
CHECKOUT_PATH = os.pathsep.join([str(REPO), str(REPO / "src")])
JOB_TOOLS = {"job_status", "job_logs", "job_cancel", "jobs_list"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def expected_tools(read_only: bool = False) -> set[str]:
    """The tool names the registry calls for, written out independently of mcp_server."""
    names: set[str] = set()
    for op in operations().values():
        if read_only and not op.read_only:
            continue
        names.add(op.name.replace(".", "_"))
        if op.long_running:
            names.add(op.name.replace(".", "_") + "_start")
    starts = any(name.endswith("_start") for name in names)
    return names | (JOB_TOOLS if starts else JOB_TOOLS - {"job_cancel"})


def data(result: mcp_types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


# --- test-only operations, registered through the registry API and removed afterwards ----------------------


class WipeParams(Params):
    """Parameters of the test-only destructive operation."""

    what: str = Field("cache", description="What to wipe")


class SleepParams(Params):
    """Parameters of the test-only long operation."""

    steps: int = Field(3, description="Progress steps to report")
    step_seconds: float = Field(0.05, description="Seconds per step")
    fail: bool = Field(False, description="Raise a user error at the end")


class Wiped(Result):
    """What the test-only destructive operation wiped."""

    wiped: str


class Slept(Result):
    """How many steps the test-only long operation took."""

    steps: int


class Echoed(Result):
    """What the test-only short operation echoed."""

    echo: str


@pytest.fixture
def test_operations() -> Iterator[list[str]]:
    wiped: list[str] = []

    @operation("testonly.wipe", WipeParams, read_only=False, destructive=True)
    def wipe(params: WipeParams, ctx: OperationContext) -> Wiped:
        """Pretend to delete something (test only)."""
        wiped.append(params.what)
        return Wiped(wiped=params.what)

    @operation("testonly.sleep", SleepParams, read_only=True, long_running=True)
    def sleep(params: SleepParams, ctx: OperationContext) -> Slept:
        """Report progress for a while, honouring cancellation (test only)."""
        for step in range(params.steps):
            ctx.cancel.raise_if_cancelled()
            ctx.reporter(
                Event("progress", f"step {step + 1}", stage="sleep", completed=step + 1, total=params.steps)
            )
            ctx.reporter(Event("log", f"log line {step + 1}", stage="sleep"))
            time.sleep(params.step_seconds)
        ctx.cancel.raise_if_cancelled()
        if params.fail:
            raise InvalidOption("the test operation failed on purpose", hint="pass fail=false")
        return Slept(steps=params.steps)

    @operation("testonly.echo", WipeParams, read_only=True)
    def echo(params: WipeParams, ctx: OperationContext) -> Echoed:
        """Report one stage and return at once (test only)."""
        ctx.reporter(Event("stage", f"echoing {params.what}", stage="echo"))
        ctx.reporter(Event("log", "not a progress notification", stage="echo"))
        return Echoed(echo=params.what)

    try:
        yield wiped
    finally:
        for name in ("testonly.wipe", "testonly.sleep", "testonly.echo"):
            operations().pop(name, None)


# --- registry coverage ---------------------------------------------------------------------------------------


async def test_every_operation_has_an_mcp_tool_and_an_invoke_task() -> None:
    from llamaforge.fronts.cli import namespace

    async with Client(build_server()) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
    missing = sorted(name for name in expected_tools() if name not in listed)
    assert not missing, f"operations without an MCP tool twin: {missing}"
    # Task names plus their aliases: an operation named like a group (`smoke`) is that group's default task.
    # Invoke spells underscores as dashes (`smoke.cpu_modules` is `invoke smoke.cpu-modules`).
    tasks = {
        alias.replace("-", "_")
        for name, aliases in namespace().task_names.items()
        for alias in (name, *aliases)
    }
    assert not sorted(set(operations()) - tasks), (
        f"operations without an Invoke task: {sorted(set(operations()) - tasks)}"
    )
    assert listed == expected_tools(), "the MCP server exposes tools the registry does not call for"


async def test_tools_mirror_params_and_annotations(test_operations: list[str]) -> None:
    async with Client(build_server()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    async with Client(build_server(ServerOptions(confirm="param"))) as client:
        with_param = {tool.name: tool for tool in (await client.list_tools()).tools}
    for op in operations().values():
        for name in [op.name.replace(".", "_")] + (
            [op.name.replace(".", "_") + "_start"] if op.long_running else []
        ):
            tool = tools[name]
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is op.read_only, name
            may_destroy = op.destructive or op.destructive_when is not None  # upgrade: with apply=true
            assert tool.annotations.destructive_hint is (may_destroy and not op.read_only), name
            properties = tool.input_schema.get("properties", {})
            assert set(op.params.model_fields) <= set(properties), name
            # A confirm argument exists only where the server takes the caller's word (--confirm param).
            assert "confirm" not in properties, name
            assert ("confirm" in with_param[name].input_schema.get("properties", {})) is may_destroy, name
            for field, info in op.params.model_fields.items():
                assert properties[field].get("description") == info.description, (name, field)
                assert (properties[field].get("x-llamaforge-path") is True) == (
                    field in path_fields(op.params)
                )
            assert tool.output_schema is not None and tool.output_schema["type"] == "object", name
            if not name.endswith("_start"):  # the operation's result model is the tool's outputSchema
                published = op.result.model_json_schema(by_alias=True)["properties"]
                assert set(tool.output_schema["properties"]) == set(published), name
    assert tools["testonly_wipe"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert tools["build"].annotations.destructive_hint is False  # type: ignore[union-attr]
    assert tools["job_status"].output_schema["properties"]["state"]  # type: ignore[index]


async def test_read_only_mode_hides_every_mutating_tool(test_operations: list[str]) -> None:
    async with Client(build_server(ServerOptions(read_only=True))) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == expected_tools(read_only=True)
        assert all(
            tool.annotations and tool.annotations.read_only_hint
            for tool in tools.values()
            if tool.name != "job_cancel"
        )
        assert "build" not in tools and "testonly_wipe" not in tools and "patches_new" not in tools
        assert "testonly_sleep_start" in tools  # a read-only long operation still runs as a job
        result = await client.call_tool("build", {"dry_run": True})
        assert result.is_error and "build" in error_text(result)


def test_an_operation_declares_its_result_model() -> None:
    with pytest.raises(TypeError, match="must be a Result model"):

        @operation("testonly.untyped", WipeParams, read_only=True)
        def untyped(params: WipeParams, ctx: OperationContext) -> dict[str, Any]:
            """Return plain data (refused)."""
            return {}

    assert "testonly.untyped" not in operations()
    for op in operations().values():
        assert issubclass(op.result, Result) and op.result.__doc__, op.name


# --- calls ----------------------------------------------------------------------------------------------------


async def test_recipes_list_and_builds_list_return_structured_output(lf_home: Path) -> None:
    async with Client(build_server()) as client:
        recipes = data(await client.call_tool("recipes_list", {}))
        assert "default" in [item["name"] for item in recipes["recipes"]]
        assert data(await client.call_tool("builds_list", {}))["builds"] == []
        shown = data(await client.call_tool("recipes_show", {"name": "default"}))
        assert shown["recipe"]["name"] == "default"


async def test_user_error_is_a_tool_error_with_its_hint() -> None:
    async with Client(build_server()) as client:
        text = error_text(await client.call_tool("recipes_show", {"name": "defualt"}))
        assert "unknown build recipe 'defualt'" in text
        assert "hint: did you mean 'default'?" in text
        assert "Traceback" not in text
        text = error_text(await client.call_tool("build", {"cmake": ["NOVALUE"], "dry_run": True}))
        assert "is not KEY=VALUE" in text and "hint:" in text
        text = error_text(await client.call_tool("job_status", {"job_id": "nope"}))
        assert "no job 'nope'" in text and "hint:" in text


async def test_argument_errors_read_like_the_cli_and_unknown_arguments_are_refused(
    test_operations: list[str],
) -> None:
    asked: list[str] = []

    async def ask(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"confirm": True})

    async with Client(build_server(ServerOptions(confirm="param")), elicitation_callback=ask) as client:
        tools = (await client.list_tools()).tools
        for tool in tools:
            assert tool.input_schema.get("additionalProperties") is False, tool.name
        texts = {
            "wrong type": error_text(await client.call_tool("models_fit", {"model": "tiny", "ctx": "lots"})),
            # pydantic's lax mode would read true as 1
            "boolean number": error_text(
                await client.call_tool("models_fit", {"model": "tiny", "ctx": True})
            ),
            # Dropped, this call would echo the default ('cache').
            "unknown": error_text(await client.call_tool("testonly_echo", {"wat": "x"})),
            "start tool": error_text(await client.call_tool("testonly_sleep_start", {"stepz": 2})),
            "job tool": error_text(await client.call_tool("job_logs", {"job_id": "x", "limit": 0})),
            "no arguments": error_text(await client.call_tool("jobs_list", {"all": True})),
            "reserved": error_text(await client.call_tool("testonly_echo", {"mcp_context": {}})),
            "confirm": error_text(await client.call_tool("testonly_wipe", {"confirm": "maybe"})),
            "destructive": error_text(await client.call_tool("testonly_wipe", {"wat": "x", "confirm": True})),
        }
    assert texts["wrong type"] == (
        "invalid arguments for models_fit: ctx: Input should be a valid integer, unable to parse string as an "
        "integer"
    )
    assert texts["boolean number"] == "invalid arguments for models_fit: ctx: true is not a number"
    assert texts["unknown"] == (
        "invalid arguments for testonly_echo: wat: unknown argument\n  hint: did you mean 'what' instead of 'wat'?"
    )
    assert "stepz: unknown argument" in texts["start tool"] and "did you mean 'steps'" in texts["start tool"]
    assert (
        texts["job tool"]
        == "invalid arguments for job_logs: limit: Input should be greater than or equal to 1"
    )
    assert texts["no arguments"] == (
        "invalid arguments for jobs_list: all: unknown argument\n  hint: jobs_list takes no arguments"
    )
    assert texts["reserved"].startswith("invalid arguments for testonly_echo: mcp_context: unknown argument")
    assert texts["confirm"].startswith(
        "invalid arguments for testonly_wipe: confirm: Input should be a valid boolean"
    )
    assert texts["destructive"].startswith("invalid arguments for testonly_wipe: wat: unknown argument")
    for why, text in texts.items():
        for raw in ("pydantic", "validation error", "input_value", "type=", "Error executing tool"):
            assert raw not in text, (why, text)
    assert asked == [] and test_operations == [], "a call with wrong arguments asks nobody and runs nothing"


async def test_prompt_argument_errors_are_invalid_params_in_the_clis_words() -> None:
    async with Client(build_server()) as client:
        with pytest.raises(MCPError) as missing:
            await client.get_prompt("build_and_serve", {"gpu": "cpu"})
        with pytest.raises(MCPError) as unknown:
            await client.get_prompt("build_and_serve", {"gpu": "cpu", "model": "m.gguf", "modle": "m.gguf"})
        rendered = await client.get_prompt("build_and_serve", {"gpu": "cpu", "model": "m.gguf"})
    assert missing.value.error.code == unknown.value.error.code == mcp_types.INVALID_PARAMS
    assert (
        missing.value.error.message == "invalid arguments for prompt build_and_serve: model: Field required"
    )
    assert unknown.value.error.message == (
        "invalid arguments for prompt build_and_serve: modle: unknown argument\n"
        "  hint: did you mean 'model' instead of 'modle'?"
    )
    assert "m.gguf" in str(rendered.messages[0].content)


def test_path_fields_are_the_fields_declared_as_paths() -> None:
    from llamaforge.build.ops import BuildParams
    from llamaforge.build.ops_patches import PatchNewParams, PatchRefreshParams
    from llamaforge.build.ops_store import RecipeParams

    assert {"recipe", "patches", "ca_bundle", "from_manifest"} <= set(path_fields(BuildParams))
    assert not {"arch", "backend", "base_image", "cmake", "executor"} & set(path_fields(BuildParams))
    assert {"recipe", "series", "to", "resume"} <= set(path_fields(PatchRefreshParams))
    assert "workspace" in path_fields(PatchNewParams)
    assert path_fields(RecipeParams) == ("name",)
    declared = {name: path_fields(op.params) for name, op in operations().items()}
    assert declared == {
        "build": (
            "recipe",
            "patches",
            "ca_bundle",
            "ssh_key",
            "known_hosts",
            "ccache_password_file",
            "matrix",
            "builders",
            "from_manifest",
        ),
        "builders.status": ("builders",),
        "builds.list": (),
        "builds.show": (),
        "deploy": ("inventory", "ssh_key", "known_hosts", "model"),
        "deploy.plan": ("inventory", "ssh_key", "known_hosts", "model"),
        "deploy.rollback": ("inventory", "ssh_key", "known_hosts"),
        "deploy.status": ("inventory", "ssh_key", "known_hosts"),
        "deploy.render": ("model",),
        "images.runtime": (),
        "doctor": (),
        "images.bootstrap": (),
        "models.fetch": ("model",),
        "models.fit": ("model", "plot"),
        "models.inspect": ("target",),
        "models.lock": ("recipe",),
        "models.remap": ("src", "dst", "rules"),
        "models.verify": ("target", "recipe", "load_check"),
        "patches.check": ("recipe", "series"),
        "patches.edit": ("recipe", "series"),
        "patches.new": ("recipe", "series", "workspace"),
        "patches.refresh": ("recipe", "series", "to", "resume"),
        "recipes.list": (),
        "recipes.show": ("name",),
        "smoke": ("build", "model", "golden", "record_golden", "thresholds"),
        "smoke.compare": ("run_a", "run_b"),
        "smoke.cpu_modules": ("build", "model"),
        "models.split": ("model",),
        "topology.deploy": ("topology", "ssh_key", "known_hosts", "model"),
        "topology.plan": ("topology", "ssh_key", "known_hosts", "model"),
        "topology.rollback": ("topology", "ssh_key", "known_hosts"),
        "topology.status": ("topology", "ssh_key", "known_hosts"),
        "topology.smoke": ("topology", "ssh_key", "known_hosts"),
        "upgrade": ("to", "recipe", "resume", "models"),
    }


def test_path_policy_checks_file_urls_and_leaves_remote_urls_alone(tmp_path: Path) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from llamaforge.fronts.mcp.policy import PathPolicy

    policy = PathPolicy(roots=(tmp_path.resolve(),), base=tmp_path)
    (tmp_path / "model.gguf").write_bytes(b"")
    policy.check_value("model", f"file://{tmp_path}/model.gguf")
    policy.check_value("model", "model.gguf")
    policy.check_value("model", "default")  # a name, looked up in the shipped data directories
    policy.check_value("model", "hf://Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf")
    for value in (
        "file:///etc/passwd",
        "file://localhost/etc/%2E%2E/passwd",
        "/etc/passwd",
        "..",
        "a/../../b",
    ):
        with pytest.raises(ToolError):
            policy.check_value("model", value)


async def test_path_traversal_and_paths_outside_the_roots_are_refused(tmp_path: Path, lf_home: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.toml").write_text("", encoding="utf-8")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "escape.toml").symlink_to(outside / "evil.toml")
    recipe = mini_recipe(allowed, ["llama-cli"])
    server = build_server(ServerOptions(allow_roots=(allowed,)))
    async with Client(server) as client:
        for tool, arguments in [
            ("recipes_show", {"name": "../../../etc/passwd"}),
            ("recipes_show", {"name": "recipes/builds/../../../../etc/passwd"}),
            ("build", {"recipe": "/etc/passwd", "dry_run": True}),
            ("build", {"recipe": str(outside / "evil.toml"), "dry_run": True}),
            ("build", {"recipe": str(allowed / "escape.toml"), "dry_run": True}),  # symlink out of a root
            ("build", {"recipe": str(recipe), "ca_bundle": "/etc/ssl/../shadow", "dry_run": True}),
            ("build", {"from_manifest": "~/../../etc/passwd"}),
            ("patches_new", {"name": "../../escape", "workspace": str(allowed)}),
            ("patches_refresh", {"to": "/etc"}),
            ("build", {"recipe": str(recipe), "cmake": ["SOME_DIR=../../etc"], "dry_run": True}),  # any text
        ]:
            text = error_text(await client.call_tool(tool, arguments))
            assert "refused" in text or "outside the allowed roots" in text, (tool, arguments, text)
            assert "Traceback" not in text
        planned = data(await client.call_tool("build", {"recipe": str(recipe), "dry_run": True}))
        assert planned["dry_run"] is True and planned["plan"]["targets"] == ["llama-cli"]


# --- destructive operations -------------------------------------------------------------------------------------


async def test_destructive_tool_needs_confirmation(test_operations: list[str]) -> None:
    wiped = test_operations
    # --confirm param (an explicit flag): the caller's confirm=true is taken as the user's agreement.
    async with Client(build_server(ServerOptions(confirm="param"))) as client:
        text = error_text(await client.call_tool("testonly_wipe", {"what": "builds"}))
        assert "destructive" in text and "confirm=true" in text
        assert wiped == []
        assert data(await client.call_tool("testonly_wipe", {"what": "builds", "confirm": True})) == {
            "wiped": "builds"
        }
        assert wiped == ["builds"]

    asked: list[str] = []

    def answering(action: str, confirm: bool = True) -> Any:
        async def callback(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
            asked.append(params.message)
            content = {"confirm": confirm} if action == "accept" else None
            return mcp_types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

        return callback

    async with Client(build_server(), elicitation_callback=answering("accept")) as client:
        assert data(await client.call_tool("testonly_wipe", {"what": "models"}))["wiped"] == "models"
        assert "testonly_wipe is destructive" in asked[-1] and '"what": "models"' in asked[-1]
    for action, confirm in [("decline", True), ("cancel", True), ("accept", False)]:
        async with Client(build_server(), elicitation_callback=answering(action, confirm)) as client:
            text = error_text(await client.call_tool("testonly_wipe", {"what": "logs"}))
            assert "was not run" in text, text
    assert wiped == ["builds", "models"]

    # The default, elicit: a confirm argument the caller could set does not exist, and a client that cannot
    # ask its user is refused with what to do.
    async with Client(build_server()) as client:
        text = error_text(await client.call_tool("testonly_wipe", {"what": "all"}))
        assert "needs a person's confirmation" in text and "client that supports elicitation" in text
        text = error_text(await client.call_tool("testonly_wipe", {"what": "all", "confirm": True}))
        assert "confirm" in text
    assert wiped == ["builds", "models"]


# --- jobs (fast, with a test-only operation) ---------------------------------------------------------------------


async def test_long_call_reports_progress_and_jobs_survive_the_client(test_operations: list[str]) -> None:
    server = build_server()
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with Client(server) as client:
        result = await client.call_tool("testonly_sleep", {"steps": 4}, progress_callback=on_progress)
        assert data(result) == {"steps": 4}
        assert [message for _, _, message in progress] == [f"[sleep] step {n}" for n in range(1, 5)]
        assert [value for value, _, _ in progress] == sorted(value for value, _, _ in progress)
        progress.clear()
        assert data(
            await client.call_tool("testonly_echo", {"what": "x"}, progress_callback=on_progress)
        ) == {"echo": "x"}
        assert [message for _, _, message in progress] == ["[echo] echoing x"]
        failed = error_text(await client.call_tool("testonly_sleep", {"steps": 1, "fail": True}))
        assert "failed on purpose" in failed and "hint: pass fail=false" in failed
        started = data(await client.call_tool("testonly_sleep_start", {"steps": 20, "step_seconds": 0.05}))
        job_id = started["job_id"]
    # The client went away; the job belongs to the server process and goes on.
    async with Client(server) as client:
        for _ in range(200):
            status = data(await client.call_tool("job_status", {"job_id": job_id}))
            if status["state"] != "running":
                break
            await anyio.sleep(0.05)
        assert status["state"] == "succeeded" and status["result"] == {"steps": 20}
        assert status["progress"]["completed"] == 20 and status["progress"]["total"] == 20
        first = data(await client.call_tool("job_logs", {"job_id": job_id, "limit": 15}))
        assert first["total"] == 40 and len(first["lines"]) == 15 and first["next_offset"] == 15
        rest = data(await client.call_tool("job_logs", {"job_id": job_id, "offset": first["next_offset"]}))
        assert len(rest["lines"]) == 25 and rest["next_offset"] == 40
        past = data(await client.call_tool("job_logs", {"job_id": job_id, "offset": 1000}))
        assert (past["lines"], past["offset"], past["next_offset"]) == (
            [],
            40,
            40,
        )  # the end, not offset 1000
        tail = data(await client.call_tool("job_logs", {"job_id": job_id, "offset": -2}))
        assert tail["lines"][-1].endswith("sleep: log line 20") and len(tail["lines"]) == 2
        listed = data(await client.call_tool("jobs_list", {}))
        assert job_id in [job["id"] for job in listed["jobs"]]
        log = await client.read_resource(f"llamaforge://jobs/{job_id}/log")
        assert "step 20" in log.contents[0].text  # type: ignore[union-attr]


async def test_job_cancel_stops_a_running_job(test_operations: list[str]) -> None:
    jobs = JobManager()
    async with Client(build_server(jobs=jobs)) as client:
        job_id = data(await client.call_tool("testonly_sleep_start", {"steps": 1000, "step_seconds": 0.02}))[
            "job_id"
        ]
        await anyio.sleep(0.2)
        status = data(await client.call_tool("job_cancel", {"job_id": job_id}))
        assert status["state"] == "cancelled" and status["error"]["type"] == "Cancelled"
        assert status["progress"]["completed"] < 1000
        assert data(await client.call_tool("job_cancel", {"job_id": job_id}))["state"] == "cancelled"
    assert jobs.running() == []


async def test_giving_up_on_a_long_call_cancels_its_job(test_operations: list[str]) -> None:
    jobs = JobManager()
    async with Client(build_server(jobs=jobs)) as client:
        with anyio.move_on_after(0.5):
            await client.call_tool("testonly_sleep", {"steps": 1000, "step_seconds": 0.02})
        for _ in range(100):
            if not jobs.running():
                break
            await anyio.sleep(0.05)
    [status] = jobs.list_jobs()
    assert status.state == "cancelled" and status.progress is not None and status.progress.completed < 1000


# --- resources and prompts ---------------------------------------------------------------------------------------


async def test_resources_and_prompts(lf_home: Path) -> None:
    async with Client(build_server()) as client:
        templates = {
            item.uri_template for item in (await client.list_resource_templates()).resource_templates
        }
        assert {
            "llamaforge://recipes/{name}",
            "llamaforge://builds/{key}/manifest",
            "llamaforge://jobs/{job_id}/log",
        } <= templates
        recipe = await client.read_resource("llamaforge://recipes/default")
        assert json.loads(recipe.contents[0].text)["name"] == "default"  # type: ignore[union-attr]
        index = await client.read_resource("llamaforge://recipes")
        assert "default" in [item["name"] for item in json.loads(index.contents[0].text)]  # type: ignore[union-attr]
        for uri in (
            "llamaforge://recipes/nope",
            "llamaforge://builds/abc/manifest",
            "llamaforge://recipes/..%2F..",
        ):
            with pytest.raises(Exception) as caught:
                await client.read_resource(uri)
            assert "Traceback" not in str(caught.value)
        prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
        assert {"build_and_serve", "refresh_patches"} <= prompts
        prompt = await client.get_prompt(
            "build_and_serve", {"gpu": "RTX 4090", "model": "/models/qwen3.gguf"}
        )
        text = prompt.messages[0].content.text  # type: ignore[union-attr]
        assert "arch='89'" in text and "`build_start`" in text and "/models/qwen3.gguf" in text


# --- stdio and HTTP transports ---------------------------------------------------------------------------------------


def _stdio(*args: str, home: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_server", *args],
        cwd=str(REPO),
        env={"LLAMAFORGE_HOME": str(home), "PYTHONPATH": CHECKOUT_PATH},
    )


async def test_stdio_transport(lf_home: Path) -> None:
    async with Client(_stdio("--read-only", home=lf_home), read_timeout_seconds=60) as client:
        # The subprocess loads the registry afresh (this process may have imported more operation modules).
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"recipes_list", "builds_list", "doctor", "job_status", "job_logs", "jobs_list"} <= set(tools)
        assert "build" not in tools and "build_start" not in tools
        assert all(
            t.annotations and t.annotations.read_only_hint for n, t in tools.items() if n != "job_cancel"
        )
        recipes = data(await client.call_tool("recipes_list", {}))
        assert "default" in [item["name"] for item in recipes["recipes"]]
        assert data(await client.call_tool("builds_list", {}))["builds"] == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def http_server(port: int, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "mcp_server", "--http", "--port", str(port), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1]
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the HTTP server did not start listening")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


@asynccontextmanager
async def http_client(url: str, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def test_http_refuses_to_start_without_a_token(lf_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMAFORGE_MCP_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "mcp_server", "--http", "--port", str(_free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "needs a bearer token" in result.stderr and "LLAMAFORGE_MCP_TOKEN" in result.stderr


async def test_http_transport_requires_token_and_checks_host(lf_home: Path) -> None:
    token = "t0k3n-for-the-mcp-http-test-" + os.urandom(8).hex()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    env = {
        **os.environ,
        "LLAMAFORGE_HOME": str(lf_home),
        "LLAMAFORGE_MCP_TOKEN": token,
        "PYTHONPATH": CHECKOUT_PATH,
    }
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    with http_server(port, env):
        async with httpx2.AsyncClient(timeout=30) as http:
            assert (await http.post(url, json=initialize, headers=headers)).status_code == 401
            wrong = {**headers, "Authorization": "Bearer wrong-token-wrong-token"}
            assert (await http.post(url, json=initialize, headers=wrong)).status_code == 401
            foreign = {**headers, "Authorization": f"Bearer {token}", "Host": f"evil.example:{port}"}
            assert (await http.post(url, json=initialize, headers=foreign)).status_code in (403, 421)
            origin = {**headers, "Authorization": f"Bearer {token}", "Origin": "http://evil.example"}
            assert (await http.post(url, json=initialize, headers=origin)).status_code == 403
        async with http_client(url, token) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"build", "build_start", "recipes_list", "builds_list", "job_cancel", "jobs_list"} <= tools
            recipes = data(await client.call_tool("recipes_list", {}))
            assert "default" in [item["name"] for item in recipes["recipes"]]


# --- a real build job (Docker) ------------------------------------------------------------------------------------


# Other processes on this machine may build concurrently: this test's containers are the ones whose
# environment carries its distinctive compile-job count (passed as the build's `jobs`).
MARK_JOBS = 7


@pytest.fixture
def owned_before(docker_engine: object) -> set[str]:
    return {c.id for c in docker_engine.containers.list(all=True, filters={"label": "org.llamaforge.owned"})}  # type: ignore[attr-defined]


def _leftovers(client: object, before: set[str]) -> list[str]:
    """This test's llamaforge containers that still exist."""
    return sorted(marked_containers(client, MARK_JOBS) - before)


async def _until_finished(client: Client, job_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = data(await client.call_tool("job_status", {"job_id": job_id}))
        if status["state"] in ("succeeded", "failed", "cancelled"):
            return status
        await anyio.sleep(0.5)
    pytest.fail(f"job {job_id} did not finish in {timeout} s")


@pytest.mark.docker
async def test_build_job_runs_to_completion_with_progress(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    recipe = str(mini_recipe(tmp_path, ["llama-cli"]))
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    # The recipe is the project's: builds in Docker from it need no --allow-host-builds.
    async with Client(build_server(ServerOptions(project_dir=tmp_path))) as client:
        built = data(
            await client.call_tool(
                "build", {"recipe": recipe, "jobs": MARK_JOBS}, progress_callback=on_progress
            )
        )
        assert built["build"]["cached"] is False and "bin/llama-cli" in built["build"]["artifacts"]
        assert any(message and "[build]" in message for message in progress), progress
        assert any(message and "published build" in message for message in progress), progress

        job_id = data(
            await client.call_tool("build_start", {"recipe": recipe, "force": True, "jobs": MARK_JOBS})
        )["job_id"]
        status = await _until_finished(client, job_id)
        assert status["state"] == "succeeded", status["error"]
        assert status["result"]["build"]["key"] == built["build"]["key"]
        logs = data(await client.call_tool("job_logs", {"job_id": job_id, "offset": 0, "limit": 2000}))
        assert any("published build" in line for line in logs["lines"])

        listed = data(await client.call_tool("builds_list", {}))
        assert [item["key"] for item in listed["builds"]] == [built["build"]["key"]]
        manifest = await client.read_resource(f"llamaforge://builds/{built['build']['key'][:12]}/manifest")
        assert json.loads(manifest.contents[0].text)["targets"] == ["llama-cli"]  # type: ignore[union-attr]
    assert _leftovers(docker_engine, owned_before) == []


@pytest.mark.docker
async def test_job_cancel_removes_the_build_container(
    tmp_path: Path, lf_home: Path, docker_engine: object, base_image: str, owned_before: set[str]
) -> None:
    from llamaforge.build.store import list_builds

    recipe = str(mini_recipe(tmp_path, ["llama-cli", "llama-slow"]))
    # The recipe is the project's: builds in Docker from it need no --allow-host-builds.
    async with Client(build_server(ServerOptions(project_dir=tmp_path))) as client:
        started = time.monotonic()
        job_id = data(await client.call_tool("build_start", {"recipe": recipe, "jobs": MARK_JOBS}))["job_id"]
        while True:  # wait until the build script runs inside its container (its "build" stage is logged)
            logs = data(await client.call_tool("job_logs", {"job_id": job_id, "limit": 2000}))
            assert logs["state"] == "running", logs
            if any(line.endswith("stage    build: build") for line in logs["lines"]):
                break
            assert time.monotonic() - started < 300
            await anyio.sleep(0.2)
        building = time.monotonic()
        assert _leftovers(docker_engine, owned_before), "the build container should be running"
        await anyio.sleep(2)
        cancelled = data(await client.call_tool("job_cancel", {"job_id": job_id}))
        assert cancelled["state"] == "cancelled", cancelled
        # The slow target sleeps 60 s: finishing well before that means the container was stopped.
        assert time.monotonic() - building < 45, "cancel must stop the running build, not wait for it"
        assert _leftovers(docker_engine, owned_before) == []
        assert list_builds() == []
    assert not any((lf_home / "tmp").iterdir())
