"""A release ready to ship (:class:`Release`: its inputs, where it goes, how it runs, its id and rendered
files) and the probe model each host proves it with; made without a host (:func:`prepare_release`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaforge.deploy.release import Layout, ReleaseSpec, release_id, release_record
from llamaforge.models.recipes import AnswerCheck

if TYPE_CHECKING:
    from llamaforge.deploy.targets.base import Target


@dataclass(frozen=True)
class ProbeModel:
    """The tiny model a release is proven with: the local file and its sha256 (its name on the hosts)."""

    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    """A release ready to ship: its inputs, where it goes, how it runs, its id and rendered files."""

    spec: ReleaseSpec
    layout: Layout
    target: Target
    id: str
    service_files: dict[str, str]
    record: dict[str, Any]
    checks: tuple[AnswerCheck, ...] = ()
    api_key: str | None = field(default=None, repr=False, compare=False)  # written on the host, never shown
    fit: tuple[str, ...] = ()  # the fit plan's summary for the host's GPU, when it has one
    probe: ProbeModel | None = None  # the model each host proves the release with before its switch


def prepare_release(
    spec: ReleaseSpec,
    layout: Layout,
    target: Target,
    checks: Sequence[AnswerCheck] = (),
    *,
    api_key: str | None = None,
    fit: Sequence[str] = (),
    probe: ProbeModel | None = None,
) -> Release:
    """Render the release's service files and derive its id (no host needed); ``api_key`` is the key a
    release listening beyond loopback gets (no part of its id or ``release.json``); with a ``probe`` model each
    host runs the release on it before it is switched there (:mod:`~llamaforge.deploy.hosts.probe`)."""
    files = target.service_files(spec, layout)
    rid = release_id(spec, files)
    return Release(
        spec,
        layout,
        target,
        rid,
        files,
        release_record(spec, rid, target.name),
        tuple(checks),
        api_key,
        tuple(fit),
        probe,
    )
