"""Deploy to SSH hosts: releases shipped over SSH, run as a service by a host target, gated on health.

* :mod:`.access` — the hosts and how they are reached (``parse_host``, root access);
* :mod:`.inventory` — host inventories (``recipes/hosts/*.toml``); :mod:`.fitplan` — each host's flags from the
  fit plan for its GPU;
* :mod:`.remote` — a release's layout on one host (state, upload, atomic switch, prune);
* :mod:`.probe` — the release's llama-bench run as its service would, before the switch;
* :mod:`.health` — the health gate: ``/health`` then a real completion;
* :mod:`.rollout` — plan and the per-host rolling loop; :mod:`.manage` — status and rollback;
* :mod:`.service` — what the operations call (a target that is no host, swarm, is asked through its hooks);
  :mod:`.ops` registers ``deploy``, ``deploy.plan``, ``deploy.status``, ``deploy.rollback``; :mod:`.render`
  prints their results.
"""

from llamaforge.runners.ssh import parse_host, parse_hosts

__all__ = ["parse_host", "parse_hosts"]
