"""`even`: BFTrainer's comparison heuristic. Every job gets an equal share of the idle nodes
(within its bounds); what is left goes to jobs in arrival order. It ignores curves and costs,
which is why it keeps every node busy but reshuffles often."""
from __future__ import annotations

from .base import SizeDecision, SizePolicy, SizeProblem


def even_sizes(problem: SizeProblem) -> list[int]:
    J = len(problem.tables)
    if not J:
        return []
    tops, mins = problem.tops, problem.min_nodes
    share = problem.capacity // J
    sizes = [min(top, share) if share >= lo and top >= lo else 0 for top, lo in zip(tops, mins)]
    left = problem.capacity - sum(sizes)
    for j in range(J):
        if left <= 0:
            break
        if sizes[j] == 0:
            if tops[j] >= mins[j] and left >= mins[j]:
                sizes[j] = min(tops[j], left)
                left -= sizes[j]
        else:
            add = min(tops[j] - sizes[j], left)
            sizes[j] += add
            left -= add
    return sizes


class EvenPolicy(SizePolicy):
    name = "even"

    def choose(self, problem: SizeProblem) -> SizeDecision:
        return SizeDecision(even_sizes(problem), "heuristic", "even")
