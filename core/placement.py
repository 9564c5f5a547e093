"""Which nodes each job gets, once the policy has chosen how many: no migration.

A shrinking job keeps a subset of its nodes (those in the racks where it has most), a growing
job keeps all of its nodes and takes free ones: first in racks it already uses, then from the
racks with the most free nodes, so that jobs stay compact on the machine. Ties go by name, so
the mapping depends on which nodes are free, not on the order they were listed in.

Given `expect` (node -> expected remaining idle seconds, learned by core.horizon), expected
idle time comes first and rack compactness breaks ties: a growing job takes the free nodes likely
to stay idle longest, a shrinking job gives back those likely to be reclaimed soonest. A node
reclaimed under a job is a preemption (an unplanned pause), so this lowers preemptions per
node-hour. Expectations are compared by powers of two (a 400 s and a 500 s node are alike, a
400 s and a 4,000 s one are not), which leaves room for the rack tie-break.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Optional, Sequence

from .model import rack_of
from .objective import JobRequest


def life_class(expect: Optional[Mapping[str, float]], node: str) -> int:
    """Expected remaining idle time in powers of two (0 without expectations: racks decide)."""
    if expect is None:
        return 0
    return int(math.log2(1.0 + max(0.0, expect.get(node, 0.0))))


def _keep(nodes: Sequence[str], n: int, expect: Optional[Mapping[str, float]] = None) -> list[str]:
    count = Counter(rack_of(x) for x in nodes)
    ranked = sorted(range(len(nodes)),
                    key=lambda i: (-life_class(expect, nodes[i]), -count[rack_of(nodes[i])], i))
    keep = set(ranked[:n])
    return [x for i, x in enumerate(nodes) if i in keep]


def place(jobs: Sequence[JobRequest], sizes: Sequence[int], nodes: Sequence[str],
          expect: Optional[Mapping[str, float]] = None) -> dict[str, list[str]]:
    """Nodes per job for the chosen sizes; `expect` ranks nodes by expected idle time first."""
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
            kept = cur if n == len(cur) else _keep(cur, n, expect)
            assignment[job.id] = kept
            if n < len(cur):
                kept_set = set(kept)
                for x in cur:
                    if x not in kept_set:
                        free_by_rack.setdefault(rack_of(x), []).append(x)
        else:
            growing.append(i)
    growing.sort(key=lambda i: (-(sizes[i] - jobs[i].current), i))
    if expect is not None:
        return {**assignment, **_grow_by_life(jobs, sizes, growing, free_by_rack, expect)}
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


def _grow_by_life(jobs: Sequence[JobRequest], sizes: Sequence[int], growing: Sequence[int],
                  free_by_rack: dict[str, list[str]], expect: Mapping[str, float]) -> dict[str, list[str]]:
    """Growing jobs take the free nodes of the longest expected idle time; among alike ones, those
    in racks the job uses, then racks with most free nodes, then by name."""
    free = [x for pool in free_by_rack.values() for x in pool]
    cls = {x: life_class(expect, x) for x in free}
    out: dict[str, list[str]] = {}
    for i in growing:
        job = jobs[i]
        got = list(job.current_nodes)
        need = sizes[i] - len(got)
        own = Counter(rack_of(x) for x in got)
        left = Counter(rack_of(x) for x in free)
        free.sort(key=lambda x: (-cls[x], -own[rack_of(x)], -left[rack_of(x)], rack_of(x), x))
        if need > len(free):
            raise AssertionError(f"placement ran out of nodes for job {job.id}")
        got.extend(free[:need])
        del free[:need]
        out[job.id] = got
    return out
