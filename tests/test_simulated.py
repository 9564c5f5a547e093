"""The simulated dispatcher (core/dispatchers/simulated.py): progress, rescale and preemption
costs, exact completion times; and the simulated profiler's noisy measurements."""
from __future__ import annotations

import math
import statistics

import pytest

from core.dispatchers.simulated import Measurement, SimulatedDispatcher
from core.model import RateSample
from tests.support.sim import T0, job


def test_simulated_progress_rescale_and_preemption_costs():
    d = SimulatedDispatcher()
    j = job("J", total=1e9)
    d.resize(j, ["a", "b"], T0)                      # start: no cost
    assert d.progress(j, T0 + 100) == pytest.approx(190 * 100)
    d.resize(j, ["a", "b", "c", "d"], T0 + 100)      # grow: loses 18 s at the old rate
    assert d.progress(j, T0 + 100) == pytest.approx(190 * 100 - 18 * 190)
    d.vacate(j, ["d"], T0 + 200)                     # preempted: loses 12 s at the rate before
    expect = 190 * 100 - 18 * 190 + 350 * 100 - 12 * 350
    assert d.progress(j, T0 + 200) == pytest.approx(expect)
    assert d.rate(j) == pytest.approx(270)           # 3 nodes, interpolated between 2 and 4
    assert d.rescales == 1 and d.preemptions == 1


def test_simulated_completion_time_is_exact():
    d = SimulatedDispatcher()
    j = job("J", total=35_000)
    d.resize(j, ["a", "b", "c", "d"], T0)
    assert d.next_event_time(T0) == pytest.approx(T0 + 100)
    assert d.poll(T0 + 99.9) == []
    assert [e.job for e in d.poll(T0 + 100)] == ["J"]


def test_below_min_runs_at_zero():
    d = SimulatedDispatcher()
    j = job("J", lo=2)
    d.resize(j, ["a"], T0)
    assert d.rate(j) == 0 and d.next_event_time(T0) is None


def test_the_simulated_profiler_measures_with_the_stated_noise_reproducibly():
    m = Measurement(noise=0.03, every_s=30.0, seed=4)
    xs = [math.log(m.factor("J1", t * 30.0, "rate")) for t in range(4000)]
    assert 0.027 < statistics.pstdev(xs) < 0.033 and abs(statistics.mean(xs)) < 0.003
    assert m.factor("J1", 60.0, "rate") == Measurement(0.03, 30.0, 4).factor("J1", 60.0, "rate")
    short = [math.log(m.factor("J1", t * 10.0, "rate", 10.0)) for t in range(4000)]
    assert statistics.pstdev(short) == pytest.approx(0.03 * math.sqrt(3), rel=0.1)
    assert isinstance(RateSample(0.0, "J", 1, 1.0), RateSample)


def test_a_rescale_during_a_pause_extends_it_rather_than_adding_one():
    """A reclaim mid-regroup, or a refill decided with the reclaim, ends in the same regroup:
    the job pauses until the later one would end, not for the sum of both."""
    d = SimulatedDispatcher()
    j = job("J", total=1e9)
    d.resize(j, ["a", "b", "c", "d"], T0)
    d.vacate(j, ["d"], T0 + 100)                     # 12 s pause at 350/s
    d.resize(j, ["a", "b", "c", "e"], T0 + 100)      # refill now: 18 s, 12 of them already paused
    lost = 12 * 350 + 6 * 270
    assert d.lost_samples == pytest.approx(lost)
    d.vacate(j, ["a"], T0 + 110)                     # 8 s left of the pause: extends it by 4 s
    lost += 4 * 350
    assert d.lost_samples == pytest.approx(lost)
    d.vacate(j, ["b"], T0 + 200)                     # no pause under way: the full 12 s
    assert d.lost_samples == pytest.approx(lost + 12 * 270)
    assert d.progress(j, T0 + 200) == pytest.approx(350 * 100 - 12 * 350 - 6 * 270 + 350 * 10 - 4 * 350
                                                    + 270 * 90 - 12 * 270)
