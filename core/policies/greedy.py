"""`greedy`: hand out nodes where they add the most objective per node.

From every job at 0 nodes, repeatedly move the job whose best jump (to any larger size that
still fits) gains the most value per added node. Looking past the next size lets it step over
a rescale cost or a minimum size, which a strictly one-node-at-a-time greedy could not.
"""
from __future__ import annotations

import heapq

import numpy as np

from .base import SizeDecision, SizePolicy, SizeProblem, room


def _best_jump(table: np.ndarray, at: int, free: int) -> tuple[float, int]:
    top = min(len(table) - 1, at + free)
    if top <= at:
        return 0.0, at
    gains = (table[at + 1: top + 1] - table[at]) / np.arange(1, top - at + 1)
    k = int(np.argmax(gains))
    return float(gains[k]), at + 1 + k


def greedy_sizes(problem: SizeProblem) -> list[int]:
    tables, caps = problem.tables, problem.caps
    sizes = [0] * len(tables)
    free = problem.capacity

    def fits(j: int) -> int:
        """Nodes job j may still add: the free ones, within the caps that cover it."""
        r = room(caps, sizes, j) if caps else None
        return free if r is None else min(free, r)

    heap = []
    for j, t in enumerate(tables):
        gain, to = _best_jump(t, 0, fits(j))
        if gain > 0:
            heapq.heappush(heap, (-gain, j, to))
    while heap and free > 0:
        neg, j, to = heapq.heappop(heap)
        if to - sizes[j] > fits(j):  # no longer fits: look again with what is left
            gain, to = _best_jump(tables[j], sizes[j], fits(j))
            if gain > 0:
                heapq.heappush(heap, (-gain, j, to))
            continue
        free -= to - sizes[j]
        sizes[j] = to
        gain, nxt = _best_jump(tables[j], to, fits(j))
        if gain > 0:
            heapq.heappush(heap, (-gain, j, nxt))
    return sizes


class GreedyPolicy(SizePolicy):
    name = "greedy"

    def choose(self, problem: SizeProblem) -> SizeDecision:
        return SizeDecision(greedy_sizes(problem), "heuristic", "greedy")
