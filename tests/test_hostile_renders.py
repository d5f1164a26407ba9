"""Hostile values through every rendered file: a newline, ``$()``, backticks, ``;``, ``%``, ``\\``, ``"``, ``'``
and ``${VAR}`` in each field. Each is refused with a LlamaforgeError, or the file's own reader gets back exactly
the value: bash runs the shell scripts (with ``cmake``, ``docker``, ``readlink`` and ``id`` stand-ins that record
their arguments), ``yaml.safe_load`` reads compose and Kubernetes (with their ``$$``), ``cmake -P`` reads CMake's
quoting, systemd itself starts a unit on a test host and the program records the arguments it got, and
``systemd-analyze verify`` checks each unit. No payload adds a line, an instruction or a key. Only renders: no
image is built and nothing is deployed."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.templates import render
from llamaforge.deploy.manifests.files import ManifestInputs, render_compose, render_kubernetes
from llamaforge.deploy.release import Layout, ReleaseSpec, ip_address_of, listen_address
from llamaforge.deploy.targets.container import ContainerImage, render_container
from llamaforge.deploy.targets.systemd import render_unit
from llamaforge.platforms.linux import COMPILER_RUNTIME
from llamaforge.serve.launcher import LlamaFlags
from testhosts import TestHost

pytestmark = pytest.mark.quick

PAYLOADS = {
    "newline": "q8_0\nExecStartPre=+/bin/sh -c 'touch /pwned'",
    "subshell": "$(touch /tmp/pwned)",
    "backticks": "`touch /tmp/pwned`",
    "semicolon": "x; touch /tmp/pwned",
    "lone-semicolon": ";",
    "percent": "100%n%%",
    "backslash": "a\\b\\",
    "double-quote": 'a"b" "c',
    "single-quote": "a'b' 'c",
    "variable": "${HOME}$USER$$",
}
IDS = list(PAYLOADS)
SPEC = ReleaseSpec(
    build_key="0c746799120471183e5949a10bb9dc1e",
    build_dir=Path("/nowhere"),
    manifest_sha256="a" * 64,
    model=Path("/srv/models/m.gguf"),
    model_sha256="b" * 64,
    model_size=1000,
    port=8081,
)
INPUTS = ManifestInputs(name="lab", image="llamaforge/llama-server:" + SPEC.build_key, backend="cpu")


def hostile(value: str) -> LlamaFlags:
    return LlamaFlags(cache_type_k=value, cache_type_v=value)


# Values that reach files only once checked


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_names_roots_addresses_images_and_claims_are_refused(payload: str) -> None:
    for make in (
        lambda: Layout(payload),
        lambda: Layout("lab", f"/opt/{payload}"),
        lambda: Layout("lab", payload),
        lambda: ip_address_of(payload, "--listen"),
        lambda: listen_address(payload, api_key=True),
        lambda: ip_address_of(f"fe80::1%{payload}", "--listen"),
        lambda: replace(INPUTS, listen=f"127.0.0.1{payload}"),
        lambda: replace(INPUTS, image=payload),
        lambda: replace(INPUTS, init_image=f"img:{payload}"),
        lambda: replace(INPUTS, model_claim=payload),
    ):
        with pytest.raises(LlamaforgeError):
            make()


# Shell: the docker target's script and the build scripts, run by bash with recording stand-ins


def stand_ins(directory: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Programs that append their name and each argument (base64, one a line) to ``calls`` and succeed."""
    directory.mkdir(exist_ok=True)
    for name in names:
        program = directory / name
        program.write_text(
            f'#!/bin/sh\n{{ echo "== {name}"; for arg; do printf %s "$arg" | base64 -w0; echo; done; }}'
            f' >> "{directory}/calls"\n[ "$1" = -u ] || [ "$1" = -g ] && echo 0\n'
            f'[ "$1" = -f ] && echo /release\nexit 0\n',
            encoding="utf-8",
        )
        program.chmod(0o755)
    return {"PATH": f"{directory}:/usr/bin:/bin", "HOME": str(directory)}


