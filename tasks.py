"""Invoke front: `invoke --list`. Every task is generated from llamaforge's operation registry."""

import sys

# Invoke stops Python writing bytecode (so that no tasks.pyc lands in a project) before it imports this file;
# without bytecode every run of a checkout compiles each llamaforge module it imports again. Python's own switch
# (-B, PYTHONDONTWRITEBYTECODE) still decides.
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

from llamaforge.fronts.cli import namespace  # noqa: E402 - after the bytecode switch, which it must see
from llamaforge.fronts.cli_invoke import adapt_invoke  # noqa: E402

adapt_invoke()  # Invoke parses the tasks' part of the command line after loading this file
ns = namespace()
