"""Deploy: ship a build and a model to hosts over SSH as releases, run them as a service, gate on health.

* :mod:`~llamaforge.deploy.release` — what a release is (its inputs, id, files, ``release.json``) and where it
  lives on a host (Capistrano's shape: ``<root>/releases/<id>/``, ``<root>/current``, models once per host in
  ``<root>/models/<sha256>.gguf``); pure, no host needed.
* :mod:`~llamaforge.deploy.hosts.remote` — that layout on one host through an SSH runner: read its state, upload a
  release (models and files already there are not sent again), switch ``current`` atomically, prune.
* :mod:`~llamaforge.deploy.targets` — how a release runs as a service (the ``Target`` protocol; systemd first).
* :mod:`~llamaforge.deploy.hosts.health` — the health gate: ``/health`` then a real completion, through the SSH
  connection on the host's loopback.
* :mod:`~llamaforge.deploy.hosts.rollout` — plan, the per-host rolling loop (canary, batches, ``--max-fail``, rollback
  of a failed host, Ctrl-C/SIGTERM and lost hosts), status and rollback; :mod:`~llamaforge.deploy.hosts.ops` registers
  them as operations, :mod:`~llamaforge.deploy.hosts.render` prints their results.
* :mod:`~llamaforge.deploy.hosts.inventory` — host inventories (``recipes/hosts/*.toml``), and
  :mod:`~llamaforge.deploy.hosts.fitplan` — each host's llama-server flags from the fit plan for its GPU.
"""
