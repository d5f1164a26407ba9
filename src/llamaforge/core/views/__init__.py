"""What the result views of every operation share, below the domains that own those views: HTML building blocks
(:mod:`~llamaforge.core.views.html`) and the rich styles of the terminal (:mod:`~llamaforge.core.views.console`).
A domain's ``render.py`` imports these, never a front; the fronts pick the renderer and show its output."""
