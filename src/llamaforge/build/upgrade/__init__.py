"""Moving a recipe's pinned llama.cpp to another release: resolve and pin the new source, check what moved
under the recipe, rebase, build, smoke side by side and report."""
