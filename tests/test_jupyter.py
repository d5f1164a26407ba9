"""The Jupyter front with a real IPython shell: the generated ``%llamaforge`` magic, its errors and HTML reprs.

No mocks of llamaforge: every call goes through the operation registry, the job manager and the real
operations (recipes, a CUDA dry-run plan, a tiny GGUF for inspect/verify/fit).
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import write_mini_vocab
from llamaforge.build.recipes import list_recipes
from llamaforge.core.events import Event
from llamaforge.core.registry import operations
from llamaforge.fronts.jupyter import (
    BackgroundJob,
    HelpText,
    NotebookError,
    OperationResult,
    build_parser,
    resolve_operation,
    run,
)
from llamaforge.fronts.jupyter_progress import HTMLProgress
from llamaforge.fronts.render_html import render_html
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.serve.fit_chart import fit_chart_png

pytestmark = [
    pytest.mark.quick,
    pytest.mark.filterwarnings(
        # IPython's own modules still use APIs their dependencies deprecated; only those, only here.
        "ignore::DeprecationWarning:IPython.*",
        "ignore::DeprecationWarning:traitlets.*",
    ),
]

InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell
capture_output = pytest.importorskip("IPython.utils.capture").capture_output


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lf_home: Path) -> Iterator[Any]:
    """A real IPython shell (history in memory, profile in tmp) with ``%load_ext llamaforge`` done."""
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "llamaforge")
    try:
        yield ip
    finally:
        InteractiveShell.clear_instance()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight qwen3 GGUF with a 1000-token vocabulary (no hub, no llama.cpp source)."""
    out = tmp_path_factory.mktemp("jupyter-model")
    vocab = write_mini_vocab(out / "vocab.gguf", 1000)
    return write_tiny_model(out / "tiny-qwen3.gguf", TinyModelSpec(arch="qwen3", n_layer=4), vocab).path


def magic(ip: Any, line: str) -> Any:
    return ip.run_line_magic("llamaforge", line)


# --- parsing ---------------------------------------------------------------------------------------------------


def test_load_ext_registers_the_magic(shell: Any) -> None:
    assert "llamaforge" in shell.magics_manager.magics["line"]
    listing = magic(shell, "")
    assert isinstance(listing, HelpText)
    assert all(name in repr(listing) for name in operations())


@pytest.mark.parametrize("name", sorted(operations()))
def test_parser_is_generated_from_the_params_model(name: str) -> None:
    op = operations()[name]
    text = build_parser(op).format_help()
    assert text.startswith(f"usage: %llamaforge {name}")
    for field, info in op.params.model_fields.items():
        flag = field.upper() if field in op.positional else f"--{field.replace('_', '-')}"
        assert flag in text, f"{name}: {flag} missing from --help"
        if info.description:
            assert info.description.split()[0] in text
    assert ("--background" in text) == op.long_running


def test_help_explains_an_operation(shell: Any) -> None:
    help_text = magic(shell, "fit --help")
    assert isinstance(help_text, HelpText)
    assert "usage: %llamaforge models.fit" in repr(help_text)
    assert "--ctx CTX" in repr(help_text) and "rtx3090" in repr(help_text)
    assert "<pre>" in help_text._repr_html_()


def test_short_names_and_did_you_mean() -> None:
    assert resolve_operation("fit").name == "models.fit"
    assert resolve_operation("smoke").name == "smoke"
    with pytest.raises(NotebookError, match="ambiguous") as ambiguous:
        resolve_operation("list")
    assert ambiguous.value.hint is not None and "builds.list" in ambiguous.value.hint
    with pytest.raises(NotebookError, match="unknown operation") as unknown:
        resolve_operation("buidl")
    assert unknown.value.hint is not None and "did you mean 'build'" in unknown.value.hint


def test_arguments_are_typed_and_validated(shell: Any) -> None:
    with pytest.raises(NotebookError, match="invalid int value: 'lots'") as bad_int:
        magic(shell, "fit model.gguf --ctx lots")
    assert bad_int.value.exit_code == 2 and "models.fit --help" in (bad_int.value.hint or "")
    with pytest.raises(NotebookError, match="required: MODEL, --ctx"):
        magic(shell, "fit")
    with pytest.raises(NotebookError, match="invalid choice: 'rocm'"):
        magic(shell, "build --backend rocm --dry-run")
    with pytest.raises(NotebookError, match="--ctx: Input should be greater than or equal to 1"):
        magic(shell, "fit model.gguf --ctx 0")


# --- errors ----------------------------------------------------------------------------------------------------


def test_user_error_shows_message_and_hint_without_traceback(shell: Any) -> None:
    with capture_output() as captured:
        outcome = shell.run_cell("%llamaforge recipes.show no-such-recipe")
    assert not outcome.success
    error = outcome.error_in_exec
    assert isinstance(error, NotebookError) and error.exit_code == 2 and error.error_type == "RecipeError"
    shown = captured.stdout + captured.stderr
    assert "unknown build recipe 'no-such-recipe'" in shown
    assert "hint: known: default" in shown
    assert "Traceback" not in shown and "File " not in shown and "jupyter.py" not in shown