def calls(directory: Path) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for line in (directory / "calls").read_text(encoding="utf-8").splitlines():
        if line.startswith("== "):
            found.append((line[3:], []))
        else:
            found[-1][1].append(base64.b64decode(line).decode())
    return found


def run_script(
    text: str, tmp_path: Path, names: tuple[str, ...], shell: str = "bash"
) -> list[tuple[str, list[str]]]:
    script = tmp_path / "script"
    script.write_text(text, encoding="utf-8")
    assert subprocess.run([shell, "-n", str(script)], check=False).returncode == 0
    env = {
        **stand_ins(tmp_path / "bin", names),
        "LLAMAFORGE_SRC": str(tmp_path),
        "LLAMAFORGE_BUILD": str(tmp_path),
        "LLAMAFORGE_OUT": str(tmp_path / "out"),
        "LLAMAFORGE_JOBS": "1",
    }
    subprocess.run([shell, str(script)], env=env, cwd=tmp_path, capture_output=True, check=False, timeout=60)
    assert not Path("/tmp/pwned").exists()
    return calls(tmp_path / "bin")


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_the_container_script_hands_docker_exactly_the_values(payload: str, tmp_path: Path) -> None:
    image = ContainerImage(f"sha256:{'e' * 64}{payload}", "tag")
    try:
        text = render_container(replace(SPEC, flags=hostile(payload)), Layout("lab"), image, user=payload)
    except LlamaforgeError:
        pytest.fail("the container script quotes every value: nothing needs refusing")
    run = [
        args
        for name, args in run_script(text, tmp_path, ("docker", "id", "readlink"), "sh")
        if name == "docker"
    ]
    assert run[-1][0] == "run" and image.id in run[-1], run
    assert run[-1][-5:] == ["--no-webui", "-ctk", payload, "-ctv", payload], run
    ids = [args for name, args in calls(tmp_path / "bin") if name == "id"]
    assert ids == [["-u", payload], ["-g", payload]]


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_the_build_script_hands_cmake_exactly_the_values(payload: str, tmp_path: Path) -> None:
    text = render(
        "linux/build.sh.j2",
        recipe_name=payload,
        script_steps="",
        tool_versions=(),
        cmake_args=[f"-DLLAMA_X={payload}"],
        targets=[payload, "llama-server"],
        source_date_epoch=payload,
        packages=[payload],
        runtime_libraries=COMPILER_RUNTIME,
    )
    cmake = [
        args
        for name, args in run_script(text, tmp_path, ("cmake", "objdump", "nproc", "ldd"))
        if name == "cmake"
    ]
    assert cmake[0][4] == f"-DLLAMA_X={payload}", cmake
    assert cmake[1][-2:] == [payload, "llama-server"], cmake  # --target


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_the_powershell_script_quotes_each_value_as_one_literal(payload: str) -> None:
    # No PowerShell here: its rule for a single-quoted string (literal, '' for a quote) is read back by hand.
    text = render(
        "windows/build.ps1.j2",
        recipe_name=payload,
        backend="cpu",
        cmake_args=[payload],
        targets=[payload],
        source_date_epoch=payload,
    )
    baseline = render(
        "windows/build.ps1.j2",
        recipe_name="x",
        backend="cpu",
        cmake_args=["x"],
        targets=["x"],
        source_date_epoch="x",
    )
    assert len(text.splitlines()) == len(baseline.splitlines()) + payload.count("\n") * 4
    literal = "'" + payload.replace("'", "''") + "'"
    assert f"$env:SOURCE_DATE_EPOCH = {literal}\n" in text and f"\n  {literal}\n)" in text


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_cmake_reads_back_each_quoted_value(payload: str, tmp_path: Path) -> None:
    cmake = shutil.which("cmake")
    assert cmake, "cmake missing"
    from llamaforge.core.templates import _environment

    quote = _environment().filters["cmake"]
    try:
        quoted = quote(payload)
    except LlamaforgeError:
        assert "\n" in payload
        return
    script = tmp_path / "read.cmake"
    script.write_text(f'set(value {quoted})\nfile(WRITE out "${{value}}")\n', encoding="utf-8")
    result = subprocess.run(
        [cmake, "-P", str(script)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text(encoding="utf-8") == payload


# YAML: compose and Kubernetes


def unescaped(value: Any) -> Any:
    """Compose's and Kubernetes' reading of ``$$``."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    return [unescaped(item) for item in value]


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_compose_reads_back_exactly_the_values(payload: str) -> None:
    spec = replace(SPEC, model=Path(f"/srv/{payload}.gguf"), flags=hostile(payload))
    text = render_compose(spec, replace(INPUTS, listen="0.0.0.0", api_key_file=payload))
    document = yaml.safe_load(text)
    assert set(document) == {"name", "services", "secrets"} and set(document["services"]) == {"llama-server"}
    service = document["services"]["llama-server"]
    assert unescaped(service["command"])[1:5] == ["-ctk", payload, "-ctv", payload]
    assert unescaped(service["volumes"][0]["source"]) == f"/srv/{payload}.gguf"
    assert unescaped(document["secrets"]["api-key"]["file"]) == payload
    baseline = yaml.safe_load(render_compose(SPEC, replace(INPUTS, listen="0.0.0.0")))
    assert set(service) == set(baseline["services"]["llama-server"])


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_kubernetes_reads_back_exactly_the_values(payload: str) -> None:
    inputs = replace(
        INPUTS, backend="cuda", init_image="registry.example/llamaforge:0.1", model_recipe=payload
    )
    service, deployment = yaml.safe_load_all(render_kubernetes(replace(SPEC, flags=hostile(payload)), inputs))
    pod = deployment["spec"]["template"]["spec"]
    assert unescaped(pod["initContainers"][0]["command"])[4] == payload
    assert unescaped(pod["containers"][0]["args"])[1:5] == ["-ctk", payload, "-ctv", payload]
    assert set(deployment) == set(service) == {"apiVersion", "kind", "metadata", "spec"}


# Dockerfile: LABEL values


def docker_double_quoted(word: str) -> str:
    """Docker's reading of a double-quoted word (its shell lexer: \\ escapes only \\, " and $)."""
    assert word[0] == word[-1] == '"'
    out, index = [], 1
    while index < len(word) - 1:
        if word[index] == "\\" and word[index + 1] in '\\"$':
            index += 1
        out.append(word[index])
        index += 1
    return "".join(out)


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_runtime_dockerfile_labels_read_back_exactly(payload: str) -> None:
    context = {
        "key": payload,
        "base": "debian:bookworm-slim",
        "packages": ["curl"],
        "uid": 10001,
        "prefix": "/opt/llamaforge",
        "port": 8080,
        "missing_ok": [payload],
        "healthcheck": payload,
    }
    try:
        text = render("deploy/Dockerfile.runtime.j2", **context, labels={"org.llamaforge.x": payload})
    except LlamaforgeError:
        assert "\n" in payload
        return
    plain = {**context, "key": "k", "missing_ok": ["m"], "healthcheck": "h"}
    baseline = render("deploy/Dockerfile.runtime.j2", **plain, labels={"org.llamaforge.x": "x"})
    assert len(text.splitlines()) == len(baseline.splitlines())
    label = next(line for line in text.splitlines() if line.startswith("LABEL "))
    assert docker_double_quoted(label.split("=", 1)[1]) == payload
    with pytest.raises(LlamaforgeError):
        render("deploy/Dockerfile.runtime.j2", **{**context, "base": payload}, labels={})


# systemd: each unit verified here, and started by systemd on a test host


def unit_with(payload: str, root: str = "/usr") -> str:
    argv = ["/usr/local/bin/lf-argv", payload, f"--x={payload}", "-ctk", payload]
    return render(
        "deploy/llama-server.service.j2",
        name="lab",
        user="lfhostile",
        current=f"/opt/{payload}",
        root=root,
        argv=argv,
        rpc=False,
        backend="cpu",
        ip_allow=["localhost"],
    )


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=IDS)
def test_each_unit_adds_no_directive_and_passes_systemd_analyze_verify(payload: str, tmp_path: Path) -> None:
    with pytest.raises(
        LlamaforgeError
    ):  # through the target, a % is refused (systemd-run takes the settings)
        render_unit(replace(SPEC, flags=hostile(payload + "%")), Layout("lab"))
    try:
        text = unit_with(payload)
    except LlamaforgeError:
        assert "\n" in payload
        return
    keys = [line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert keys == [
        line.split("=", 1)[0] for line in unit_with("x").splitlines() if line and not line.startswith("#")
    ]
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing"
    root = tmp_path / "root"
    binary = root / "usr/local/bin/lf-argv"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    shutil.copytree(Path("/lib/systemd/system"), root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/lfhostile.service").write_text(text, encoding="utf-8")
    result = subprocess.run(
        [analyze, "verify", f"--root={root}", "/etc/systemd/system/lfhostile.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# Each argument and then LD_LIBRARY_PATH, base64-encoded, in the unit's private /tmp (the only place its sandbox
# lets it write; the host reads it there while the unit lives).
ARGV_RECORDER = """#!/bin/sh
out=argv
for arg; do out="$out $(printf %s "$arg" | base64 -w0)"; done
echo "$out $(printf %s "$LD_LIBRARY_PATH" | base64 -w0)" > /tmp/argv
sleep 30
"""


@pytest.mark.docker
def test_systemd_starts_each_unit_with_exactly_the_arguments(test_hosts: list[TestHost]) -> None:
    host = test_hosts[0]
    setup = (
        f"id -u lfhostile >/dev/null 2>&1 || useradd --system lfhostile; "
        f"printf %s {base64.b64encode(ARGV_RECORDER.encode()).decode()} | base64 -d > /usr/local/bin/lf-argv; "
        "chmod 0755 /usr/local/bin/lf-argv"
    )
    assert host.exec(["sh", "-c", setup])[0] == 0
    for name, payload in PAYLOADS.items():
        if "\n" in payload:
            continue  # refused (the unit test above)
        unit = f"lfhostile-{name}.service"
        text = base64.b64encode(unit_with(payload).encode()).decode()
        code, output = host.exec(
            [
                "sh",
                "-c",
                f"printf %s {text} | base64 -d > /etc/systemd/system/{unit} && "
                f"systemctl daemon-reload && systemctl start {unit}",
            ]
        )
        assert code == 0, output
        words: list[str] = []
        for _ in range(50):
            _, shown = host.exec(["sh", "-c", f"cat /tmp/systemd-private-*-{unit}-*/tmp/argv 2>/dev/null"])
            words = shown.split()[1:] if shown.startswith("argv ") else []
            if words:
                break
            time.sleep(0.2)
        got = [base64.b64decode(word).decode() for word in words]
        assert got == [payload, f"--x={payload}", "-ctk", payload, f"/opt/{payload}/lib"], (name, got)
        host.exec(["sh", "-c", f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}"])
    assert host.exec(["test", "-e", "/pwned"])[0] != 0 and not os.path.exists("/tmp/pwned")


def test_the_cli_refuses_a_listen_address_that_is_no_ip_before_rendering(tmp_path: Path) -> None:
    import sys

    from llamaforge.core.errors import InvalidOption

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "deploy.render",
            "--target",
            "compose",
            "--build",
            "none",
            "--listen",
            "127.0.0.1\nx-injected: 1",
            "--model",
            str(tmp_path / "m.gguf"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LLAMAFORGE_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == InvalidOption.exit_code, out.stderr
    assert "is not an IP address" in out.stderr and "Traceback" not in out.stderr
    assert "x-injected" not in out.stdout
