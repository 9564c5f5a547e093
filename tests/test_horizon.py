"""The horizon learner (core/horizon.py) on fragments whose true survival is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.horizon import FALLBACK_S, FragmentSurvival, HorizonLearner


def test_exponential_fragments_have_no_memory() -> None:
    """Exponential idle times: the expected remaining time is the mean whatever the age."""
    rng = np.random.default_rng(0)
    s = FragmentSurvival()
    for d in rng.exponential(500.0, 20_000):
        s.observe(float(d))
    none = np.array([])
    assert s.remaining(np.array([0.0, 100.0, 1000.0]), none) == pytest.approx([500.0] * 3, rel=0.05)
    assert s.median(none) == pytest.approx(500.0 * math.log(2), rel=0.03)
    assert s.reclaim_within(np.array([0.0, 800.0]), 500.0, none) == pytest.approx([1 - math.exp(-1)] * 2, rel=0.03)


def test_censored_nodes_count_as_surviving() -> None:
    """Nodes still idle are fragments at least as long as their age: ignoring them would make
    fragments look shorter than they are."""
    s = FragmentSurvival()
    for d in [100.0] * 50:
        s.observe(d)
    long_idle = np.full(60, 5000.0)
    assert s.median(np.array([])) < 150.0
    assert s.median(long_idle) > 150.0
    assert s.remaining(np.array([0.0]), long_idle)[0] > 10 * s.remaining(np.array([0.0]), np.array([]))[0]


def test_heavy_tail_old_nodes_stay_longer() -> None:
    rng = np.random.default_rng(1)
    h = HorizonLearner()
    for d in (rng.pareto(1.5, 10_000) + 1.0) * 60.0:
        h.ended(float(d))
    m = h.expected([0.0, 100.0, 1000.0, 10_000.0], [])
    assert all(b > a for a, b in zip(m, m[1:]))


def test_fallback_until_a_fragment_ended_then_per_job_horizons() -> None:
    """T_j = 1 / (sum of the held nodes' reclaim rates + a free node's): a job holding more, or
    younger (likelier to go), nodes amortises a rescale over less time."""
    h = HorizonLearner()
    first = h.decide([10.0, 20.0], [None, None], ["J"])
    assert first.tfwd == FALLBACK_S and not first.learned and first.fragments == 0 and not first.jobs
    for d in np.random.default_rng(2).exponential(600.0, 5000):
        h.ended(float(d))
    holders = ["A"] * 9 + ["B"] * 40 + [None] * 51
    got = h.decide(np.full(100, 60.0), holders, ["A", "B", "C"])
    assert got.learned and got.fragments == 5000 and got.nodes == 100
    assert got.node_life_s == pytest.approx(600.0, rel=0.1)            # exponential: no memory
    life = got.node_life_s
    assert got.jobs["A"] == pytest.approx(life / 10) and got.jobs["B"] == pytest.approx(life / 41)
    assert got.jobs["C"] == pytest.approx(life)                          # holds nothing yet
    assert got.tfwd == pytest.approx(life / 10)                          # the median job's
    assert set(got.to_dict()) == {"tfwd", "fragments", "nodes", "median_s", "node_life_s", "learned", "jobs"}


def test_heavy_tail_long_idle_nodes_give_longer_horizons() -> None:
    rng = np.random.default_rng(3)
    h = HorizonLearner()
    for d in (rng.pareto(1.5, 10_000) + 1.0) * 60.0:
        h.ended(float(d))
    ages = np.array([5.0] * 4 + [20_000.0] * 4 + [60.0] * 4)
    got = h.decide(ages, ["young"] * 4 + ["old"] * 4 + [None] * 4, ["young", "old"])
    assert got.jobs["old"] > 2 * got.jobs["young"]
