"""Build backends: what one llama.cpp backend means for a build, its images and its containers, one module each.

A backend is a :class:`~llamaforge.backends.base.Backend` (every hook has a default) registered in ``BACKENDS``
below; its name is in :data:`llamaforge.build.names.BackendName`, the ``--backend`` choices of the CLI and the
MCP tools. The planner composes a platform (:mod:`llamaforge.platforms`) with a backend; nothing outside this
package asks which backend a build has."""

from __future__ import annotations

from typing import get_args

from llamaforge.backends.base import Backend, Devices, LinuxBuilder
from llamaforge.backends.cpu import CpuBackend
from llamaforge.backends.cuda import CudaBackend
from llamaforge.backends.metal import MetalBackend
from llamaforge.backends.vulkan import VulkanBackend
from llamaforge.build.names import BackendName
from llamaforge.core.errors import InvalidOption

__all__ = [
    "BACKENDS",
    "Backend",
    "Devices",
    "LinuxBuilder",
    "arch_backend",
    "backend_devices",
    "backend_names",
    "get_backend",
]

BACKENDS: dict[str, Backend] = {
    backend.name: backend for backend in (CpuBackend(), CudaBackend(), VulkanBackend(), MetalBackend())
}
if set(BACKENDS) != set(get_args(BackendName)):  # pragma: no cover - a registry edited without its name
    raise RuntimeError(f"backends {sorted(BACKENDS)} and BackendName {get_args(BackendName)} differ")


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (a recipe's or manifest's ``backend``)."""
    if name not in BACKENDS:
        raise InvalidOption(f"unknown backend {name!r}", hint="one of " + ", ".join(backend_names()))
    return BACKENDS[name]


def backend_names() -> list[str]:
    """Names of every registered backend."""
    return sorted(BACKENDS)


def arch_backend() -> Backend:
    """The backend whose arch list ``--arch`` gives: a build with ``--arch`` and no ``--backend`` is one of its."""
    return BACKENDS["cuda"]


def backend_devices(name: str | None) -> Devices:
    """The devices a container of a build with backend ``name`` needs (none for an unknown or missing name, such
    as an image label written by another tool)."""
    backend = BACKENDS.get(name or "")
    return backend.devices if backend is not None else Devices()
