"""How many nodes the jobs could use: the most a source that pays for holding nodes (Slurm
pilots count as the harvester's usage) should hold. Pure: plain job records in, a count out."""
from __future__ import annotations

from typing import Iterable

from .model import Job


def node_demand(running: Iterable[Job], queued: Iterable[Job], free_slots: int) -> int:
    """The running jobs' `max_nodes`, plus those of the first `free_slots` queued jobs (queue
    order): jobs beyond the running slots could not use a node before another one ends."""
    total = sum(j.max_nodes for j in running)
    for i, job in enumerate(queued):
        if i >= free_slots:
            break
        total += job.max_nodes
    return total