def test_missing_model_error_names_the_next_step(shell: Any, tmp_path: Path) -> None:
    with capture_output() as captured:
        outcome = shell.run_cell(f"%llamaforge fit {tmp_path / 'absent.gguf'} --gpu rtx3090 --ctx 4096")
    assert isinstance(outcome.error_in_exec, NotebookError)
    assert "absent.gguf" in captured.stdout and "Traceback" not in captured.stdout


# --- HTML reprs ------------------------------------------------------------------------------------------------


def test_recipes_list_html_names_every_recipe(shell: Any) -> None:
    result = magic(shell, "recipes.list")
    assert isinstance(result, OperationResult) and result.operation == "recipes.list"
    page = result._repr_html_()
    for name in list_recipes():
        assert f"<td style='text-align:left'>{name}</td>" in page
    assert "default" in shell.display_formatter.format(result)[0]["text/plain"]


def test_cuda_dry_run_plan(shell: Any) -> None:
    result = magic(shell, "build --arch 86 --dry-run --cmake GGML_CCACHE=OFF")
    assert result["dry_run"] is True
    page = result._repr_html_()
    assert "CMAKE_CUDA_ARCHITECTURES=86" in page and "-DGGML_CCACHE=OFF" in page
    assert "build plan (dry run)" in page and "<summary>Dockerfile</summary>" in page
    assert "FROM " in page  # the rendered Dockerfile, escaped into a <pre>


@pytest.mark.docker  # doctor fails without a Docker engine
def test_builds_list_empty_and_doctor(shell: Any) -> None:
    assert "no builds yet" in magic(shell, "builds.list")._repr_html_()
    doctor = magic(shell, "doctor")
    page = doctor._repr_html_()
    assert "this machine can build" in page
    assert all(f">{check['name']}<" in page for check in doctor["checks"])


def test_model_inspect_verify_and_fit(shell: Any, tiny_model: Path, tmp_path: Path) -> None:
    shell.user_ns["model"] = str(tiny_model)
    inspect_page = magic(shell, "models.inspect {model}")._repr_html_()
    assert "qwen3" in inspect_page and "architecture" in inspect_page

    verify = magic(shell, "models.verify {model} --no-cache")
    assert verify["ok"] is True
    assert "model verification" in verify._repr_html_() and verify["sha256"] in verify._repr_html_()

    fit = magic(shell, "fit {model} --gpu rtx3090 --ctx 32768")
    page = fit._repr_html_()
    assert "fit plan" in page and "data:image/png;base64," in page and "KV cache" in page
    assert fit["command"] in page.replace("&#x27;", "'").replace("&quot;", '"')
    # The chart drawn from the numbers is a real PNG.
    png = fit_chart_png([fit.data])
    assert png.startswith(b"\x89PNG")

    # With --plot the operation's own chart is shown inline instead.
    plot = tmp_path / "fit.png"
    with_plot = magic(shell, f"fit {{model}} --vram 24GiB --ctx 4096 --plot {plot}")
    assert plot.is_file()
    assert base64.b64encode(plot.read_bytes()).decode() in with_plot._repr_html_()


def test_each_operation_names_its_renderers_which_sit_beside_it() -> None:
    with_cli = {name for name, op in operations().items() if op.render_cli}
    with_html = {name for name, op in operations().items() if op.render_html}
    shown = {
        "build",
        "builders.status",
        "builds.list",
        "doctor",
        "recipes.list",
        "models.fetch",
        "models.inspect",
        "models.verify",
        "models.fit",
        "smoke",
        "smoke.compare",
        "smoke.cpu_modules",
        "upgrade",
    }
    deploy_tables = {"deploy", "deploy.plan", "deploy.status", "deploy.rollback"}  # CLI tables only
    assert with_cli == shown | {"models.lock", "deploy.render"} | deploy_tables and with_html == shown | {
        "builds.show"
    }
    for op in operations().values():
        for renderer in (op.render_cli, op.render_html):
            if renderer is not None:  # same domain package as the operation: llamaforge.<domain>.render
                assert renderer.__module__ == op.run.__module__.rsplit(".", 1)[0] + ".render", op.name


def test_each_renderer_takes_its_operations_typed_result() -> None:
    """A renderer reads the Result model (attribute access, checked by mypy), not the JSON by string keys: a
    renamed field is then a type error instead of a view that silently shows less. The registry hands it the
    result itself, no adapter in between."""
    typed = set()
    for op in operations().values():
        for renderer in (op.render_cli, op.render_html):
            if renderer is None:
                continue
            assert not hasattr(renderer, "__wrapped__"), f"{op.name}: its renderer is wrapped"
            first = next(iter(inspect.signature(renderer).parameters.values()))
            assert first.annotation == op.result.__name__, (op.name, first.annotation)
            typed.add(op.name)
    assert {
        "build",
        "builds.list",
        "doctor",
        "models.fit",
        "models.verify",
        "smoke",
        "smoke.cpu_modules",
        "deploy",
        "deploy.plan",
        "deploy.status",
        "deploy.rollback",
        "deploy.render",
    } <= typed


