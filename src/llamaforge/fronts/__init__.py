"""Fronts: the Invoke/`llamaforge` command line, the Jupyter magics and their renderers. They parse arguments,
call operations from the registry and present the results; nothing else."""
