"""Invoke front: `invoke --list`. Every task is generated from llamaforge's operation registry."""

from llamaforge.fronts.cli import namespace

ns = namespace()
