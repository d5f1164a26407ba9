"""Hostile chat templates: the audit of ``models.verify`` walks the parsed template and never evaluates it, so a
template built to freeze it or to fill memory costs milliseconds, and SIGTERM stops a verify at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from helpers import REPO, write_mini_vocab
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.models import chat_template
from llamaforge.models.chat_template import audit_chat_template, check_templates
from llamaforge.models.verify import verify_model

pytestmark = pytest.mark.quick

# Jinja's constant folding computes 9 ** 43046721 here (minutes of one C call that no signal interrupts).
POWER_TOWER = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ (9 ** (9 ** 8)) ~ message.content }}<|im_end|>\n{%- endfor %}"
)
# ... and here a 1.5 GB string.
STRING_BOMB = "{%- for message in messages %}{{ '__' ~ 'x' * 1500000000 ~ message.content }}{%- endfor %}"
LIMIT = chat_template.MAX_TEMPLATE_CHARS

# template, whether Jinja parses it, a flag the audit must raise
HOSTILE = {
    "power tower": (POWER_TOWER, True, "raises to a power"),
    "string bomb": (STRING_BOMB, True, "multiplies by 1500000000"),
    "attribute chain": ("{{ " + "a." * 60000 + "b }}", True, "template nodes: too large to audit"),
    "parentheses": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", True, "nests expressions too deeply"),
    "string sum": ("{{ " + " + ".join(["'ab'"] * 20000) + " }}", True, "characters of string constants"),
    "filter chain": ("{{ '__X'" + "|lower" * 20000 + " ~ '__' }}", True, "builds the dunder string '__x__'"),
    "over the limit": ("x" * (LIMIT + 1), True, f"the limit is {LIMIT}"),
    "integer literal": ("{{ " + "9" * 5000 + " }}", False, "does not parse with Jinja2"),
    "flag flood": ("{{ os }}\n" * 5000, True, "more flags like these"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_template_is_audited_quickly_in_little_memory(name: str) -> None:
    template, parses, needle = HOSTILE[name]
    started = time.monotonic()
    result = audit_chat_template(template)
    seconds = time.monotonic() - started
    assert result[0] is parses
    assert any(needle in flag for flag in result[1]), result[1]
    assert len(result[1]) <= chat_template.MAX_FLAGS + 1
    # Generous bounds for a busy machine: folding either issue template took minutes, or 1.5 GB.
    assert seconds < (5.0 if len(template) > 10_000 else 2.0), seconds
    tracemalloc.start()
    try:
        assert audit_chat_template(template) == result
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_the_issue_templates_cost_milliseconds() -> None:
    for template in (POWER_TOWER, STRING_BOMB):
        started = time.monotonic()
        parses, flags = audit_chat_template(template)
        assert parses and flags
        assert time.monotonic() - started < 0.5


def test_joined_constants_are_still_read() -> None:
    """Strings built only from string constants (joins, +, reshaping filters) are still checked; nothing else
    is computed."""
    cases = {
        "{{ x['__cla' ~ 'ss__'] }}": "'__class__'",
        "{{ ('__CLA' ~ 'SS__')|lower }}": "'__CLASS__'",
        "{{ x ~ '__cl' ~ 'ass__' ~ y }}": "'__class__'",
        "{{ '__cl' + 'ass__' }}": "'__class__'",
        "{{ x[('__ss' ~ 'alc__')|reverse] }}": "'__class__'",
    }
    for template, needle in cases.items():
        parses, flags = audit_chat_template(template)
        assert parses and any("builds the dunder string" in f and needle in f for f in flags), (
            template,
            flags,
        )
    # A repeat a real template uses is no finding, nor is a join with a variable in it.
    assert audit_chat_template("{{ '    ' * depth }}{{ '=' * 80 }}{{ '_' ~ x ~ '_' }}") == (True, [])


def test_hostile_templates_fail_the_template_check() -> None:
    findings = check_templates(
        {
            "tokenizer.chat_template": POWER_TOWER,
            "tokenizer.chat_template.tool_use": STRING_BOMB,
            "tokenizer.chat_template.rag": "x" * (LIMIT + 1),
        }
    )
    assert {(f.subject, f.status) for f in findings} == {
        ("tokenizer.chat_template", "fail"),
        ("tokenizer.chat_template.tool_use", "fail"),
        ("tokenizer.chat_template.rag", "fail"),
    }


@pytest.fixture(scope="module")
def power_tower_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    vocab = write_mini_vocab(root / "vocab.gguf", 300, POWER_TOWER)
    return write_tiny_model(root / "power-tower.gguf", TinyModelSpec(), vocab).path


def test_verify_of_a_hostile_template_is_quick(power_tower_model: Path, lf_home: Path) -> None:
    started = time.monotonic()
    report = verify_model(power_tower_model, use_cache=False)
    assert time.monotonic() - started < 5.0
    assert not report.ok and report.checks()["template"] == "fail"


def test_sigterm_during_verify_ends_it_promptly(power_tower_model: Path, tmp_path: Path) -> None:
    """The real CLI, verifying a model whose template froze the old audit: SIGTERM, sent as soon as the header
    check starts, ends the process within seconds (it used to wait for the fold to finish, over a minute)."""
    env = {**os.environ, "LLAMAFORGE_HOME": str(tmp_path / "home")}
    with subprocess.Popen(
        [sys.executable, "-m", "invoke", "models.verify", str(power_tower_model)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stderr is not None
            seen = ""
            while "checking the header" not in seen:
                line = process.stderr.readline()
                assert line, f"verify ended before its header check: {seen}"
                seen += line
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            code = process.wait(timeout=30)
            assert time.monotonic() - signalled < 10.0
            rest = process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
    # Terminated while verifying (143), or the verdict came first: the template check failed (9).
    assert code in (143, 9), rest
    assert "Traceback" not in rest
    if code == 9:
        assert "raises to a power" in rest
