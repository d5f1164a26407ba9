"""What ``deploy.render`` calls: the release's inputs resolved, then the chosen target's manifests rendered;
nothing is written or started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Reporter
from llamaforge.core.validation import suggest
from llamaforge.deploy.inputs import release_spec
from llamaforge.deploy.manifests.files import ManifestInputs
from llamaforge.deploy.release import Layout, ReleaseRequest, ReleaseSpec
from llamaforge.deploy.targets import TARGETS, render_target_names
from llamaforge.models.tiny import TINY_SMOKE_MODELS


def render_manifests(
    target: str, spec: ReleaseSpec, inputs: ManifestInputs, layout: Layout
) -> dict[str, str]:
    """The files of ``target`` by name; InvalidOption with "did you mean" for a target that renders none."""
    known = render_target_names()
    if target not in known:
        raise InvalidOption(
            f"deploy.render has no target {target!r}",
            hint=suggest(target, known, end=" ") + "known: " + ", ".join(known),
        )
    return TARGETS[target]().manifests(spec, inputs, layout)


@dataclass(frozen=True)
class ManifestRequest:
    """Where the manifests run: what :class:`ManifestInputs` takes beyond the build's image and backend."""

    name: str = "default"
    root: str = "/opt/llamaforge"
    replicas: int = 1
    listen: str = "127.0.0.1"
    model_claim: str | None = None
    init_image: str | None = None
    api_key_file: str = "api-key"


@dataclass(frozen=True)
class Rendered:
    """The rendered files by name, and the runtime image they run."""

    image: str
    files: dict[str, str]


def render_release(
    target: str, request: ReleaseRequest, where: ManifestRequest, reporter: Reporter, cancel: CancelToken
) -> Rendered:
    """The manifests of ``target`` for a release of ``request``; a model recipe or URL is what an init
    container can fetch (``--model tiny`` and a file here are not)."""
    from llamaforge.build.runtime_image import runtime_tag
    from llamaforge.build.store import find_build

    spec, _ = release_spec(request, reporter, cancel)
    manifest = find_build(spec.build_key)
    given = Path(request.model)
    fetched = request.model not in TINY_SMOKE_MODELS and (given.suffix == ".toml" or not given.exists())
    inputs = ManifestInputs(
        name=where.name,
        image=runtime_tag(spec.build_key),
        backend=str(manifest.get("backend", "")),
        replicas=where.replicas,
        listen=where.listen,
        model_claim=where.model_claim,
        init_image=where.init_image,
        model_recipe=request.model if fetched else None,
        api_key_file=where.api_key_file,
    )
    files = render_manifests(target, spec, inputs, Layout(where.name, where.root))
    return Rendered(inputs.image, files)