def test_deploy_render_shows_the_files_as_they_are() -> None:
    from rich.console import Console

    op = operations()["deploy.render"]
    assert op.render_cli is not None
    one = op.result.model_validate(
        {
            "target": "compose",
            "image": "llamaforge/llama-server:k",
            "files": {"compose.yaml": "services: {}\n"},
        }
    )
    console = Console(record=True, width=200)
    op.render_cli(one, console)
    assert console.export_text() == "services: {}\n"
    several = one.model_copy(update={"files": {"a.yaml": "a: 1\n", "b.yaml": "b: 2\n"}})
    op.render_cli(several, console)
    assert console.export_text() == "# ---- a.yaml\na: 1\n# ---- b.yaml\nb: 2\n"


def test_generic_view_and_unknown_shapes() -> None:
    page = render_html("recipes.show", {"recipe": {"name": "default", "targets": ["llama-server"]}})
    assert "<summary>recipe</summary>" in page and "llama-server" in page
    # A renderer whose result moved on still shows the data instead of failing.
    assert "surprise" in render_html("build", {"dry_run": False, "surprise": 1})
    assert "exit code 10" in render_html("smoke.compare", {"exit_code": 10})


# --- progress and background jobs ------------------------------------------------------------------------------


def test_html_progress_updates_one_display(shell: Any) -> None:
    with capture_output() as captured:
        view = HTMLProgress("build")
        view.event(Event("stage", "configuring", stage="configure"))
        view.event(Event("progress", "[3/10] compiling ggml.c", stage="compile", completed=3, total=10))
        view.finish("succeeded", 12.5)
    pages = [output.data.get("text/html", "") for output in captured.outputs]
    assert pages and all("llamaforge-progress" in page for page in pages)
    assert "succeeded" in pages[-1] and "12.5 s" in pages[-1]
    assert 'max="10"' in view.state.as_html()


def test_progress_in_a_kernel_is_html(shell: Any, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A shell with a kernel is what a notebook has; the magic then shows events as an updated HTML block.
    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    with capture_output() as captured:
        result = magic(shell, f"models.verify {tiny_model} --no-cache")
    assert result["ok"] is True
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        pages = [output.data.get("text/html", "") for output in captured.outputs]
        assert any("llamaforge-progress" in page and "verify" in page for page in pages)
    else:  # with ipywidgets the same events drive a progress widget
        assert any("application/vnd.jupyter.widget-view+json" in output.data for output in captured.outputs)


def test_background_job(shell: Any, tiny_model: Path) -> None:
    job = magic(shell, f"models.verify {tiny_model} --no-cache --background")
    assert isinstance(job, BackgroundJob) and job.operation == "models.verify"
    result = job.wait()
    assert result["ok"] is True and job.status().state == "succeeded"
    assert "succeeded" in job._repr_html_() and job.logs()
    with pytest.raises(NotebookError, match="background"):
        magic(shell, "recipes.list --background")  # only long-running operations take it


def test_python_api(lf_home: Path) -> None:
    result = run("recipes.list")
    assert isinstance(result, OperationResult)
    assert "default" in [item["name"] for item in result["recipes"]]
    with pytest.raises(NotebookError, match="--ctx"):
        run("fit", model="x.gguf")


def test_python_api_refuses_booleans_for_numbers_and_a_name_that_is_no_string(lf_home: Path) -> None:
    # pydantic reads True as 1: this planned a context of one token and reported it as a fit
    with pytest.raises(NotebookError) as boolean:
        run("fit", model="x.gguf", ctx=True, gpu="rtx3090")
    assert boolean.value.message == "--ctx: True is not a number" and boolean.value.exit_code == 2
    with pytest.raises(NotebookError) as listed:
        run("smoke", concurrency=[2, False], background=True)
    assert listed.value.message == "--concurrency[1]: False is not a number"
    with pytest.raises(NotebookError) as unnamed:
        run(123)  # type: ignore[arg-type]
    assert unnamed.value.message == "the operation is named by a string, not int 123"
    assert unnamed.value.hint is not None and 'run("models.fit"' in unnamed.value.hint


def test_widget_progress_when_ipywidgets_is_installed(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ipywidgets")  # optional: without it notebooks get the HTML progress above
    from llamaforge.fronts.jupyter_progress import WidgetProgress, progress_view

    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    view = progress_view("build")
    assert isinstance(view, WidgetProgress)
    with capture_output() as captured:
        view.event(Event("progress", "compiling", stage="compile", completed=3, total=10))
        view.finish("succeeded", 3.0)
    assert any("application/vnd.jupyter.widget-view+json" in output.data for output in captured.outputs)
    bar = view._bar
    assert (bar.value, bar.max, bar.bar_style) == (10.0, 10.0, "success")
