"""Model arguments as a user gives them, through real processes of the ``llamaforge`` console script and the real
resolver: what is not a GGUF (``/etc/passwd``, an empty or truncated file, a GGUF with nothing in it) never
reaches the model store, a directory or a missing file is named as such, a local ``.gguf`` is fetched as a
model (never read as a recipe), a vocab-only GGUF is said to be one, and a download prints its progress in MiB
where no bar can be drawn (stderr piped), from a real HTTP server on loopback."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import gguf
import pytest
from rich.console import Console

from fakehub import FakeHub, random_gguf, serve
from helpers import write_mini_vocab
from llamaforge.core.errors import InvalidOption, LlamaforgeError, ModelError
from llamaforge.core.events import Event
from llamaforge.fronts.cli import ConsoleReporter
from llamaforge.fronts.jupyter_progress import _ProgressState
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.models import store as modelstore
from llamaforge.models.argument import resolve_model_argument
from llamaforge.models.fetch import fetch_model
from llamaforge.models.recipes import ModelRecipe, load_model_recipe

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[1]
LLAMAFORGE = [sys.executable, "-c", "from llamaforge.fronts.cli import main; main()"]
MiB = 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny qwen3 model, a vocab-only GGUF shaped like llama.cpp's (28 blocks, no tensors), and things that are
    no model: an empty file, a truncated GGUF, a GGUF with neither tensors nor vocabulary, a directory."""
    root = tmp_path_factory.mktemp("model-inputs")
    vocab = write_mini_vocab(root / "mini-vocab.gguf")
    tiny = root / "tiny-qwen3.gguf"
    write_tiny_model(tiny, TinyModelSpec(arch="qwen3"), vocab)
    vocab_only = root / "vocab-only.gguf"
    writer = gguf.GGUFWriter(vocab_only, "qwen3")
    writer.add_block_count(28)  # the old verdict listed every tensor of every block as missing
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(64)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    nothing = root / "nothing.gguf"
    writer = gguf.GGUFWriter(nothing, "qwen3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    empty = root / "empty.gguf"
    empty.write_bytes(b"")
    truncated = root / "truncated.gguf"
    truncated.write_bytes(tiny.read_bytes()[:100])
    directory = root / "a-directory"
    directory.mkdir()
    return {
        "tiny": tiny,
        "vocab_only": vocab_only,
        "nothing": nothing,
        "empty": empty,
        "truncated": truncated,
        "directory": directory,
    }


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh home; stdout and stderr are pipes, as in CI."""
    environ = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    return {
        **environ,
        "LLAMAFORGE_HOME": str(tmp_path / "home"),
        "LLAMAFORGE_LOCK_FILE": str(tmp_path / "lock"),
    }


def llamaforge(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LLAMAFORGE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def stored(home: Path) -> list[Path]:
    """Every file in the model store's entries, partial downloads and quarantine."""
    root = home / "models"
    return [
        path
        for sub in ("sha256", "partial", "quarantine")
        for path in (root / sub).rglob("*")
        if path.is_file() and not path.name.endswith(".lock")
    ]


# --- bad model arguments, on the command line -------------------------------------------------------------------

BAD_INPUTS: list[tuple[str, list[str], int, str]] = [
    (
        "fetch file:///etc/passwd",
        ["models.fetch", "file:///etc/passwd"],
        ModelError.exit_code,
        "error: file:///etc/passwd is not a GGUF model: it does not start with the bytes 'GGUF'",
    ),
    (
        "fetch /etc/passwd",
        ["models.fetch", "/etc/passwd"],
        ModelError.exit_code,
        "error: file:///etc/passwd is not a GGUF model",
    ),
    (
        "fetch an empty file",
        ["models.fetch", "{empty}"],
        ModelError.exit_code,
        "is empty (0 bytes): not a GGUF model",
    ),
    (
        "fetch file:// of an empty file",
        ["models.fetch", "file://{empty}"],
        ModelError.exit_code,
        "is empty (0 bytes): not a GGUF model",
    ),
    (
        "fetch a truncated GGUF",
        ["models.fetch", "{truncated}"],
        ModelError.exit_code,
        "truncated.gguf is not a well-formed GGUF model: ",
    ),
    (
        "fetch a GGUF with nothing in it",
        ["models.fetch", "{nothing}"],
        ModelError.exit_code,
        "nothing.gguf is a GGUF with no tensors and no vocabulary: there is no model in it",
    ),
    (
        "fetch a directory",
        ["models.fetch", "{directory}"],
        InvalidOption.exit_code,
        "a-directory is a directory: name a .gguf file or a recipe",
    ),
    (
        "fetch a missing .gguf",
        ["models.fetch", "{directory}/missing.gguf"],
        ModelError.exit_code,
        "missing.gguf does not exist",
    ),
    (
        "inspect a directory",
        ["models.inspect", "{directory}"],
        InvalidOption.exit_code,
        "a-directory is a directory: name a .gguf file or a recipe",
    ),
    (
        "verify a directory",
        ["models.verify", "{directory}"],
        InvalidOption.exit_code,
        "a-directory is a directory: name a .gguf file or a recipe",
    ),
    (
        "inspect /etc/passwd",
        ["models.inspect", "/etc/passwd"],
        ModelError.exit_code,
        "/etc/passwd: not a GGUF file (bad magic)",
    ),
]


@pytest.mark.parametrize(
    ("args", "code", "words"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_a_bad_model_argument_is_refused_in_one_line_and_nothing_is_stored(
    args: list[str], code: int, words: str, files: dict[str, Path], env: dict[str, str]
) -> None:
    done = llamaforge([arg.format(**files) for arg in args], env)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.returncode == code, done.stderr
    lines = done.stderr.splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("error: "))
    assert words.format(**files) in lines[at], done.stderr
    assert all(line.startswith("» ") for line in lines[:at]), done.stderr  # what it was doing, if anything
    assert all(line.startswith("  hint: ") for line in lines[at + 1 :]), done.stderr  # one error, its hint
    assert done.stdout == ""
    assert stored(Path(env["LLAMAFORGE_HOME"])) == []  # nothing published, no half-written .part left


def test_a_local_gguf_is_fetched_as_a_model_and_a_vocab_only_one_says_so(
    files: dict[str, Path], env: dict[str, str]
) -> None:
    """It used to be read as a TOML recipe ("'utf-8' codec can't decode byte 0x80")."""
    done = llamaforge(["models.fetch", str(files["tiny"]), "--json"], env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["source"] == files["tiny"].as_uri() and not result["cached"]
    assert Path(result["path"]).read_bytes() == files["tiny"].read_bytes()
    vocab = llamaforge(["models.fetch", str(files["vocab_only"])], env)
    assert vocab.returncode == 0, vocab.stderr
    assert "vocab-only: no tensors (it cannot be served)" in vocab.stderr


def test_inspect_and_verify_say_vocab_only(files: dict[str, Path], env: dict[str, str]) -> None:
    shown = llamaforge(["models.inspect", str(files["vocab_only"])], env)
    assert shown.returncode == 0, shown.stderr
    assert "vocab-only (no tensors" in shown.stdout and "None bits/weight" not in shown.stdout
    verdict = llamaforge(["models.verify", str(files["vocab_only"]), "--json"], env)
    assert verdict.returncode == ModelError.exit_code, verdict.stderr
    findings = [f for f in json.loads(verdict.stdout)["findings"] if f["check"] == "tensors"]
    assert [f["message"] for f in findings] == [
        "vocab-only: no tensors (a vocabulary file: llama.cpp cannot load it as a model)"
    ]
    human = llamaforge(["models.verify", str(files["vocab_only"])], env)
    assert human.stdout.count("vocab-only: no tensors") == 1 and "missing tensor" not in human.stdout


# --- the --model resolver (deploy, deploy.plan, smoke) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "error", "words"),
    [
        (
            "/etc/passwd",
            ModelError,
            "/etc/passwd is not a GGUF model: it does not start with the bytes 'GGUF'",
        ),
        ("{empty}", ModelError, "is empty (0 bytes)"),
        ("{truncated}", ModelError, "is not a well-formed GGUF"),
        ("{directory}", InvalidOption, "is a directory: name a .gguf file or a recipe"),
        ("{vocab_only}", InvalidOption, "has no tensors: a vocab-only file cannot be served"),
        ("file:///etc/passwd", ModelError, "file:///etc/passwd is not a GGUF model"),
    ],
)
def test_the_model_resolver_refuses_what_cannot_be_served(
    argument: str, error: type[Exception], words: str, files: dict[str, Path], lf_home: Path
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        resolve_model_argument(argument.format(**files))
    assert not list(
        (lf_home / "models" / "sha256").glob("*/*.gguf")
    )  # nothing that is no model was published


def test_the_model_resolver_takes_a_file_a_recipe_and_a_url(
    files: dict[str, Path], lf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMAFORGE_LOCK_FILE", str(tmp_path / "lock.toml"))
    local = resolve_model_argument(str(files["tiny"]))
    assert (local.path, local.label, local.recipe) == (files["tiny"].resolve(), "tiny-qwen3", None)
    recipe = tmp_path / "my-model.toml"
    recipe.write_text(f'source = "{files["tiny"].as_uri()}"\n', encoding="utf-8")
    by_recipe = resolve_model_argument(str(recipe))
    assert by_recipe.recipe is not None and by_recipe.label == "my-model"
    assert by_recipe.path.parent.parent == lf_home / "models" / "sha256"  # the verified store copy
    assert resolve_model_argument(files["tiny"].as_uri()).path == by_recipe.path
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "file:///etc/passwd"\n', encoding="utf-8")
    with pytest.raises(ModelError, match=r"file:///etc/passwd is not a GGUF model"):
        resolve_model_argument(str(bad))
    hosted = tmp_path / "hosted.toml"
    hosted.write_text('source = "file://relative/x.gguf"\n', encoding="utf-8")
    with pytest.raises(LlamaforgeError) as refused:
        resolve_model_argument(str(hosted))
    assert "source: file sources name an absolute path: file:///abs/path.gguf" in refused.value.render()


# --- downloads --------------------------------------------------------------------------------------------------


@pytest.fixture
def hub(lf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.delenv("LLAMAFORGE_MAX_UNPINNED_DOWNLOAD", raising=False)
    with serve(FakeHub()) as fake:
        yield fake


def test_a_download_that_is_no_gguf_ends_at_its_first_bytes(hub: FakeHub, lf_home: Path) -> None:
    page = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>" * 1000
    name = hub.add("org/repo", "model.gguf", page)
    with pytest.raises(ModelError, match=r"is not a GGUF model: it starts with b'<!DOCTYP', not the bytes"):
        fetch_model(hub.file_url(name), backoff_s=0)
    assert stored(lf_home) == []
    assert len(hub.requests(method="GET")) == 1  # not retried


def test_a_download_whose_header_is_broken_is_quarantined_not_published(hub: FakeHub, lf_home: Path) -> None:
    broken = b"GGUF" + b"\xff" * 4000  # the magic, then a version no reader knows
    name = hub.add("org/repo", "model.gguf", broken)
    with pytest.raises(
        ModelError, match="is not a well-formed GGUF model: unsupported GGUF version"
    ) as caught:
        fetch_model(hub.file_url(name), backoff_s=0)
    assert "nothing was published; the file was moved to" in caught.value.message
    assert modelstore.lookup(name) is None
    assert [path.parent.name for path in stored(lf_home)] == ["quarantine"]


def test_a_store_entry_that_is_no_gguf_is_quarantined_and_fetched_again(
    lf_home: Path, tmp_path: Path
) -> None:
    """An entry published before fetch checked the format is not served from the cache."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    part = tmp_path / "part"
    part.write_bytes(junk.read_bytes())
    digest = hashlib.sha256(junk.read_bytes()).hexdigest()
    modelstore.publish(part, sha256=digest, filename="junk.gguf", manifest={"source": "old"})
    assert modelstore.lookup(digest) is not None
    events: list[Event] = []
    recipe = ModelRecipe(name="junk", source=junk.as_uri(), sha256=digest)
    with pytest.raises(ModelError, match="is not a GGUF model"):
        fetch_model(recipe, reporter=events.append)
    assert modelstore.lookup(digest) is None
    assert any(e.kind == "warning" and "store entry moved to" in e.message for e in events)


def test_a_download_prints_its_progress_in_mib_when_stderr_is_piped(
    hub: FakeHub, env: dict[str, str], tmp_path: Path
) -> None:
    """Without a terminal a download printed nothing (a 12 s download) or, with --verbose, one identical
    "downloading" line per chunk; on a terminal the bar counted raw bytes."""
    name = hub.add("org/repo", "model.gguf", random_gguf(24 * MiB, seed=5))
    done = llamaforge(["models.fetch", hub.file_url(name)], env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("fetch ")]
    shape = re.compile(r"fetch (\d+)/24 MiB \((\d+) %\)( [\d.]+ MiB/s(, ~\S+ left)?)?")
    assert lines and all(shape.fullmatch(line) for line in lines), done.stderr
    assert lines[0].startswith("fetch 1/24 MiB (4 %)") and lines[-1].startswith("fetch 24/24 MiB (100 %) ")
    percents = [int(match.group(2)) for line in lines if (match := shape.fullmatch(line))]
    assert all(b - a >= 10 for a, b in itertools.pairwise(percents[:-1]))  # every 10 %, no more often
    assert len(lines) <= 12
    assert (Path(env["LLAMAFORGE_HOME"]) / "models" / "sha256" / name / name).is_file()
    afresh = {**env, "LLAMAFORGE_HOME": str(tmp_path / "afresh")}
    verbose = llamaforge(["models.fetch", hub.file_url(name), "--verbose"], afresh)
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stderr.count(f"downloading {name}") == 1, verbose.stderr


def test_byte_counts_print_every_30_s_or_10_percent_with_their_rate() -> None:
    out, now = io.StringIO(), [0.0]
    reporter = ConsoleReporter(Console(file=out, width=80), verbose=False, clock=lambda: now[0])
    for mib in range(1, 401):  # 400 MiB at 4 MiB/s
        now[0] = mib / 4
        reporter(
            Event(
                "progress", "downloading", stage="fetch", completed=mib * MiB, total=400 * MiB, unit="bytes"
            )
        )
    lines = out.getvalue().splitlines()
    assert lines[0] == "fetch 1/400 MiB (0 %)"
    assert lines[1] == "fetch 42/400 MiB (10 %) 4.0 MiB/s, ~1m27s left"
    assert lines[-1] == "fetch 400/400 MiB (100 %) 4.0 MiB/s"
    assert len(lines) == 11
    out.truncate(0), out.seek(0)
    for mib in range(1, 201):  # no total (no Content-Length): every 30 s, at 2 MiB/s
        now[0] = 1000 + mib / 2
        reporter(Event("progress", "downloading", stage="fetch", completed=mib * MiB, unit="bytes"))
    assert out.getvalue().splitlines() == [
        "fetch 1.0 MiB",
        "fetch 61 MiB 2.0 MiB/s",
        "fetch 121 MiB 2.0 MiB/s",
        "fetch 181 MiB 2.0 MiB/s",
    ]


def test_a_terminal_bar_and_a_notebook_count_mib() -> None:
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, force_terminal=True, width=120), verbose=True)
    for mib in (100, 200, 300, 400):
        reporter(
            Event(
                "progress",
                "downloading x.gguf",
                stage="fetch",
                completed=mib * MiB,
                total=400 * MiB,
                unit="bytes",
            )
        )
    reporter.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "400.0/400.0 MiB" in text and str(400 * MiB) not in text
    said = [line for line in re.split(r"[\r\n]", text) if line.strip() == "downloading x.gguf"]
    assert len(said) == 1, text  # verbose: the message once above the bar, not once per chunk
    state = _ProgressState("models.fetch")
    state.apply(
        Event("progress", "downloading", stage="fetch", completed=120 * MiB, total=400 * MiB, unit="bytes")
    )
    assert "[120.0/400.0 MiB]" in state.text() and "120.0/400.0 MiB" in state.as_html()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # the hub URL would be normalized to another repository's file
        (
            'source = "hf://a/b/../../etc/passwd.gguf"\n',
            "source: a hub source's owner, repo and path hold no",
        ),
        ('source = "ms://a/b//x.gguf"\n', "source: a hub source's owner, repo and path hold no"),
        # a file:// or https:// source has no revision: it was ignored without a word
        ('source = "file:///m.gguf"\nrevision = "main"\n', "revision: revision applies to hf:// and ms://"),
        # no GGUF states Q9_X: every file failed verification, however good
        ('source = "file:///m.gguf"\n[expect]\nfile_type = "Q9_X"\n', "expect.file_type: 'Q9_X' is no GGUF"),
    ],
)
def test_a_model_recipe_that_no_file_can_satisfy_is_refused_naming_its_field(
    text: str, words: str, tmp_path: Path
) -> None:
    recipe = tmp_path / "m.toml"
    recipe.write_text(text, encoding="utf-8")
    with pytest.raises(LlamaforgeError) as refused:
        load_model_recipe(str(recipe))
    assert f"invalid model recipe {recipe}" in refused.value.message and words in refused.value.message


def test_a_file_type_is_compared_by_its_name_in_any_spelling() -> None:
    for spelling in ("Q4_K_M", "q4_k_m", "MOSTLY_Q4_K_M", "UD-Q4_K_M"):
        assert (
            ModelRecipe(source="file:///m.gguf", expect={"file_type": spelling}).expect.file_type == spelling
        )
