"""BFTrainer's objective as a value per (job, candidate size).

Every policy and solver works on these tables, so the MILP, the DP fast path and the
heuristics optimise (or approximate) exactly the same thing:

    v_j(n) = w_j * ( T_fwd * S_j(n) - [n > c_j] * up_j * S_j(c_j) - [n < c_j] * down_j * S_j(c_j) )

for n in {0} U [min_j, max_j], where S_j is 0 below min_j, with a fixed T_fwd (BFTrainer).
A job already in a rescale pause (p_j seconds left of it, typically a reclaim's forced shrink
decided at the same moment) pays only what a new regroup adds to it: up_j and down_j become
max(0, up_j - p_j) and max(0, down_j - p_j) (JobRequest.pause).

With `--tfwd auto` (core.horizon) each job carries a horizon T_j, the seconds its next rescale
is amortised over (the learner gives every job the same one; the form allows one per job), and
the objective is the throughput net of that amortised cost:

    v_j(n) = w_j * ( S_j(n) - ([n > c_j] * up_j + [n < c_j] * down_j) * S_j(c_j) / T_j )

(samples per second). With every T_j equal to T_fwd it is BFTrainer's objective divided by
T_fwd, so the same sizes win; with different T_j, jobs still compare samples per second, not
samples over windows of different lengths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from .model import Curve

OBJECTIVES = ("throughput", "efficiency", "priority", "fairshare")
NEG_INF = -math.inf


@dataclass(frozen=True)
class JobRequest:
    """One job as the allocator sees it: bounds, believed curve, costs, the nodes it holds."""

    id: str
    min_nodes: int
    max_nodes: int
    curve: Curve
    scale_up_seconds: float = 0.0
    scale_down_seconds: float = 0.0
    current_nodes: tuple[str, ...] = ()
    priority: float = 1.0
    bonus: float = 0.0            # added to every running size: forces a probe (min = max = size)
    horizon: Optional[float] = None   # T_j, seconds a rescale is amortised over (tfwd auto)
    paused_s: float = 0.0         # seconds left of a rescale pause under way (a reclaim's, say)
    fair: float = 1.0             # the owner's fair-share factor (core.fairshare), objective fairshare

    def pause(self, n: int) -> float:
        """Seconds of pause that changing to n nodes adds: a regroup that starts while one is
        under way ends on the last membership, so only what outlasts the current pause counts."""
        c = self.current
        full = self.scale_up_seconds if n > c else self.scale_down_seconds if n < c else 0.0
        return max(0.0, full - self.paused_s)

    @property
    def current(self) -> int:
        return len(self.current_nodes)


@dataclass(frozen=True)
class Cap:
    """At most `limit` nodes at once over the jobs `jobs` (ids): an owner's or an account's node
    cap (core.quotas). The caps of one problem are laminar: two are disjoint or one holds the other."""

    limit: int
    jobs: tuple[str, ...]
    who: str = ""


@dataclass
class Problem:
    """Idle nodes (the nodes jobs hold included) and the jobs to divide them among."""

    nodes: list[str]
    jobs: list[JobRequest]
    tfwd: float = 10.0
    objective: str = "throughput"
    expect: Optional[Mapping[str, float]] = None  # node -> expected remaining idle s (placement)
    since: Optional[Mapping[str, float]] = None   # node -> when it became idle (placement's cohorts)
    order: int = 0       # which end of a cohort the main scheduler takes first (core.reclaim_order)
    caps: Sequence[Cap] = ()   # node caps over groups of jobs (owners, accounts): sum of sizes <= limit

    @property
    def capacity(self) -> int:
        return len(self.nodes)


def effective_rate(job: JobRequest, n: int) -> float:
    """Samples/s the allocator expects at n nodes: nothing below the job's minimum."""
    return job.curve(n) if n >= job.min_nodes else 0.0


def weight(job: JobRequest, objective: str) -> float:
    if objective == "throughput":
        return 1.0
    if objective == "priority":
        return float(job.priority)
    if objective == "fairshare":
        return float(job.fair)
    if objective == "efficiency":
        one = job.curve(1)
        return 1.0 / one if one > 0 else 1.0
    raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")


def value_table(job: JobRequest, tfwd: float, capacity: int, objective: str = "throughput",
                amortised: bool = False) -> np.ndarray:
    """v_j(0..min(max_j, capacity)); -inf where the size is not allowed (0 < n < min_j).
    `amortised`: the per-job form (samples/s net of the rescale over T_j = job.horizon, else
    over `tfwd`); otherwise BFTrainer's (samples over `tfwd` less the rescale pause)."""
    top = min(job.max_nodes, capacity)
    w = weight(job, objective)
    c = job.current
    sc = effective_rate(job, c)
    n = np.arange(top + 1)
    rate = job.curve.rates(n)
    up, down = job.pause(c + 1), job.pause(c - 1)
    if amortised:
        span = job.horizon if job.horizon is not None else tfwd
        table = rate.astype(float)
        table[n > c] -= up * sc / span
        table[n < c] -= down * sc / span
    else:
        table = tfwd * rate
        table[n > c] -= up * sc
        table[n < c] -= down * sc
    table *= w
    if job.bonus:
        table[job.min_nodes:] += job.bonus
    table[1:job.min_nodes] = NEG_INF
    return table


def objective_value(tables: Sequence[np.ndarray], sizes: Sequence[int]) -> float:
    """Objective of a size choice: the sum of each job's table entry at its size."""
    return float(sum(t[n] for t, n in zip(tables, sizes)))


def amortised(problem: Problem) -> bool:
    """The per-job form: some job carries its own horizon (tfwd auto)."""
    return any(j.horizon is not None for j in problem.jobs)


def tables_for(problem: Problem) -> list[np.ndarray]:
    per_job = amortised(problem)
    return [value_table(j, problem.tfwd, problem.capacity, problem.objective, per_job) for j in problem.jobs]
