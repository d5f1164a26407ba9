"""Builds beyond one machine: a fleet of builders (Docker engines and SSH build hosts, ``recipes/builders/``),
their status, and a build matrix fanned out over them.

* :mod:`~llamaforge.build.farm.builders`: the fleet file (typed, schema-checked) and how each builder is reached.
"""

from __future__ import annotations

from llamaforge.build.farm.builders import Builder, BuilderFleet, FleetCcache, fleet_dir, load_fleet

__all__ = ["Builder", "BuilderFleet", "FleetCcache", "fleet_dir", "load_fleet"]
