"""BFTrainer's objective as a value per (job, candidate size).

Every policy and solver works on these tables, so the MILP, the DP fast path and the
heuristics optimise (or approximate) exactly the same thing:

    v_j(n) = w_j * ( T_fwd * S_j(n) - [n > c_j] * up_j * S_j(c_j) - [n < c_j] * down_j * S_j(c_j) )

for n in {0} U [min_j, max_j], where S_j is 0 below min_j, with a fixed T_fwd (BFTrainer).

With `--tfwd auto` (core.horizon) each job has its own horizon T_j, the seconds its next
rescale is amortised over, and the objective is the throughput net of that amortised cost:

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

OBJECTIVES = ("throughput", "efficiency", "priority")
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

    @property
    def current(self) -> int:
        return len(self.current_nodes)


@dataclass
class Problem:
    """Idle nodes (the nodes jobs hold included) and the jobs to divide them among."""

    nodes: list[str]
    jobs: list[JobRequest]
    tfwd: float = 10.0
    objective: str = "throughput"
    expect: Optional[Mapping[str, float]] = None  # node -> expected remaining idle s (placement)

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
    if amortised:
        span = job.horizon if job.horizon is not None else tfwd
        table = rate.astype(float)
        table[n > c] -= job.scale_up_seconds * sc / span
        table[n < c] -= job.scale_down_seconds * sc / span
    else:
        table = tfwd * rate
        table[n > c] -= job.scale_up_seconds * sc
        table[n < c] -= job.scale_down_seconds * sc
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
