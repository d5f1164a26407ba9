"""The names a recipe may give its platform and its backend.

They sit below everything that reads a recipe (patch series name platforms too), so that neither registry's
package is imported to spell a name. Each registry (:mod:`llamaforge.platforms`, :mod:`llamaforge.backends`)
refuses to load unless its modules and these names are the same set: a new platform or backend is a module, one
registry line and its name here."""

from __future__ import annotations

from typing import Literal

PlatformName = Literal["linux", "windows", "macos"]
BackendName = Literal["cpu", "cuda", "vulkan", "metal"]
