"""What the controller counts: totals kept across restarts (`Counters`), one step's outcome
(`StepResult`) and solve times with a running histogram, so /metrics reads a few numbers from the
snapshot instead of every solve ever made."""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

#: upper bounds (seconds) of the solve-time histogram buckets, as Prometheus reads them
SOLVE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Counters:
    events: int = 0
    steps: int = 0
    solves: int = 0
    rescales: int = 0
    preemptions: int = 0
    jobs_submitted: int = 0
    jobs_finished: int = 0
    probes: int = 0               # sizes the advisor forced to learn them
    tries: int = 0                # untried sizes the allocator chose on the advisor's fit
    samples: int = 0
    offered_node_s: float = 0.0
    used_node_s: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    owner_node_s: dict[str, float] = field(default_factory=dict)   # node-seconds of the jobs that have an owner

    def count_owners(self, held: dict[str, int], dt: float) -> None:
        """Owners held these nodes for dt seconds."""
        for owner, n in held.items():
            self.owner_node_s[owner] = self.owner_node_s.get(owner, 0.0) + n * dt


@dataclass
class StepResult:
    time: float
    events: int
    idle: int
    used: int
    running: int
    queued: int
    samples_per_second: float
    objective: Optional[float] = None
    solve_ms: Optional[float] = None
    status: str = ""
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class SolveHistogram:
    """Cumulative counts per bucket of SOLVE_BUCKETS_S, the total count and sum (seconds)."""
    le: tuple[int, ...] = (0,) * len(SOLVE_BUCKETS_S)
    count: int = 0
    sum_s: float = 0.0


#: solve times kept for percentiles (the newest); the histogram, count, sum and max cover all
SOLVE_WINDOW = 100_000


class SolveTimes:
    """Solve times in bounded memory: the last `window` (ms, for percentiles) in a ring, and the
    histogram, count, sum and maximum of every solve, kept up to date per solve."""

    def __init__(self, window: int = SOLVE_WINDOW) -> None:
        self.recent: deque[float] = deque(maxlen=window)
        self._bins = [0] * (len(SOLVE_BUCKETS_S) + 1)
        self._sum_s = 0.0
        self.count = 0
        self.max_ms = 0.0

    @property
    def ms(self) -> list[float]:
        """The last `window` solve times, oldest first."""
        return list(self.recent)

    def restore(self, recent: list[float], count: int, sum_ms: float, max_ms: float, le: list[int]) -> None:
        """Take up a stored run: its last solve times and the totals of all (`le`: cumulative
        counts per bucket of SOLVE_BUCKETS_S, as `histogram` gives them)."""
        self.recent.extend(recent)
        self.count, self._sum_s, self.max_ms = count, sum_ms / 1000.0, max_ms
        edges = [*le, count]
        self._bins = [edges[0]] + [b - a for a, b in zip(edges, edges[1:])]

    def add(self, ms: float) -> None:
        self.recent.append(ms)
        self.count += 1
        self.max_ms = max(self.max_ms, ms)
        s = ms / 1000.0
        self._bins[bisect.bisect_left(SOLVE_BUCKETS_S, s)] += 1
        self._sum_s += s

    def histogram(self) -> SolveHistogram:
        le, total = [], 0
        for n in self._bins[:-1]:
            total += n
            le.append(total)
        return SolveHistogram(tuple(le), self.count, self._sum_s)
