"""A release's inputs from a request: the build looked up in the store, the model resolved (fetched or the
tiny smoke model written on first use), the extra llama-server flags checked against the build's own
``llama-server --help``; shared by every mode (hosts, swarm, topology, manifests)."""

from __future__ import annotations

from pathlib import Path

from llamaforge.core.errors import InvalidOption
from llamaforge.core.events import CancelToken, Reporter, null_reporter
from llamaforge.deploy.hosts.prepared import ProbeModel
from llamaforge.deploy.hosts.probe import PROBE_BINARY, probe_model
from llamaforge.deploy.release import OWNED_FLAGS, ReleaseRequest, ReleaseSpec, listen_address
from llamaforge.models.recipes import AnswerCheck
from llamaforge.serve.launcher import LlamaFlags


def _model(
    model: str, reporter: Reporter, cancel: CancelToken | None
) -> tuple[Path, tuple[AnswerCheck, ...]]:
    from llamaforge.models.argument import resolve_model_argument

    m = resolve_model_argument(model, reporter=reporter, cancel=cancel)
    return m.path, tuple(m.recipe.answers) if m.recipe else ()


def release_spec(
    request: ReleaseRequest, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> tuple[ReleaseSpec, tuple[AnswerCheck, ...]]:
    """The release's inputs from ``request`` (build, model, flags, port, listen) and the model's answer
    checks."""
    from llamaforge.build.store import build_dir, find_build
    from llamaforge.runners.ssh.transfer import file_sha256
    from llamaforge.serve.server_args import server_args_for

    listen = listen_address(request.listen, api_key=request.api_key)
    manifest = find_build(request.build)
    directory = build_dir(str(manifest["key"]))
    # checked before the model is fetched and any host is reached
    extra = server_args_for(
        request.server_args, directory / "bin" / "llama-server", str(manifest["key"]), OWNED_FLAGS
    )
    model, checks = _model(request.model, reporter, cancel)
    given = LlamaFlags(
        ctx=request.ctx,
        threads=request.threads,
        parallel=request.parallel,
        n_gpu_layers=request.n_gpu_layers,
        cache_type_k=request.cache_type,
        cache_type_v=request.cache_type,
        repack=request.repack,
        extra=extra,
    )
    spec = ReleaseSpec(
        build_key=str(manifest["key"]),
        build_dir=directory,
        manifest_sha256=file_sha256(directory / "manifest.json"),
        model=model,
        model_sha256=file_sha256(model),
        model_size=model.stat().st_size,
        flags=given,
        port=request.port,
        listen=listen,
        backend=str(manifest.get("backend") or "cpu"),
    )
    return spec, checks


def release_probe(
    spec: ReleaseSpec, reporter: Reporter = null_reporter, cancel: CancelToken | None = None
) -> ProbeModel:
    """The probe model a release of ``spec`` is proven with on each host; InvalidOption when the build has no
    llama-bench to run it."""
    if not (spec.build_dir / "bin" / PROBE_BINARY).is_file():
        raise InvalidOption(
            f"build {spec.build_key} has no {PROBE_BINARY}, which proves a release on each host before its switch",
            hint="add it to the recipe's targets, or deploy with --no-probe",
        )
    return probe_model(reporter, cancel)
