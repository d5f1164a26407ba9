"""Resources (recipes, build manifests, job logs as templated URIs) and prompts of the MCP front."""

from __future__ import annotations

import json
import re
from collections.abc import Set
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from pydantic import Field

from llamaforge.core.errors import CacheError, LlamaforgeError
from llamaforge.core.jobs import JobManager, UnknownJob
from llamaforge.core.validation import closest
from llamaforge.fronts.mcp.arguments import CheckedPrompt
from llamaforge.fronts.mcp.output import Output
from llamaforge.serve.gpus import cuda_arch_for

JSON = "application/json"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def add_resources(server: MCPServer[Any], jobs: JobManager, output: Output) -> None:
    """Register the recipe, manifest and job-log resources on ``server`` (what they return is masked)."""

    @server.resource("llamaforge://recipes", name="recipes", mime_type=JSON)
    def recipes_index() -> str:
        """The shipped build recipes (name, description, backend); read one at llamaforge://recipes/{name}."""
        from llamaforge.build.recipes import list_recipes, load_recipe

        return _json(
            [
                {
                    "name": name,
                    "description": (recipe := load_recipe(name)).description,
                    "backend": recipe.backend,
                    "uri": f"llamaforge://recipes/{name}",
                }
                for name in list_recipes()
            ]
        )

    @server.resource("llamaforge://recipes/{name}", name="recipe", mime_type=JSON)
    def recipe(name: str) -> str:
        """A shipped build recipe after validation, with defaults filled in."""
        from llamaforge.build.recipes import list_recipes, load_recipe

        known = list_recipes()
        if name not in known:
            close = closest(name.lower(), known)
            hint = f"did you mean llamaforge://recipes/{close[0]}? " if close else ""
            raise ResourceNotFoundError(
                output.text(f"no shipped recipe {name!r}; {hint}llamaforge://recipes lists them")
            )
        try:
            return _json(load_recipe(name).model_dump(mode="json"))
        except LlamaforgeError as error:
            raise ResourceError(error.render()) from None

    @server.resource("llamaforge://builds/{key}/manifest", name="build-manifest", mime_type=JSON)
    def build_manifest(key: str) -> str:
        """The provenance manifest of a published build (a unique key prefix is enough)."""
        from llamaforge.build.store import find_build

        try:
            return output.text(_json(find_build(key)))
        except CacheError as error:
            raise ResourceNotFoundError(error.render()) from None

    @server.resource("llamaforge://jobs/{job_id}/log", name="job-log", mime_type="text/plain")
    def job_log(job_id: str) -> str:
        """The whole log of a background job of this server (job_logs pages it)."""
        try:
            page = jobs.logs(job_id, offset=0, limit=1_000_000)
        except UnknownJob as error:
            raise ResourceNotFoundError(error.render()) from None
        return output.text("\n".join(page.lines) + ("\n" if page.lines else ""))


def gpu_arch(gpu: str) -> str | None:
    """The CUDA arch for a GPU name such as "RTX 4090" or "sm_86"; None when it is not a known card."""
    arch = cuda_arch_for(gpu)
    if arch is not None:
        return arch
    compact = re.sub(r"[^a-z0-9]", "", gpu.lower())
    match = re.fullmatch(r"(?:sm)?(\d{2,3}[af]?)", compact)
    return match.group(1) if match else None


def _tool(tools: Set[str], name: str, fallback: str) -> str:
    return f"`{name}`" if name in tools else fallback


def add_prompts(server: MCPServer[Any], tools: Set[str], output: Output) -> None:
    """Register the prompts; they name only the tools this server exposes (``tools``), and their argument errors
    are masked by ``output``."""

    def build_and_serve(
        gpu: Annotated[str, Field(description="The GPU, e.g. 'RTX 4090', 'A100', 'sm_86', or 'cpu'")],
        model: Annotated[str, Field(description="The GGUF model to serve (a path on this machine)")],
    ) -> str:
        """Plan and run a llama.cpp build for a GPU, then serve a model with it."""
        cpu = gpu.strip().lower() in ("cpu", "none", "")
        arch = None if cpu else gpu_arch(gpu)
        if cpu:
            target = "a CPU build: backend='cpu'"
        elif arch:
            target = f"a CUDA build for {gpu} (compute capability {arch}): arch='{arch}'"
        else:
            target = (
                f"a CUDA build for {gpu}: find its compute capability (e.g. 86 for RTX 30xx, 89 for RTX 40xx)"
            )
        build = _tool(tools, "build_start", "the build tool (not available: this server is read-only)")
        serve = next((f"`{name}`" for name in sorted(tools) if name.startswith(("serve", "deploy"))), None)
        serve_step = (
            f"Serve {model} with {serve}."
            if serve
            else f"No serve tool is registered on this server: give the user the command to run themselves, "
            f"`<build path>/bin/llama-server -m {model} --host 127.0.0.1 --port 8080 -ngl 99` "
            "(the build path is in the job result)."
        )
        return "\n".join(
            [
                f"Build llama.cpp with llamaforge for this machine and serve the model {model}.",
                f"1. Call {_tool(tools, 'doctor', 'doctor')} and fix any failed check before building.",
                f"2. Call {_tool(tools, 'recipes_list', 'recipes_list')} and pick a recipe (usually 'default').",
                f"3. Make {target}. Preview it with {_tool(tools, 'build', 'build')} and dry_run=true "
                "(it prints the cmake arguments and cache key), then start it with "
                f"{build}; it returns a job id.",
                f"4. Poll {_tool(tools, 'job_status', 'job_status')} until the state is succeeded or failed; "
                f"on failure read the tail with {_tool(tools, 'job_logs', 'job_logs')} (offset=-50) and explain it.",
                f"5. {serve_step}",
                "Ask before anything destructive, and keep paths inside the project and the llamaforge cache.",
            ]
        )

    def refresh_patches(
        new_source: Annotated[
            str, Field(description="The new llama.cpp: an extracted tree or a .tar.gz archive")
        ],
    ) -> str:
        """Re-apply the patch series onto a new llama.cpp and resolve what conflicts."""
        check = _tool(tools, "patches_check", "patches_check")
        refresh = _tool(tools, "patches_refresh", "patches_refresh (not available: this server is read-only)")
        return "\n".join(
            [
                f"Move llamaforge's llama.cpp patch series onto {new_source}.",
                f"1. Call {check} to confirm the series applies to the current pin.",
                f"2. Call {refresh} with to='{new_source}'. If it reports conflicts, show the user the workspace "
                "and the conflicting files; after they resolve them, call it again with resume=<workspace>.",
                "3. Once it is clean, tell the user to update the recipe's source pin, then run the check again.",
            ]
        )

    for function, title in (
        (build_and_serve, "Build llama.cpp for my GPU and serve this model"),
        (refresh_patches, "Move the patch series to a new llama.cpp"),
    ):
        server.add_prompt(CheckedPrompt.of(function, output, name=function.__name__, title=title))
