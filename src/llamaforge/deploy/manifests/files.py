"""Manifests for teams that deploy with other tools: compose, Kubernetes and the systemd unit, rendered from
``templates/deploy/`` (pure: nothing runs, nothing is written).

All three run the build's runtime image (``invoke images.runtime``) or its binaries the same way as llamaforge's
own targets: llama-server as a non-root user with the model read-only, a health check on ``/health`` whose
start period is the health gate's wait for the model's size, and nothing open beyond loopback by default
(compose publishes on 127.0.0.1; Kubernetes makes a ClusterIP Service). CUDA builds ask for one whole GPU per
replica: compose reserves it under ``deploy.resources.reservations.devices``, Kubernetes limits
``nvidia.com/gpu`` and replaces pods with ``strategy: Recreate``. The systemd unit is the systemd target's.
Each is rendered by its target of :mod:`llamaforge.deploy.targets` (compose and kubernetes render only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llamaforge.backends import backend_devices
from llamaforge.build.runtime_image import HEALTHCHECK, MODEL_PATH, UID
from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import is_loopback
from llamaforge.core.templates import render
from llamaforge.core.validation import check_image_reference
from llamaforge.deploy.release import gate_timeout_s, ip_address_of

if TYPE_CHECKING:
    from llamaforge.deploy.release import ReleaseSpec

PROBE_PERIOD_S = 5
# The init container's script: $1 the model recipe, $2 its sha256. llamaforge's fetch checks the file against
# the recipe's lock; the copy in the claim is checked again, and a claim that has it already is not refetched.
FETCH_SCRIPT = """set -eu
target="/models/$2.gguf"
if [ ! -f "$target" ]; then
  path=$(llamaforge models.fetch --model "$1" --json \\
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])')
  cp "$path" "$target.part"
  mv "$target.part" "$target"
fi
echo "$2  $target" | sha256sum -c -
"""


# A Kubernetes object name (RFC 1123 label): what a PersistentVolumeClaim may be called.
_CLAIM = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
SECRET_TARGET = "/run/secrets/api-key"  # noqa: S105 - a path, no secret; where Compose mounts the secret api-key


@dataclass(frozen=True)
class ManifestInputs:
    """What a manifest needs: the release's inputs plus where it runs. Checked when made: ``listen`` is an IP
    address, the images follow Docker's grammar and the claim is a Kubernetes name; beyond loopback compose
    reads the API key from ``api_key_file`` (relative to the compose file) as the Docker secret api-key."""

    name: str
    image: str
    backend: str
    replicas: int = 1
    listen: str = "127.0.0.1"
    model_claim: str | None = None
    init_image: str | None = None
    model_recipe: str | None = None
    api_key_file: str = "api-key"

    def __post_init__(self) -> None:
        object.__setattr__(self, "listen", ip_address_of(self.listen, "--listen"))
        for image in (self.image, self.init_image):
            if image is not None:
                try:
                    check_image_reference(image)
                except ValueError as error:
                    raise InvalidOption(
                        str(error), hint="an image reference such as registry/name:tag"
                    ) from None
        if self.model_claim is not None and not _CLAIM.fullmatch(self.model_claim):
            raise InvalidOption(
                f"--model-claim {self.model_claim!r} is not a Kubernetes name",
                hint="lower-case letters, digits and '-', at most 63",
            )

    @property
    def gpus(self) -> int:
        """Whole GPUs per replica: one for a CUDA build."""
        return backend_devices(self.backend).gpus

    @property
    def devices(self) -> tuple[str, ...]:
        """Host device nodes each replica needs (/dev/dri for a Vulkan build)."""
        return backend_devices(self.backend).paths


def _common(spec: ReleaseSpec, inputs: ManifestInputs) -> dict[str, object]:
    return {
        "name": inputs.name,
        "image": inputs.image,
        "build_key": spec.build_key,
        "model_sha256": spec.model_sha256,
        "port": spec.port,
        "args": ["--no-webui", *spec.flags.args()],
        "gpus": inputs.gpus,
        "devices": inputs.devices,
        "uid": UID,
        "start_period_s": gate_timeout_s(spec.model_size),
        "labels": {
            "org.llamaforge.build.key": spec.build_key,
            "org.llamaforge.model.sha256": spec.model_sha256,
        },
    }


def render_compose(spec: ReleaseSpec, inputs: ManifestInputs) -> str:
    """``compose.yaml``: the model file bind-mounted read-only, the port published on ``inputs.listen``; beyond
    loopback llama-server reads its API key from the Docker secret api-key (``--api-key-file``), made from
    ``inputs.api_key_file``. Every value is quoted with ``$`` doubled, which Compose would interpolate."""
    common = _common(spec, inputs)
    secret = None if is_loopback(inputs.listen) else inputs.api_key_file
    if secret:
        common["args"] = ["--no-webui", *spec.flags.args(), "--api-key-file", SECRET_TARGET]
    return render(
        "deploy/compose.yaml.j2",
        **common,
        listen=inputs.listen,
        model=str(spec.model),
        model_target=MODEL_PATH,
        healthcheck=HEALTHCHECK,
        user=f"{UID}:{UID}",
        api_key_file=secret,
    )


def render_kubernetes(spec: ReleaseSpec, inputs: ManifestInputs) -> str:
    """A Service and a Deployment; the model is ``<sha256>.gguf`` on a PersistentVolumeClaim, put there by an
    init container that fetches the model recipe with llamaforge when ``inputs.init_image`` is given."""
    if inputs.init_image and not inputs.model_recipe:
        raise InvalidOption(
            "the init container fetches a model recipe, and the model is a file",
            hint="give --model RECIPE, or leave out --init-image and put the file on the claim",
        )
    common = _common(spec, inputs)
    start = float(str(common["start_period_s"]))
    return render(
        "deploy/kubernetes.yaml.j2",
        **common,
        replicas=inputs.replicas,
        model_claim=inputs.model_claim or f"llamaforge-{inputs.name}-models",
        model_target=f"/models/{spec.model_sha256}.gguf",
        init_image=inputs.init_image,
        model_recipe=inputs.model_recipe or "",
        fetch_script=FETCH_SCRIPT,
        probe_period_s=PROBE_PERIOD_S,
        startup_failures=math.ceil(start / PROBE_PERIOD_S),
    )
