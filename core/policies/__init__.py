"""Size policies: exact (`milp`), BFTrainer's `even` heuristic and `greedy` marginal gain."""
from __future__ import annotations

from .base import SizeDecision, SizePolicy, SizeProblem
from .even import EvenPolicy
from .greedy import GreedyPolicy
from .milp import SOLVERS, MilpPolicy

POLICIES = ("milp", "even", "greedy")


def make_policy(name: str, solver: str = "dp") -> SizePolicy:
    if name == "milp":
        return MilpPolicy(solver)
    if name == "even":
        return EvenPolicy()
    if name == "greedy":
        return GreedyPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


__all__ = ["POLICIES", "SOLVERS", "SizeDecision", "SizePolicy", "SizeProblem", "make_policy"]
