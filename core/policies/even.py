"""`even`: BFTrainer's comparison heuristic. Every job gets an equal share of the idle nodes
(within its bounds); what is left goes to jobs in arrival order. It ignores curves and costs,
which is why it keeps every node busy but reshuffles often."""
from __future__ import annotations

from .base import SizeDecision, SizePolicy, SizeProblem, room


def even_sizes(problem: SizeProblem) -> list[int]:
    J = len(problem.tables)
    if not J:
        return []
    tops, mins = problem.tops, problem.min_nodes
    share = problem.capacity // J
    caps = problem.caps
    sizes = [0] * J
    for j, (top, lo) in enumerate(zip(tops, mins)):   # in arrival order, within any node cap
        r = room(caps, sizes, j) if caps else None
        want = min(top, share, top if r is None else r)
        sizes[j] = want if want >= lo and share >= lo else 0
    left = problem.capacity - sum(sizes)
    for j in range(J):
        if left <= 0:
            break
        r = room(caps, sizes, j) if caps else None
        fits = left if r is None else min(left, r)
        if sizes[j] == 0:
            if tops[j] >= mins[j] and fits >= mins[j]:
                sizes[j] = min(tops[j], fits)
                left -= sizes[j]
        else:
            add = min(tops[j] - sizes[j], fits)
            sizes[j] += add
            left -= add
    return sizes


class EvenPolicy(SizePolicy):
    name = "even"

    def choose(self, problem: SizeProblem) -> SizeDecision:
        return SizeDecision(even_sizes(problem), "heuristic", "even")
