"""The host's CA bundle reaches the builder images that download over TLS: found from PIP_CERT, SSL_CERT_FILE,
REQUESTS_CA_BUNDLE or pip's global.cert (in that order), in the plan, the image tag and the key; --no-ca-bundle and
--ca-bundle override it; a build without a bundle keeps the key it always had; doctor names the bundle and where it
came from. Plans are made through the build operation's own parameter handling and the console script."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke, invoke_json
from llamaforge.build.ca_bundle import find_host_bundle, host_bundle, pip_config_files
from llamaforge.build.ops import BuildParams, _plan_from_params
from llamaforge.build.plan import BuildOptions, BuildPlan, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption

pytestmark = pytest.mark.quick

TEST_CA = Path(__file__).parent / "data" / "test-ca.crt"
VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
# Plan digests and builder tags of builds without a CA bundle, computed before the host's bundle was picked up
# (commit 6f12707): builds published then stay cache hits. The Linux digests moved twice since, on purpose (the
# builder tags did not): when the recipes set LLAMA_BUILD_UI = false, and when the Linux build script began
# copying the compiler's runtime libraries into lib/.
NO_BUNDLE = {
    "cpu": ("a6643cdf794d02bf253589e6aa7b84a48ce3e99a9300db2bdb256e6fe0f12967", "cpu-5deab6154b99080f"),
    "cuda-86": (
        "c5e4d1847a92115eaa0c19b6e4e31b61dc7d3755d368fd7588b377a53865f336",
        "cuda-wheels-b742ec3ca626420e",
    ),
    "windows": ("293c9183fb4a183896f54c01c39de53fac1ce28280fdce50c73cc11397fbda29", "mingw-ea8d03b46519402e"),
}
PARAMS: dict[str, dict[str, Any]] = {
    "cpu": {"backend": "cpu"},
    "cuda-86": {"arch": "86"},
    "windows": {"platform": "windows", "dry_run": True},
}


@pytest.fixture
def no_host_bundle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No variable names a bundle and pip reads no config file; a private HOME (returned) for pip's user files."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "xdg"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return tmp_path / "home"


def _bundle(tmp_path: Path, name: str) -> Path:
    """A copy of the test CA under another name (each copy is a different file with the same certificate)."""
    path = tmp_path / name
    path.write_bytes(TEST_CA.read_bytes())
    return path


def _pip_conf(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body, encoding="utf-8")
    return path


def _dockerfile(plan: BuildPlan) -> str:
    assert plan.environment.image is not None
    return plan.environment.image.dockerfile


# --- where the bundle comes from ------------------------------------------------------------------------------


def test_variables_are_read_in_order_then_pips_config(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_host_bundle() is None
    conf = _pip_conf(tmp_path / "pip.conf", f"[global]\ncert = {_bundle(tmp_path, 'from-pip.crt')}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    for name in reversed(VARIABLES):  # each variable set overrides the ones after it in VARIABLES
        monkeypatch.setenv(name, str(_bundle(tmp_path, f"{name}.crt")))
    for name in VARIABLES:
        found = find_host_bundle()
        assert found is not None and (found.origin, found.path.name) == (name, f"{name}.crt")
        monkeypatch.delenv(name)
    found = find_host_bundle()
    assert found is not None and found.path == tmp_path / "from-pip.crt"
    assert found.origin == f"pip config {conf} (global.cert)"


def test_pip_config_files_are_read_in_pips_order(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = no_host_bundle
    monkeypatch.delenv("PIP_CONFIG_FILE")
    system = _pip_conf(tmp_path / "xdg" / "pip" / "pip.conf", "[global]\ncert = /system.crt\n")
    legacy = _pip_conf(home / ".pip" / "pip.conf", "[global]\ncert = /legacy.crt\n")
    user = _pip_conf(
        home / ".config" / "pip" / "pip.conf", "[global]\ntimeout = 60\n[install]\ncert = /x.crt\n"
    )
    files = pip_config_files()
    assert files.index(system) < files.index(Path("/etc/pip.conf")) < files.index(legacy) < files.index(user)
    # The user's files come after the system's: the legacy file's cert wins, the newer user file sets none
    # (an [install] cert is not the global one).
    found = find_host_bundle()
    assert found is not None and found.path == Path("/legacy.crt") and str(legacy) in found.origin
    _pip_conf(user, "[global]\ncert = /user.crt\n")
    assert (found := find_host_bundle()) is not None and found.path == Path("/user.crt")
    # PIP_CONFIG_FILE comes last, and pip then skips the user's files.
    env_file = _pip_conf(tmp_path / "env.conf", "[global]\ncert = /env.crt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(env_file))
    assert pip_config_files()[-1] == env_file and user not in pip_config_files()
    assert (found := find_host_bundle()) is not None and found.path == Path("/env.crt")


def test_a_pip_config_pip_cannot_read_is_named(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _pip_conf(tmp_path / "broken.conf", "cert = /no-section.crt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(broken))
    with pytest.raises(InvalidOption, match=f"pip config {broken} cannot be read"):
        find_host_bundle()


def test_a_setting_that_names_no_file_is_refused_naming_it(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "gone.crt"))
    with pytest.raises(
        InvalidOption, match=r"SSL_CERT_FILE names the CA bundle .*gone\.crt, which does not exist"
    ):
        host_bundle()
    with pytest.raises(InvalidOption) as refused:
        _plan_from_params(BuildParams(arch="86"))
    assert "SSL_CERT_FILE" in refused.value.message and "--no-ca-bundle" in (refused.value.hint or "")
    plan, options = _plan_from_params(BuildParams(arch="86", no_ca_bundle=True))
    assert options.ca_bundle is None and plan.plan_digest == NO_BUNDLE["cuda-86"][0]


def test_a_file_without_a_certificate_is_no_bundle(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image would trust it as its CA file, and every download over TLS would fail inside the build."""
    junk = tmp_path / "junk.crt"
    junk.write_text("x", encoding="utf-8")
    with pytest.raises(
        InvalidOption, match=r"CA bundle .*junk\.crt \(--ca-bundle\) holds no PEM certificate"
    ):
        _plan_from_params(BuildParams(arch="86", ca_bundle=str(junk)))
    monkeypatch.setenv("SSL_CERT_FILE", str(junk))
    with pytest.raises(InvalidOption, match=r"\(SSL_CERT_FILE\) holds no PEM certificate") as refused:
        _plan_from_params(BuildParams(arch="86"))
    assert "--no-ca-bundle" in (refused.value.hint or "")


