"""Which nodes each job gets, once the policy has chosen how many.

Nodes are grouped so that each job's nodes share fate. Given `since` (node -> the moment it
became idle), the group is the node's *cohort*: the nodes freed at the same moment, by the same
batch job ending. The main scheduler tends to take a cohort back at once (on the Summit trace 80 %
of pairs of nodes freed in the same second are reclaimed in the same second), and a reclaim costs
a job one pause however many of its nodes it takes, so a job spread over few cohorts is preempted
less often. Without `since` the group is the node's rack (jobs stay compact on the machine).

A job that keeps its size keeps its nodes; a shrinking job keeps the groups worth most (with
cohorts it chooses among the free ones too: below). Given `expect` (node -> expected remaining
idle seconds, learned by core.horizon), nodes likely to stay idle longest are worth more. With
cohorts, a cohort is worth the node-seconds it is expected to give before its one reclaim (its
nodes x their expected idle time); ranking by expected idle time alone, ahead of size, spread
jobs over more small cohorts and cost 0.07-0.13 % of the rescale-free bound on every window
measured (docs/policy-experiments.md, like every figure here).

A growing job regroups anyway and pays one pause for it, whichever nodes join, so with cohorts
it also *trades*: it takes the cohorts worth most among its own and the free ones, its own nodes
first within a cohort, and gives back the nodes of its cohorts that did not make the cut. Over
the regroups a job makes, its nodes move to the cohorts that will be reclaimed least often, at
no pause of their own (+0.19 and +0.24 points of the bound for `--tfwd auto` over keeping every
node, means of six starts). A shrinking job
regroups too, so every job that changes size puts all of its nodes on the table with the free
ones, and what one gives up another may take: the jobs that regroup at one decision swap among
themselves (+0.08 points, 24 starts). A job that keeps its size keeps its nodes, even in
a pause: moving it then measured as noise for `auto` and a loss for fixed horizons, which place
without expected idle times.

Within a group, nodes are taken in machine order, from the end the main scheduler takes back
last when that is known (`order`, learned by core.reclaim_order: Summit's takes a cohort's
first-named nodes first, so jobs fill from its last), from the first node otherwise. What is left
free of a cohort is then what its next reclaim takes: on the Summit windows that raised `auto`
from 96.66 to 96.82 % and from 96.92 to 97.14 % of the rescale-free bound.

Regrouping jobs choose in turn, the one a reclaim would cost most first (its scale-down pause at
its new throughput, `hit_cost`), so the nodes likely to be reclaimed soonest go to the jobs a
reclaim costs least: +0.04 points of the bound for `auto`, mean of 24 starts on four windows,
positive on each window's mean. They used to go largest growth first.

With racks a growing job keeps all of its nodes and takes free ones: expected idle time first,
compared by powers of two (a 400 s and a 500 s node are alike, a 400 s and a 4,000 s one are
not), then its own racks, then the racks with most free nodes.
Ties go by group, rack and name, so the mapping depends on which nodes are free, not on the
order they were listed in; a shrinking job breaks ties by the order it holds its nodes in.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Mapping, Optional, Sequence

from .model import node_order, rack_of
from .objective import JobRequest, effective_rate

Group = Callable[[str], str]


def life_class(expect: Optional[Mapping[str, float]], node: str) -> int:
    """Expected remaining idle time in powers of two (0 without expectations: groups decide)."""
    if expect is None:
        return 0
    return int(math.log2(1.0 + max(0.0, expect.get(node, 0.0))))


def expected_life(expect: Optional[Mapping[str, float]], node: str) -> float:
    """Expected remaining idle seconds, at least 1 (1 for every node without expectations)."""
    return 1.0 if expect is None else max(1.0, expect.get(node, 0.0))


def hit_cost(job: JobRequest, n: int) -> float:
    """Samples a reclaim would cost `job` at n nodes: its scale-down pause at that throughput.
    Regrouping jobs choose nodes in descending order of it, so the nodes least likely to be
    reclaimed go to the jobs a reclaim would cost most."""
    return job.scale_down_seconds * effective_rate(job, n)


def _keep(nodes: Sequence[str], n: int, expect: Optional[Mapping[str, float]] = None) -> list[str]:
    """With racks, the n nodes a shrinking job keeps: expected idle time first (by powers of
    two), then its racks with most of its nodes; ties by the order it holds them in."""
    count = Counter(rack_of(x) for x in nodes)

    def rank(i: int) -> tuple:
        g = rack_of(nodes[i])
        return (-life_class(expect, nodes[i]), -count[g], g, i)
    ranked = sorted(range(len(nodes)), key=rank)
    keep = set(ranked[:n])
    return [x for i, x in enumerate(nodes) if i in keep]


def place(jobs: Sequence[JobRequest], sizes: Sequence[int], nodes: Sequence[str],
          expect: Optional[Mapping[str, float]] = None,
          since: Optional[Mapping[str, float]] = None, order: int = 0) -> dict[str, list[str]]:
    """Nodes per job for the chosen sizes, grouped by cohort (`since`) or rack; `expect` ranks
    new groups by expected idle time; `order` is which end of a group the main scheduler takes
    first (+1 its first nodes in machine order, -1 its last, 0 not known)."""
    fate = bool(since)
    held = {x for j in jobs for x in j.current_nodes}
    group: Group = rack_of
    if since:      # a node's cohort: idle since the same moment (its rack where that is not known)
        group = cohorts(since, nodes, held).__getitem__
    free = [x for x in nodes if x not in held]
    assignment: dict[str, list[str]] = {}
    regrouping: list[int] = []
    for i, (job, n) in enumerate(zip(jobs, sizes)):
        cur = list(job.current_nodes)
        if fate and n > 0 and n != len(cur):
            free.extend(cur)        # it regroups: every node it holds is on the table
            regrouping.append(i)
        elif n <= len(cur):      # keeps its size, stops (n = 0), or shrinks on racks
            kept = cur if n == len(cur) else _keep(cur, n, expect)
            assignment[job.id] = kept
            if n < len(cur):
                kept_set = set(kept)
                free.extend(x for x in cur if x not in kept_set)
        else:
            regrouping.append(i)
    regrouping.sort(key=lambda i: (-hit_cost(jobs[i], sizes[i]), -(sizes[i] - jobs[i].current), i))
    if fate:
        _trade(jobs, sizes, regrouping, free, group, expect, assignment, order)
        return assignment
    # free nodes in buckets of one class and one rack, each in taking order: a job then
    # orders buckets, not nodes (100 jobs x 4,734 nodes stays a few milliseconds)
    buckets: dict[tuple[int, str], list[str]] = {}
    for x in free:
        buckets.setdefault((life_class(expect, x), group(x)), []).append(x)
    for pool in buckets.values():
        _in_taking_order(pool, order)
    left = Counter(g for (_, g), pool in buckets.items() for _ in pool)
    for i in regrouping:
        job = jobs[i]
        got = list(job.current_nodes)
        need = sizes[i] - len(got)
        if need > sum(left.values()):
            raise AssertionError(f"placement ran out of nodes for job {job.id}")
        own = Counter(group(x) for x in got)
        for key in sorted((k for k, pool in buckets.items() if pool),
                          key=lambda k: (-k[0], -own[k[1]], -left[k[1]], k[1])):
            if need <= 0:
                break
            pool = buckets[key]
            take = pool[-need:][::-1]
            del pool[-need:]
            got.extend(take)
            left[key[1]] -= len(take)
            need -= len(take)
        assignment[job.id] = got
    return assignment


def cohorts(since: Mapping[str, float], nodes: Sequence[str], held: set[str]) -> dict[str, str]:
    """Node -> its cohort's label (idle since, to the ms), its rack where `since` does not know
    it. Each moment is formatted once, not once a node: 10,624 held nodes are a few cohorts."""
    labels = {t: f"{t:.3f}" for t in set(since.values())}
    group = {x: labels[t] for x, t in since.items()}
    for x in held.union(nodes).difference(group):
        group[x] = rack_of(x)
    return group


def _in_taking_order(pool: list[str], order: int = 0) -> None:
    """Pools are kept in the order they are taken in, from the end: the last nodes in machine
    order first where the main scheduler takes the first ones first (`order` +1), else the first."""
    pool.sort(key=node_order, reverse=order <= 0)


def _trade(jobs: Sequence[JobRequest], sizes: Sequence[int], regrouping: Sequence[int], free: list[str],
           group: Group, expect: Optional[Mapping[str, float]], assignment: dict[str, list[str]],
           order: int = 0) -> None:
    """Cohort placement of the jobs that regroup, in order: `free` holds the free nodes and every
    node they hold; each takes the cohorts worth most, its own nodes first within one, and what
    it leaves the jobs after it may take."""
    pools: dict[str, list[str]] = {}
    for x in free:
        pools.setdefault(group(x), []).append(x)
    for pool in pools.values():
        _in_taking_order(pool, order)
    life = {g: sum(expected_life(expect, x) for x in pool) / len(pool) for g, pool in pools.items()}
    spare = len(free)
    for i in regrouping:
        job, need = jobs[i], sizes[i]
        if need > spare:
            raise AssertionError(f"placement ran out of nodes for job {job.id}")
        had = set(job.current_nodes)
        own = Counter(group(x) for x in job.current_nodes)

        def worth(g: str) -> tuple:
            n = len(pools[g])
            return (-n * life[g], -own[g], -n, g)
        got: list[str] = []
        for g in sorted((g for g, pool in pools.items() if pool), key=worth):
            if need <= 0:
                break
            pool = pools[g]
            if own[g]:          # still here of its own (a job before it may have taken some)
                mine = [x for x in reversed(pool) if x in had][:need]
                if mine:
                    taken = set(mine)
                    pool[:] = [x for x in pool if x not in taken]
                    got.extend(mine)
                    need -= len(mine)
            if need > 0 and pool:
                take = pool[-need:][::-1]
                del pool[-need:]
                got.extend(take)
                need -= len(take)
        spare -= len(got)
        assignment[job.id] = got
