"""Builds beyond one machine: a fleet of builders (Docker engines and SSH build hosts, ``recipes/builders/``),
their status, and a build matrix fanned out over them.

* :mod:`~llamaforge.build.farm.builders`: the fleet file (typed, schema-checked) and how each builder is reached.
* :mod:`~llamaforge.build.farm.placement`: which builder an entry may go to, and which it goes to next (pure).
* :mod:`~llamaforge.build.farm.images`: the builder image sent by id to an engine that lacks it
  (:func:`~llamaforge.build.farm.images.sending_executor` is the executor of a build on a builder).
* :mod:`~llamaforge.build.farm.fanout`: a matrix run in parallel over the fleet (retries, cancel, progress).
* :mod:`~llamaforge.build.farm.status`: what each builder offers now (``builders.status``).
"""

from __future__ import annotations

from llamaforge.build.farm.builders import Builder, BuilderFleet, FleetCcache, fleet_dir, load_fleet

__all__ = ["Builder", "BuilderFleet", "FleetCcache", "fleet_dir", "load_fleet"]
