"""The exact policy: BFTrainer's MILP over per-job size choices (a multiple-choice knapsack).

Nodes are interchangeable, so one binary per (job, candidate size) and one capacity row give
the same optimum as BFTrainer's one-binary-per-(job, node) model. Two ways to solve it:

- `dp` (default): an exact dynamic programme over node counts, vectorised with numpy. It is the
  same optimisation (tests check it against PuLP and against exhaustive enumeration) at a
  fraction of the cost of building a PuLP model on every event.
- `highs` / `cbc`: the MILP built with PuLP and handed to HiGHS (highspy) or CBC, with a time
  limit; an unfinished solve falls back to its incumbent, or to the greedy plan if it has none.
"""
from __future__ import annotations

import math

import numpy as np

from .base import SizeDecision, SizePolicy, SizeProblem, best_size
from .caps import capped_sizes
from .greedy import greedy_sizes
from .maxplus import maxplus_row

SOLVERS = ("dp", "highs", "cbc")


def prune(table: np.ndarray) -> np.ndarray:
    """Drop dominated sizes: a size is worth offering only if it beats every smaller one."""
    out = np.full_like(table, -math.inf)
    out[0] = table[0]
    if len(table) > 1:
        running = np.maximum.accumulate(table)
        keep = table[1:] > running[:-1]
        out[1:][keep] = table[1:][keep]
    return out


def dp_sizes(tables: list[np.ndarray], capacity: int, current: list[int]) -> list[int]:
    """Exact optimum of  max sum_j t_j[n_j]  s.t.  sum_j n_j <= capacity.

    Row i of the programme is best value of jobs 0..i with at most c nodes, kept only for the
    c that can matter: at most the nodes jobs 0..i can use, at least what jobs after i leave.
    """
    pruned = [prune(t) for t in tables]
    tops = [int(np.flatnonzero(np.isfinite(t))[-1]) for t in pruned]
    if sum(tops) <= capacity:  # capacity does not bind: every job takes its own best size
        sizes = [best_size(t, c) for t, c in zip(tables, current)]
        if sum(sizes) <= capacity:   # (a tie kept at a current size past a pruned top may not fit)
            return sizes
    C = min(capacity, sum(tops))   # pruned sizes never need more
    J = len(pruned)
    suffix = np.concatenate([np.cumsum(tops[::-1])[::-1][1:], [0]]).tolist()
    rows: list[tuple[int, int, np.ndarray]] = []  # (lo, hi, values over lo..hi)
    prev_lo, prev_hi, prev = 0, 0, np.zeros(1)     # no job: value 0 whatever the capacity
    reach = 0
    for i in range(J):
        m = tops[i]
        reach += m
        lo, hi = max(0, C - suffix[i]), min(C, reach)
        # ext[k] = prev at capacity (lo - m + k), clamped above, -inf below zero
        idx = np.arange(lo - m, hi + 1)
        ext = np.where(idx < 0, -math.inf, prev[np.clip(idx, prev_lo, prev_hi) - prev_lo])
        # the unpruned table: the same row (prev grows with capacity, so a dominated size never
        # wins) and linear between its knots, so the row costs its runs, not rows x sizes
        row = maxplus_row(ext, np.asarray(tables[i][: m + 1], dtype=float))
        rows.append((lo, hi, row))
        prev_lo, prev_hi, prev = lo, hi, row
    sizes = [0] * J
    c = C
    for i in range(J - 1, -1, -1):
        t = pruned[i]
        m = min(tops[i], c)
        if i == 0:
            before = np.zeros(m + 1)
        else:
            plo, phi, prow = rows[i - 1]
            caps = c - np.arange(m + 1)
            before = prow[np.clip(caps, plo, phi) - plo]
        total = before + t[: m + 1]
        best = total.max()
        cur = current[i]
        n = cur if cur <= m and total[cur] == best else int(np.flatnonzero(total == best)[0])
        sizes[i] = n
        c -= n
    return sizes


def pulp_sizes(problem: SizeProblem, solver: str) -> tuple[list[int] | None, str]:
    """Solve the size-choice MILP with PuLP; None when no feasible incumbent came back."""
    import pulp

    model = pulp.LpProblem("bftrainer_sizes", pulp.LpMaximize)
    choices: list[list[tuple[int, pulp.LpVariable]]] = []
    objective, load = [], []
    for j, table in enumerate(problem.tables):
        t = prune(table)
        opts = []
        for n in np.flatnonzero(np.isfinite(t)).tolist():
            x = model.add_variable(f"x_{j}_{n}", cat=pulp.LpBinary)
            opts.append((n, x))
            objective.append((x, float(t[n])))
            if n:
                load.append((x, n))
        model += pulp.LpAffineExpression([(x, 1) for _, x in opts]) == 1, f"one_size_{j}"
        choices.append(opts)
    model += pulp.LpAffineExpression(objective)
    model += pulp.LpAffineExpression(load) <= problem.capacity, "capacity"
    for k, (limit, members) in enumerate(problem.caps):    # an owner's or account's node cap
        model += pulp.LpAffineExpression([(x, n) for j in members for n, x in choices[j] if n]) <= limit, f"cap_{k}"
    # gapRel=0: HiGHS stops at a 1e-4 relative gap by default, which is not the exact optimum
    if solver == "highs":
        engine = pulp.HiGHS(msg=False, timeLimit=problem.time_limit, gapRel=0.0)
    elif solver == "cbc":
        engine = pulp.PULP_CBC_CMD(msg=False, timeLimit=problem.time_limit, gapRel=0.0)
    else:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    model.solve(engine)
    # PuLP reports status "Optimal" for a time-limited incumbent too; sol_status tells them apart
    if model.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return None, "no_incumbent"
    sizes = []
    for opts in choices:
        picked = [n for n, x in opts if (x.value() or 0) > 0.5]
        if len(picked) != 1:
            return None, "no_incumbent"
        sizes.append(picked[0])
    if sum(sizes) > problem.capacity or any(sum(sizes[j] for j in m) > limit for limit, m in problem.caps):
        return None, "no_incumbent"
    return sizes, "optimal" if model.sol_status == pulp.LpSolutionOptimal else "time_limit"


class MilpPolicy(SizePolicy):
    name = "milp"

    def __init__(self, solver: str = "dp") -> None:
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
        self.solver = solver

    def choose(self, problem: SizeProblem) -> SizeDecision:
        if not problem.tables:
            return SizeDecision([], "optimal", self.solver)
        if self.solver == "dp":
            if problem.caps:
                return SizeDecision(capped_sizes(problem.tables, problem.capacity, problem.current, problem.caps,
                                                 dp_sizes), "optimal", "dp")
            return SizeDecision(dp_sizes(problem.tables, problem.capacity, problem.current), "optimal", "dp")
        sizes, status = pulp_sizes(problem, self.solver)
        if sizes is None:
            return SizeDecision(greedy_sizes(problem), "fallback", self.solver)
        return SizeDecision(sizes, status, self.solver)
