"""Harvesting a Slurm cluster: idle nodes held by preemptible pilot jobs.

source.py (the node source: the watcher thread, the hub and the Slurm commands it runs),
book.py (its account of the pilots: which holds which node, surplus, failures; pure policy),
backoff.py (when a node whose pilots failed may get another), pilots.py (a pilot job's script,
options and log), watch.py (which nodes are watched), cli.py (the Slurm commands), parse.py
(reading their output, the same for every supported version), records.py (nodes and jobs as
read), settings.py, hub.py (the harvester's end of every pilot's connection), identity.py (what
makes a restarted harvester the same hub), lobby.py (the hub's connections until their hello),
tls.py (the hub's certificate), wire.py (their protocol), pilot_job.py (the program each pilot
job runs on its node) and transport.py (workers started inside the pilots, for the worker
dispatcher)."""
