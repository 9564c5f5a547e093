"""The horizon learner (core/horizon.py) on fragments whose true survival is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.horizon import FALLBACK_S, MIN_STANDS, FragmentSurvival, HorizonLearner


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


def stood(h: HorizonLearner, job: str, lengths) -> float:
    """Feed `job`'s allocation changes so that its allocations stand `lengths` seconds each;
    returns the time of the last change."""
    t = 0.0
    h.changed(job, t)
    for d in lengths:
        t += float(d)
        h.changed(job, t)
    return t


def test_fallback_until_enough_stands_then_their_median() -> None:
    """The horizon is the median time an allocation stands before it changes; BFTrainer's 10 s
    until MIN_STANDS have ended. The idle fragments are for placement and for the record."""
    h = HorizonLearner()
    first = h.decide([10.0, 20.0], ["J"], 0.0)
    assert first.tfwd == FALLBACK_S and not first.learned and first.stands == 0 and not first.jobs
    stood(h, "X", [300.0] * (MIN_STANDS - 1))
    assert not h.decide([10.0], ["J"], 0.0).learned                       # one short of MIN_STANDS
    h = HorizonLearner()
    end = stood(h, "X", np.random.default_rng(2).exponential(300.0, 5000))
    for d in np.random.default_rng(3).exponential(600.0, 2000):
        h.ended(float(d))
    got = h.decide(np.full(100, 60.0), ["A", "B"], end)
    assert got.learned and got.stands == 5000 and got.standing == 0        # A, B never changed
    assert got.tfwd == pytest.approx(300.0 * math.log(2), rel=0.06)        # exponential median
    assert got.jobs == {"A": got.tfwd, "B": got.tfwd}
    assert got.fragments == 2000 and got.node_life_s == pytest.approx(600.0, rel=0.1)
    assert set(got.to_dict()) == {"tfwd", "fragments", "nodes", "median_s", "node_life_s", "learned", "jobs",
                                  "stands", "standing", "bound"}


def test_before_enough_stands_the_horizon_is_what_the_standing_ones_vouch_for() -> None:
    """Until MIN_STANDS allocations have changed: the fallback, or, once allocations have stood
    longer, the median with those standing taken as ended now; never the Kaplan-Meier median of
    too few, and never past what was seen."""
    h = HorizonLearner()
    stood(h, "X", [30.0, 40.0])
    for j in "ABC":
        h.changed(j, 0.0)
    early = h.decide([1.0], ["A", "B", "C"], 5.0)       # 30, 40 ended; A, B, C have stood 5 s
    assert early.tfwd == FALLBACK_S and not early.learned and not early.bound
    later = h.decide([1.0], ["A", "B", "C"], 600.0)     # 30, 40, 600, 600, 600: the median is 600
    assert not later.learned and later.bound and not later.jobs and later.standing == 3
    assert 600.0 * 10 ** (-1 / 16) <= later.tfwd <= 600.0 * 10 ** (1 / 16)
    assert later.to_dict()["bound"] is True
    assert h.decide([1.0], ["A"], 600.0).tfwd < 100.0    # 30, 40, 600: the median is 40


@pytest.mark.parametrize("seed", range(5))
def test_the_lower_bound_is_never_above_the_median_to_come(seed: int) -> None:
    """Whatever the durations still going turn out to be, the bound taken from their ages now is
    at most the median of them all once they have ended (to a grid bin)."""
    rng = np.random.default_rng(seed)
    durations = rng.pareto(1.2, 40) * 100.0 + 1.0
    going = rng.random(40) < 0.5
    s = FragmentSurvival()
    for d in durations[~going]:
        s.observe(float(d))
    ages = durations[going] * rng.random(int(going.sum()))
    assert s.lower_median(ages) <= np.median(durations) * 10 ** (1 / 16)
    assert math.isnan(FragmentSurvival().lower_median(np.array([])))


def test_standing_allocations_count_as_censored() -> None:
    """Allocations standing now have lasted at least their age: where more than half outlive
    every stand that ended, the median moves out to them."""
    h = HorizonLearner()
    stood(h, "X", [100.0] * 30)
    for k in range(10):
        h.changed(f"J{k}", 0.0)
    jobs = [f"J{k}" for k in range(10)]
    few = h.decide([1.0], jobs, 1000.0)
    assert few.learned and few.standing == 10 and few.tfwd == pytest.approx(100.0, rel=0.16)   # within a grid bin
    h = HorizonLearner()
    stood(h, "X", [100.0] * 10)
    jobs = [f"J{k}" for k in range(30)]
    for j in jobs:
        h.changed(j, 0.0)
    many = h.decide([1.0], jobs, 1000.0)
    assert many.learned and 1000.0 <= many.tfwd <= 1000.0 * 10 ** (2 / 16)    # to a grid bin or two
    for j in jobs:
        h.left(j)
    assert h.decide([1.0], jobs, 1000.0).tfwd == pytest.approx(100.0, rel=0.16)


def test_state_keeps_fragments_and_stands_and_reads_the_old_form() -> None:
    h = HorizonLearner()
    stood(h, "X", [100.0, 200.0])
    h.ended(300.0)
    again = HorizonLearner()
    again.load(h.state())
    assert again.state() == h.state() and again.stands.count == 2 and again.survival.count == 1
    old = HorizonLearner()
    old.load(h.survival.state())                  # a store written before stands were learned
    assert old.survival.count == 1 and old.stands.count == 0



def test_grows_folded_into_a_regroup_end_no_stand() -> None:
    """Nodes arriving while a job regroups onto its start or last grow (within its scale-up time)
    join that regroup: the allocation they replace never ran, so it is no stand. A cold start
    grows a job once per connecting pilot, ms apart: counted, those stands taught a horizon of
    0.5 s, after which no grow paid. A grow after the regroup, a shrink or a reclaim ends the
    stand as before, and a grow right after a loss counts too."""
    h = HorizonLearner()
    h.changed("J", 0.0, grew=True, regroup_s=18.0)                  # started
    for k in range(1, 200):
        h.changed("J", k * 0.005, grew=True, regroup_s=18.0)        # a pilot connected: one more node
    cold = h.decide([1.0], ["J"], 1.0)
    assert cold.stands == 0 and cold.standing == 1 and cold.tfwd == FALLBACK_S and not cold.learned
    later = h.decide([1.0], ["J"], 120.0)                           # nothing changed for 2 min
    assert later.bound and later.tfwd >= 120.0 * 10 ** (-1 / 16)
    h.changed("J", 150.0, grew=True, regroup_s=18.0)                # long after the regroup: a stand of 150 s
    h.changed("J", 160.0)                                           # a reclaim: 10 s
    h.changed("J", 160.0, grew=True, regroup_s=18.0)                # its refill, after a loss: 0 s
    assert h.stands.count == 3 and h.stands.lower_median(np.array([])) == pytest.approx(10.0, rel=0.16)
    h.changed("J", 170.0, grew=True, regroup_s=18.0)                # within the refill's regroup: goes on
    assert h.stands.count == 3
    h.left("J")
    h.changed("J", 500.0, grew=True, regroup_s=18.0)                # back from the queue: a new stand
    h.changed("J", 501.0, grew=True, regroup_s=18.0)
    assert h.stands.count == 3 and h.decide([1.0], ["J"], 510.0).standing == 1
    plain = HorizonLearner()                                        # without a regroup time: every change counts
    stood(plain, "J", [0.005] * 10)
    assert plain.stands.count == 10
