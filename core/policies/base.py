"""The interface every size policy implements: pure functions of value tables.

A policy picks a node count per job; placement (which nodes) is a separate step
(core.placement), so policies never see node names.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

#: a node cap as policies see it: (limit, indices of the jobs it covers); see core.objective.Cap
GroupCap = tuple[int, tuple[int, ...]]

import numpy as np


@dataclass
class SizeProblem:
    tables: list[np.ndarray]      # v_j(0..top_j), -inf where not allowed
    capacity: int                 # idle nodes, those held by the jobs included
    current: list[int]            # c_j, nodes each job holds now
    min_nodes: list[int]
    time_limit: float = 5.0       # seconds a MILP solver may take before the fallback
    caps: Sequence[GroupCap] = ()  # sum of the covered jobs' sizes <= limit (laminar; binding ones only)

    @property
    def tops(self) -> list[int]:
        return [len(t) - 1 for t in self.tables]


@dataclass
class SizeDecision:
    sizes: list[int]
    status: str                   # optimal | time_limit | fallback | heuristic
    solver: str


class SizePolicy(ABC):
    name: str = ""

    @abstractmethod
    def choose(self, problem: SizeProblem) -> SizeDecision:
        """Sizes with sum <= capacity and each size allowed by its table."""


def best_size(table: np.ndarray, current: int, limit: int | None = None) -> int:
    """argmax of a table up to `limit`, ties going to the current size, then the smallest."""
    t = table if limit is None else table[: limit + 1]
    best = t.max()
    if current < len(t) and t[current] == best:
        return current
    return int(np.flatnonzero(t == best)[0])


def binding(caps: Sequence[GroupCap], tops: Sequence[int]) -> list[GroupCap]:
    """The caps that can bind: those below what their jobs could take together."""
    return [(limit, members) for limit, members in caps if limit < sum(tops[j] for j in members)]


def room(caps: Sequence[GroupCap], sizes: Sequence[int], j: int) -> int | None:
    """Nodes job j may still add under the caps that cover it (None: no cap covers it)."""
    left = [limit - sum(sizes[k] for k in members) for limit, members in caps if j in members]
    return max(0, min(left)) if left else None


def check_sizes(problem: SizeProblem, sizes: Sequence[int]) -> None:
    """Raise if a decision breaks capacity, bounds or a cap: a policy bug must never reach a node."""
    if sum(sizes) > problem.capacity:
        raise AssertionError(f"sizes {list(sizes)} exceed capacity {problem.capacity}")
    for limit, members in problem.caps:
        if sum(sizes[k] for k in members) > limit:
            raise AssertionError(f"sizes {[sizes[k] for k in members]} exceed a cap of {limit}")
    for t, n in zip(problem.tables, sizes):
        if n < 0 or n >= len(t) or not np.isfinite(t[n]):
            raise AssertionError(f"size {n} not allowed by its table")
