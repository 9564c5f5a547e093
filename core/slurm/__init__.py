"""Harvesting a Slurm cluster: idle nodes held by preemptible pilot jobs.

source.py (the node source: sinfo/squeue, pilots submitted and cancelled), cli.py (the Slurm
commands), settings.py, hub.py (the harvester's end of every pilot's connection), lobby.py (the
hub's connections until their hello), tls.py (the hub's certificate), wire.py (their protocol),
pilot_job.py (the program each pilot job runs on its node) and transport.py (workers started
inside the pilots, for the worker dispatcher)."""
