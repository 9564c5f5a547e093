"""Harvesting a batch cluster with pilot jobs, the same for every scheduler: idle nodes held by
preemptible pilot jobs, one per node, each dialing the harvester's hub.

base.py (what a scheduler's provider implements: core/slurm/, core/pbs/), source.py (the node
source: the watcher thread, the hub and the provider's commands), book.py (its account of the
pilots: which holds which node, surplus, failures; pure policy), backoff.py (when a node whose
pilots failed may get another), script.py (a pilot job's script, environment and log),
settings.py, hub.py (the harvester's end of every pilot's connection), identity.py (what makes
a restarted harvester the same hub), lobby.py (the hub's connections until their hello), tls.py
(the hub's certificate), wire.py (their protocol), pilot_job.py (the program each pilot job runs
on its node), runas.py (jobs run as their owner inside a pilot), stats.py (the pilots' counters)
and transport.py (workers started inside the pilots, for the worker dispatcher)."""
