"""Swarm: a release as a replicated service on this engine's Docker Swarm (the ``swarm`` target).

* :mod:`~llamaforge.deploy.swarm.service` — the service definition, the update Swarm rolls, its report;
* :mod:`~llamaforge.deploy.swarm.actions` — deploy, status and rollback as the deploy operations call them
  through :class:`~llamaforge.deploy.targets.swarm_service.SwarmTarget`.
"""
