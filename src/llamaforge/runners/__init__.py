"""The ground floor: everything llamaforge starts or reaches goes through here, and nothing here knows a domain.

``process`` runs commands on this host (the run loop, written once), ``output`` masks and pumps their output,
``ssh`` runs them on an SSH host (connection, runner, transfer, port forwards, host addresses), ``engine`` and
``container`` talk to a Docker engine, ``swarm`` to Docker Swarm. Build executors, which run a build plan on
one of these, live in :mod:`llamaforge.build.executors`.
"""
