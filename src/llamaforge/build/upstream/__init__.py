"""Upstream llama.cpp releases as a recipe sees them: a SOURCE resolved and pinned (:mod:`.source_pin`, with what
an archive holds read by :mod:`.source_facts`), and what moved under a recipe between two trees, read from their
CMake files before any compile (:mod:`.tree_check`). :mod:`llamaforge.upgrade` runs the pipeline over them."""
