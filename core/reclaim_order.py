"""Which end of a cohort the main scheduler takes back first, learned from its reclaims.

A batch job that starts on part of a cohort (nodes freed together) takes some of its nodes, and a
scheduler picks them in an order of its own. On the Summit trace it is the machine order: over the
fortnight's 9,469 reclaims that took part of a cohort, the nodes taken sit on average at 0.25 of
their cohort in name order (0 its first node, 1 its last, 0.5 no preference; `python -m
bench.cohorts`). Placement then fills growing jobs from the other end, so the nodes a cohort loses
first are the ones left free, and a reclaim that takes part of a cohort finds them before it
finds a job.

Each reclaim that takes part of a cohort (of two nodes or more) is one observation: the mean
position of the nodes taken. The direction is known once enough observations say, at about 95 %
confidence (two standard errors), that their mean is off 0.5; until then, and on a machine whose
scheduler picks nodes in no such order, nothing changes. Pure: no clock, no I/O.
"""
from __future__ import annotations

import math
from typing import Mapping

from .model import node_order

MIN_OBSERVED = 10     # partial reclaims before a direction is trusted (a mean of fewer says little)
CONFIDENCE_SE = 2.0   # standard errors the mean must lie off 0.5 (about 95 %)


class ReclaimOrder:
    """Running mean of where, in machine order, partial reclaims take a cohort's nodes."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.squares = 0.0

    def observe(self, position: float) -> None:
        """One partial reclaim whose taken nodes sat at `position` of their cohort on average."""
        if not 0.0 <= position <= 1.0:
            raise ValueError(f"a position in a cohort is in [0, 1], not {position}")
        self.count += 1
        self.total += position
        self.squares += position * position

    def taken(self, gone: Mapping[str, float], idle: Mapping[str, float]) -> None:
        """One step's reclaims: `gone` the nodes the main scheduler took (node -> idle since),
        `idle` the nodes still idle (the same). A cohort is the nodes idle since one moment; each
        cohort the step took part of gives one observation."""
        cohorts: dict[float, list[str]] = {}
        for node, since in gone.items():
            cohorts.setdefault(since, []).append(node)
        left: dict[float, list[str]] = {}
        for node, since in idle.items():
            if since in cohorts:
                left.setdefault(since, []).append(node)
        for since, taken in cohorts.items():
            rest = left.get(since)
            if not rest:
                continue          # the whole cohort went: it says nothing about the order
            members = sorted((*taken, *rest), key=node_order)
            where = {n: i for i, n in enumerate(members)}
            last = len(members) - 1
            self.observe(sum(where[n] for n in taken) / (len(taken) * last))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def direction(self) -> int:
        """+1: the scheduler takes a cohort's first nodes (in machine order) first; -1: its last
        nodes first; 0: not known (too few observations, or no preference)."""
        if self.count < MIN_OBSERVED:
            return 0
        m = self.mean
        var = max(0.0, self.squares / self.count - m * m) * self.count / (self.count - 1)
        se = math.sqrt(var / self.count)
        if m + CONFIDENCE_SE * se < 0.5:
            return 1
        if m - CONFIDENCE_SE * se > 0.5:
            return -1
        return 0

    def to_dict(self) -> dict:
        """What the dashboard and API show: the direction and what it was learned from."""
        return {"direction": self.direction, "reclaims": self.count,
                "mean_position": None if math.isnan(self.mean) else round(self.mean, 3)}

    def state(self) -> dict:
        return {"count": self.count, "total": self.total, "squares": self.squares}

    def load(self, state: Mapping) -> None:
        """Take up what `state()` wrote; refuses numbers no sequence of observations gives."""
        count, total, squares = int(state.get("count", 0)), float(state.get("total", 0.0)), \
            float(state.get("squares", 0.0))
        if count < 0 or not 0.0 <= total <= count or not 0.0 <= squares <= total + 1e-9 \
                or squares * count + 1e-9 < total * total:
            raise ValueError(f"reclaim order state does not add up: {dict(state)}")
        self.count, self.total, self.squares = count, total, squares
