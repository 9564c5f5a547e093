"""Learned rescale costs: bad pauses ignored, measured ones replacing the prior, and what a
job's grows showed carried to its shrinks."""
from __future__ import annotations

import math

import pytest

from core.jpa.costs import PRIOR_PAUSES, Costs
from core.jpa.profile import Profile
from core.model import PauseSample


def test_costs_are_the_measured_pauses_once_there_are_several():
    costs, p = Costs(), Profile("J", 1, 64, None, 18.0, 12.0)
    assert costs.cost(p, "up") == pytest.approx(18.0)
    for bad in (-1.0, math.inf, math.nan):
        costs.observe(p, PauseSample(0.0, "J", "up", bad))
    costs.observe(p, PauseSample(0.0, "J", "sideways", 1.0))
    assert p.pauses == {"up": [], "down": []} and costs.pause_log == (0.0, 0)
    for _ in range(20):
        costs.observe(p, PauseSample(0.0, "J", "up", 2.0))
    assert costs.cost(p, "up") == pytest.approx(2.0, rel=PRIOR_PAUSES / 20)
    assert costs.cost(p, "down") < 12.0 * 0.2                # a job whose grows are quick shrinks quickly too
    other = Profile("K", 1, 64, None, 18.0, 12.0)
    assert costs.cost(other, "up") < 18.0 * 0.2              # and a job never measured, as the others
