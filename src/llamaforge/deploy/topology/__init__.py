"""Topology: one model over a head (llama-server ``--rpc``) and llama.cpp RPC workers (``ggml-rpc-server``).

* :mod:`.workers` — the topology's rules (private RPC addresses, one build, the RPC server) and the RPC HELLO;
* :mod:`.file` — the ``[topology]`` table of a TOML file;
* :mod:`.orchestrate` — deploy, status and rollback of head and workers with the hosts' release machinery;
* :mod:`.service` — what the operations call (members, the split plan, the releases, the smoke);
  :mod:`.ops` registers ``topology.deploy``, ``topology.plan``, ``topology.status``, ``topology.rollback``
  and ``topology.smoke``.
"""
