"""How many nodes the jobs could use: the most a source that pays for holding nodes (Slurm
pilots count as the harvester's usage) should hold. Pure: plain job records in, a count out."""
from __future__ import annotations

from typing import Iterable, Sequence

from .model import Job
from .objective import Cap


def node_demand(running: Iterable[Job], queued: Iterable[Job], free_slots: int, caps: Sequence[Cap] = ()) -> int:
    """The running jobs' `max_nodes`, plus those of the first `free_slots` queued jobs (queue
    order): jobs beyond the running slots could not use a node before another one ends. An
    owner's or account's node cap (`caps`, laminar) bounds what its jobs count together: pilots
    for nodes a cap keeps from every job would be paid for and never used."""
    counted = list(running)
    for i, job in enumerate(queued):
        if i >= free_slots:
            break
        counted.append(job)
    units: list[tuple[frozenset[str], int]] = [(frozenset((j.id,)), j.max_nodes) for j in counted]
    for cap in sorted(caps, key=lambda c: len(c.jobs)):
        members = set(cap.jobs)
        inside = [u for u in units if u[0] <= members]
        if inside:
            units = [u for u in units if not u[0] <= members]
            units.append((frozenset().union(*(u[0] for u in inside)), min(cap.limit, sum(u[1] for u in inside))))
    return sum(n for _, n in units)
