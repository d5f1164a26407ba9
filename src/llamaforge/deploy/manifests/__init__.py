"""Manifests for teams that deploy with other tools (``deploy.render``): compose, Kubernetes and the systemd
unit, each rendered by its target of :mod:`llamaforge.deploy.targets`.

* :mod:`.files` — the manifests' inputs and the compose and Kubernetes renderers (pure);
* :mod:`.service` — what ``deploy.render`` calls; :mod:`.ops` registers it.
"""