# --- what the plan, the image and the key get -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(NO_BUNDLE))
def test_without_a_bundle_the_key_and_image_are_what_they_were(name: str, no_host_bundle: Path) -> None:
    plan, options = _plan_from_params(BuildParams.model_validate(PARAMS[name]))
    assert options.ca_bundle is None and plan.to_json()["ca_bundle"] is None
    assert plan.environment.image is not None
    assert (plan.plan_digest, plan.environment.image.tag.split(":")[1]) == NO_BUNDLE[name]
    assert plan.key_inputs()["ca_bundle_sha256"] is None


def test_the_hosts_bundle_reaches_the_cuda_wheels_image_and_its_key(
    no_host_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _bundle(tmp_path, "proxy-ca.crt")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    plan, options = _plan_from_params(BuildParams(arch="86"))
    image = plan.environment.image
    assert image is not None and image.ca_bundle == bundle and image.ca_bundle_origin == "PIP_CERT"
    assert (options.ca_bundle, options.ca_bundle_from_host) == (bundle, "PIP_CERT")
    assert plan.to_json()["ca_bundle"] == {"path": str(bundle), "from": "PIP_CERT"}
    assert plan.key_inputs()["ca_bundle_sha256"] == hashlib.sha256(TEST_CA.read_bytes()).hexdigest()
    assert plan.plan_digest != NO_BUNDLE["cuda-86"][0]
    dockerfile = _dockerfile(plan)
    # Copied in, joined to the system store before pip runs, and pip and Python's clients pointed at that store.
    copy = dockerfile.index("COPY ca-bundle.crt /usr/local/share/ca-certificates/llamaforge-extra-ca.crt")
    assert copy < dockerfile.index("update-ca-certificates") < dockerfile.index("python3 -m pip install")
    env = dockerfile[dockerfile.index("ENV PIP_CERT") : dockerfile.index("RUN python3 -m pip install")]
    for name in VARIABLES:
        assert f"{name}=/etc/ssl/certs/ca-certificates.crt" in env
    # The same plan given the bundle with --ca-bundle: the same image and key.
    monkeypatch.delenv("PIP_CERT")
    given, _ = _plan_from_params(BuildParams(arch="86", ca_bundle=str(bundle)))
    assert given.environment.image is not None and given.environment.image.tag == image.tag
    assert given.plan_digest == plan.plan_digest


def test_another_bundle_is_another_builder_image(tmp_path: Path) -> None:
    other = tmp_path / "other.crt"
    other.write_bytes(TEST_CA.read_bytes() + b"\n")
    tags = set()
    for bundle in (TEST_CA, other):
        image = plan_build(load_recipe("default"), BuildOptions(cuda_architectures=("86",), ca_bundle=bundle))
        assert image.environment.image is not None
        tags.add(image.environment.image.tag)
    assert len(tags) == 2


def test_the_nvidia_image_trusts_the_bundle_before_apt_reads_its_https_repository(
    no_host_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(TEST_CA))
    plan, _ = _plan_from_params(BuildParams(arch="86", cuda_toolkit="image"))
    dockerfile = _dockerfile(plan)
    assert "COPY ca-bundle.crt" in dockerfile
    assert dockerfile.index("update-ca-certificates") < dockerfile.index("apt-get update")


@pytest.mark.parametrize("name", ["cpu", "windows"])
def test_images_that_download_nothing_over_tls_keep_their_key(
    name: str, no_host_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU and mingw images fetch only from the Debian base's plain-http apt repository (its packages are
    signed): the host's bundle stays out of them, out of their key and out of the options a manifest records."""
    monkeypatch.setenv("PIP_CERT", str(TEST_CA))
    plan, options = _plan_from_params(BuildParams.model_validate(PARAMS[name]))
    assert "ca-bundle.crt" not in _dockerfile(plan)
    assert options.ca_bundle is None and plan.to_json()["ca_bundle"] is None
    assert plan.environment.image is not None
    assert (plan.plan_digest, plan.environment.image.tag.split(":")[1]) == NO_BUNDLE[name]
    # Given by name, a bundle goes into every builder image, as --ca-bundle always did.
    given, given_options = _plan_from_params(
        BuildParams.model_validate({**PARAMS[name], "ca_bundle": str(TEST_CA)})
    )
    assert "COPY ca-bundle.crt" in _dockerfile(given) and given_options.ca_bundle == TEST_CA.resolve()
    assert given.plan_digest != plan.plan_digest


def test_no_ca_bundle_opts_out_and_contradicts_ca_bundle(
    no_host_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CERT", str(TEST_CA))
    plan, options = _plan_from_params(BuildParams(arch="86", no_ca_bundle=True))
    assert options.ca_bundle is None and "ca-bundle.crt" not in _dockerfile(plan)
    assert plan.plan_digest == NO_BUNDLE["cuda-86"][0]
    with pytest.raises(InvalidOption, match="contradict"):
        _plan_from_params(BuildParams(arch="86", no_ca_bundle=True, ca_bundle=str(TEST_CA)))


# --- the console script and doctor -----------------------------------------------------------------------------


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    base = {name: value for name, value in os.environ.items() if name not in VARIABLES}
    return {
        **base,
        "PIP_CONFIG_FILE": os.devnull,
        "HOME": str(tmp_path),
        "XDG_CONFIG_DIRS": str(tmp_path / "xdg"),
        "LLAMAFORGE_HOME": str(tmp_path / "lf-home"),
        **settings,
    }


def test_a_dry_run_shows_the_bundle_and_where_it_came_from(tmp_path: Path) -> None:
    env = _env(tmp_path, PIP_CERT=str(TEST_CA))
    plan = invoke_json("build", "--arch", "86", "--dry-run", env=env)["plan"]
    assert plan["ca_bundle"] == {"path": str(TEST_CA.resolve()), "from": "PIP_CERT"}
    assert "COPY ca-bundle.crt" in plan["files"]["Dockerfile"]
    shown = invoke("build", "--arch", "86", "--dry-run", env=env)
    assert shown.returncode == 0 and f"ca bundle: {TEST_CA.resolve()} (from PIP_CERT)" in shown.stdout
    plan = invoke_json("build", "--arch", "86", "--dry-run", "--no-ca-bundle", env=env)["plan"]
    assert plan["ca_bundle"] is None and plan["plan_digest"] == NO_BUNDLE["cuda-86"][0]
    refused = invoke(
        "build", "--arch", "86", "--dry-run", env=_env(tmp_path, PIP_CERT=str(tmp_path / "gone.crt"))
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "PIP_CERT names the CA bundle" in refused.stderr and "gone.crt" in refused.stderr


def _doctor_line(env: dict[str, str]) -> dict[str, str]:
    result = invoke("doctor", "--json", env=env)
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    line: dict[str, str] = checks["ca bundle"]
    return line


def test_doctor_names_the_bundle_and_where_it_came_from(tmp_path: Path) -> None:
    line = _doctor_line(_env(tmp_path, SSL_CERT_FILE=str(TEST_CA)))
    assert line["status"] == "ok" and line["detail"].startswith(
        f"{TEST_CA} from SSL_CERT_FILE (1 certificate)"
    )
    conf = _pip_conf(tmp_path / "pip.conf", f"[global]\ncert = {TEST_CA}\n")
    line = _doctor_line({**_env(tmp_path), "PIP_CONFIG_FILE": str(conf)})
    assert line["status"] == "ok" and f"from pip config {conf} (global.cert)" in line["detail"]
    line = _doctor_line(_env(tmp_path))
    assert line["status"] == "ok" and line["detail"].startswith("none set") and "PIP_CERT" in line["hint"]
    line = _doctor_line(_env(tmp_path, PIP_CERT=str(tmp_path / "gone.crt")))
    assert line["status"] == "warn" and "from PIP_CERT does not exist" in line["detail"]
    assert "point PIP_CERT at a CA bundle" in line["hint"]


# --- the image itself --------------------------------------------------------------------------------------------


def _last_certificate(pem: str) -> str:
    body = pem.rsplit("-----BEGIN CERTIFICATE-----", maxsplit=1)[-1]
    return "".join(body.split("-----END CERTIFICATE-----", maxsplit=1)[0].split())


@pytest.mark.docker
def test_the_cuda_wheels_image_trusts_the_hosts_bundle(
    docker_engine: object, base_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image `invoke build --arch 86` plans, built for real: pip installed the toolkit wheels through this
    network's proxy with the host's bundle (without it pip fails with CERTIFICATE_VERIFY_FAILED here), the bundle
    is in the image's store, and pip, Python and requests in the image read that store. Where the host names no
    bundle the test CA stands in."""
    from llamaforge.build.executors import make_executor
    from llamaforge.core.events import null_reporter

    if find_host_bundle() is None:
        monkeypatch.setenv("PIP_CERT", str(TEST_CA))
    plan, _ = _plan_from_params(BuildParams(arch="86"))
    image = plan.environment.image
    assert image is not None and image.ca_bundle is not None
    make_executor("docker", {}).prepare_environment(plan, null_reporter)
    script = "cat /etc/ssl/certs/ca-certificates.crt; env"
    shown = docker_engine.containers.run(  # type: ignore[attr-defined]
        image.tag, ["sh", "-c", script], remove=True, network_mode="none"
    ).decode()
    assert _last_certificate(image.ca_bundle.read_text()) in "".join(shown.split())
    for name in VARIABLES:
        assert f"{name}=/etc/ssl/certs/ca-certificates.crt" in shown.splitlines()
