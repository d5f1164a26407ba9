"""Moving a build recipe to another llama.cpp release in one operation (``upgrade``): the new source resolved
and pinned, the patch series rebased onto it, what moved under the recipe checked, the candidate built and smoked
side by side with the current build, the fit re-measured, one report, and the recipe changed only on request.

It composes the other domains (build, smoke, serve), so it sits above them and below the fronts."""
