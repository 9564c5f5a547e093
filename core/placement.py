"""Which nodes each job gets, once the policy has chosen how many: no migration.

A shrinking job keeps a subset of its nodes (those in the racks where it has most), a growing
job keeps all of its nodes and takes free ones: first in racks it already uses, then from the
racks with the most free nodes, so that jobs stay compact on the machine. Ties go by name, so
the mapping depends on which nodes are free, not on the order they were listed in.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from .model import rack_of
from .objective import JobRequest


def _keep(nodes: Sequence[str], n: int) -> list[str]:
    count = Counter(rack_of(x) for x in nodes)
    ranked = sorted(range(len(nodes)), key=lambda i: (-count[rack_of(nodes[i])], i))
    keep = set(ranked[:n])
    return [x for i, x in enumerate(nodes) if i in keep]


def place(jobs: Sequence[JobRequest], sizes: Sequence[int], nodes: Sequence[str]) -> dict[str, list[str]]:
    held = {x for j in jobs for x in j.current_nodes}
    free_by_rack: dict[str, list[str]] = {}
    for x in nodes:
        if x not in held:
            free_by_rack.setdefault(rack_of(x), []).append(x)
    assignment: dict[str, list[str]] = {}
    growing: list[int] = []
    for i, (job, n) in enumerate(zip(jobs, sizes)):
        cur = list(job.current_nodes)
        if n <= len(cur):
            kept = cur if n == len(cur) else _keep(cur, n)
            assignment[job.id] = kept
            if n < len(cur):
                kept_set = set(kept)
                for x in cur:
                    if x not in kept_set:
                        free_by_rack.setdefault(rack_of(x), []).append(x)
        else:
            growing.append(i)
    growing.sort(key=lambda i: (-(sizes[i] - jobs[i].current), i))
    for i in growing:
        job = jobs[i]
        got = list(job.current_nodes)
        need = sizes[i] - len(got)
        own = Counter(rack_of(x) for x in got)
        order = [r for r, _ in own.most_common() if free_by_rack.get(r)]
        order += sorted((r for r in free_by_rack if r not in own and free_by_rack[r]),
                        key=lambda r: (-len(free_by_rack[r]), r))
        for r in order:
            if need <= 0:
                break
            pool = free_by_rack[r]
            pool.sort()
            take = pool[:need]
            del pool[:need]
            got.extend(take)
            need -= len(take)
        if need > 0:
            raise AssertionError(f"placement ran out of nodes for job {job.id}")
        assignment[job.id] = got
    return assignment
