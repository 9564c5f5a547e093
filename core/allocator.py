"""Divide the idle nodes among the running jobs: sizes from a policy, then a mapping (core.placement).

    python -m core.allocator INSTANCE.json [--policy milp|even|greedy] [--solver dp|highs|cbc]

prints the plan as JSON (see README for the instance format).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from pydantic import ValidationError

from .objective import OBJECTIVES, JobRequest, Problem, objective_value, tables_for
from .placement import place
from .policies import POLICIES, SOLVERS, SizePolicy, SizeProblem, make_policy
from .policies.base import GroupCap, binding, check_sizes
from .schemas import Instance, explain


@dataclass
class Plan:
    status: str
    objective: float
    solve_ms: float
    assignment: dict[str, list[str]]
    sizes: dict[str, int] = field(default_factory=dict)
    policy: str = "milp"
    solver: str = "dp"

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "objective": self.objective,
            "solve_ms": round(self.solve_ms, 3),
            "assignment": self.assignment,
            "sizes": self.sizes,
            "policy": self.policy,
            "solver": self.solver,
        }


def allocate(problem: Problem, policy: Union[str, SizePolicy] = "milp", solver: str = "dp",
             time_limit: float = 5.0) -> Plan:
    """Build, solve and map in one call; solve_ms covers all three."""
    t0 = time.perf_counter()
    pol = make_policy(policy, solver) if isinstance(policy, str) else policy
    if not problem.jobs or not problem.nodes:
        sizes = [0] * len(problem.jobs)
        tables = tables_for(problem)
        status, used_solver = "optimal", getattr(pol, "solver", pol.name)
    else:
        tables = tables_for(problem)
        sp = SizeProblem(tables, problem.capacity, [j.current for j in problem.jobs],
                         [j.min_nodes for j in problem.jobs], time_limit, group_caps(problem, tables))
        decision = pol.choose(sp)
        check_sizes(sp, decision.sizes)
        sizes, status, used_solver = decision.sizes, decision.status, decision.solver
    assignment = (place(problem.jobs, sizes, problem.nodes, problem.expect, problem.since, problem.order)
                  if problem.jobs else {})
    objective = objective_value(tables, sizes)
    ms = (time.perf_counter() - t0) * 1000.0
    return Plan(status, objective, ms, assignment,
                {j.id: n for j, n in zip(problem.jobs, sizes)}, pol.name, used_solver)


def group_caps(problem: Problem, tables: list) -> list[GroupCap]:
    """The problem's node caps as job indices, only those that can bind (a cap at or above what
    its jobs could take together changes nothing and costs the solve nothing)."""
    if not problem.caps:
        return []
    index = {j.id: k for k, j in enumerate(problem.jobs)}
    caps = [(max(0, int(c.limit)), tuple(sorted({index[x] for x in c.jobs if x in index}))) for c in problem.caps]
    return binding([c for c in caps if c[1]], [len(t) - 1 for t in tables])


def problem_from_instance(inst: Instance) -> Problem:
    jobs = [JobRequest(j.id, j.min_nodes, j.max_nodes, j.curve.to_curve(), j.scale_up_seconds,
                       j.scale_down_seconds, tuple(j.current_nodes), j.priority, fair=j.fair) for j in inst.jobs]
    return Problem(list(inst.nodes), jobs, inst.tfwd, inst.objective)


def load_instance(path: Path) -> Problem:
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise SystemExit(f"{path}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}:{e.lineno}: not valid JSON: {e.msg}")
    try:
        return problem_from_instance(Instance.model_validate(raw))
    except ValidationError as e:
        raise SystemExit(explain(e, str(path)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.allocator", description=__doc__.splitlines()[0])
    ap.add_argument("instance", type=Path)
    ap.add_argument("--policy", choices=POLICIES, default="milp")
    ap.add_argument("--solver", choices=SOLVERS, default="dp")
    ap.add_argument("--objective", choices=OBJECTIVES,
                    help="override the instance's objective")
    ap.add_argument("--time-limit", type=float, default=5.0, help="MILP solver limit, seconds")
    args = ap.parse_args(argv)
    problem = load_instance(args.instance)
    if args.objective:
        problem.objective = args.objective
    plan = allocate(problem, args.policy, args.solver, args.time_limit)
    print(json.dumps(plan.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
