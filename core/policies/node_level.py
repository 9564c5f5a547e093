"""BFTrainer's original node-level MILP, kept as a reference and a benchmark baseline.

It is not a policy the controller uses. BFTrainer decides which job gets each node with one
binary per (job, node), so the model grows with jobs x nodes and its solve stalls at a few
hundred nodes; the allocator reaches the same optimum with per-job size choices (core.policies.milp)
and a mapping (core.placement) that may move a growing job to better cohorts at the same
objective value. This module exists so that tests can check that the
two formulations agree and the benchmark can show what the size-level model saves.

Variables, for job j, node i and candidate size s (the sizes the pruned value table offers):

    x[j,i] = 1  if job j holds node i after the decision
    y[j,s] = 1  if job j gets s nodes                    sum_s y[j,s] = 1
                                                         sum_i x[j,i] = sum_s s * y[j,s]
                                                         sum_j x[j,i] <= 1
    g[j]   = 1  if job j keeps all its nodes (and may gain free ones), 0 if it keeps a subset:
                x[j,i] >= g[j] for its current nodes,  x[j,i] <= g[j] for all other nodes,
                so a job never both gains and loses nodes (no migration).

maximising sum_{j,s} v_j(s) * y[j,s] with v_j from core.objective.value_table.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import pulp  # at import time, unlike milp.py: the controller never loads this module

from ..objective import JobRequest, Problem, objective_value, tables_for
from .milp import prune

NODE_LEVEL_SOLVERS = ("cbc", "highs")

Choices = list[list[tuple[int, pulp.LpVariable]]]     # per job: (size s, y[j,s])


def node_level_solve(problem: Problem, solver: str = "cbc", time_limit: float = 60.0) -> dict:
    """Build and solve the node-level MILP.

    Returns {"status": "optimal" | "time_limit" | "no_incumbent", "objective": float | None,
    "assignment": {job: [nodes]}, "sizes": {job: n}, "build_ms", "solve_ms"}.
    """
    t0 = time.perf_counter()
    jobs, nodes = problem.jobs, list(problem.nodes)
    tables = tables_for(problem)
    if not jobs or not nodes:  # nothing to decide: every job ends at 0 nodes
        sizes = [0] * len(jobs)
        return {"status": "optimal", "objective": objective_value(tables, sizes),
                "assignment": {j.id: [] for j in jobs}, "sizes": {j.id: 0 for j in jobs},
                "build_ms": (time.perf_counter() - t0) * 1000.0, "solve_ms": 0.0}
    model, x, choices = _build(jobs, nodes, tables)
    t1 = time.perf_counter()
    engine = _engine(solver, time_limit)
    model.solve(engine)
    t2 = time.perf_counter()
    result = {"status": "no_incumbent", "objective": None, "assignment": {}, "sizes": {},
              "build_ms": (t1 - t0) * 1000.0, "solve_ms": (t2 - t1) * 1000.0}
    return _read_solution(model, x, choices, jobs, nodes, tables, result)


def _build(jobs: Sequence[JobRequest], nodes: list[str],
           tables: Sequence[np.ndarray]) -> tuple[pulp.LpProblem, list[list[pulp.LpVariable]], Choices]:
    """The model: x[j,i] for every job and node, each job's size choice, one job per node, and
    the objective."""
    model = pulp.LpProblem("bftrainer_node_level", pulp.LpMaximize)
    x = [[model.add_variable(f"x_{j}_{i}", cat=pulp.LpBinary) for i in range(len(nodes))]
         for j in range(len(jobs))]
    index = {n: i for i, n in enumerate(nodes)}
    objective = []
    choices: Choices = []
    for j, (job, table) in enumerate(zip(jobs, tables)):
        t = prune(table)
        opts = _add_job(model, j, x[j], t, {index[n] for n in job.current_nodes})
        choices.append(opts)
        objective += [(y, float(t[s])) for s, y in opts]
    for i in range(len(nodes)):
        model += pulp.LpAffineExpression([(x[j][i], 1) for j in range(len(jobs))]) <= 1, f"node_{i}"
    model += pulp.LpAffineExpression(objective)
    return model, x, choices


def _add_job(model: pulp.LpProblem, j: int, xj: list[pulp.LpVariable], table: np.ndarray,
             held: set[int]) -> list[tuple[int, pulp.LpVariable]]:
    """Job j's rows: y[j,s] for each size its pruned `table` offers (exactly one chosen), its
    node count equal to that size, and g[j] so that it never both gains and loses nodes
    (`held`: the indices of the nodes it holds)."""
    opts = [(s, model.add_variable(f"y_{j}_{s}", cat=pulp.LpBinary))
            for s in np.flatnonzero(np.isfinite(table)).tolist()]
    model += pulp.LpAffineExpression([(y, 1) for _, y in opts]) == 1, f"one_size_{j}"
    model += (pulp.LpAffineExpression([(v, 1) for v in xj] + [(y, -s) for s, y in opts if s])
              == 0), f"size_{j}"
    g = model.add_variable(f"g_{j}", cat=pulp.LpBinary)
    for i in range(len(xj)):
        if i in held:
            model += xj[i] - g >= 0, f"keep_{j}_{i}"
        else:
            model += xj[i] - g <= 0, f"gain_{j}_{i}"
    return opts


def _engine(solver: str, time_limit: float) -> pulp.LpSolver:
    """The PuLP solver to run, proving optimality (no gap) within `time_limit` seconds."""
    if solver == "cbc":
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=0.0)
    if solver == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=0.0)
    raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(NODE_LEVEL_SOLVERS)}")


def _read_solution(model: pulp.LpProblem, x: list[list[pulp.LpVariable]], choices: Choices,
                   jobs: Sequence[JobRequest], nodes: list[str], tables: Sequence[np.ndarray],
                   result: dict) -> dict:
    """`result` filled in from the solved model; left at no_incumbent when the solver found no
    solution or one that does not read as one size and that many nodes per job."""
    # PuLP says "Optimal" for a time-limited incumbent too; sol_status tells them apart
    if model.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return result
    sizes = []
    for opts in choices:
        picked = [s for s, y in opts if (y.value() or 0) > 0.5]
        if len(picked) != 1:
            return result
        sizes.append(picked[0])
    assignment = {job.id: [nodes[i] for i in range(len(nodes)) if (x[j][i].value() or 0) > 0.5]
                  for j, job in enumerate(jobs)}
    if any(len(assignment[job.id]) != n for job, n in zip(jobs, sizes)):
        return result
    value = objective_value(tables, sizes)
    result.update(status="optimal" if model.sol_status == pulp.LpSolutionOptimal else "time_limit",
                  objective=value if math.isfinite(value) else None, assignment=assignment,
                  sizes={job.id: n for job, n in zip(jobs, sizes)})
    return result
