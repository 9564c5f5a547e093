"""Fits: the grid sizes they are tabulated to, and a user's curve as pseudo-observations that
a contradicting measurement withdraws."""
from __future__ import annotations

import math

from core.jpa.fits import given_points, grid_size
from core.jpa.profile import Profile
from core.model import Curve


def test_grids_go_to_the_next_power_of_two():
    assert [grid_size(n) for n in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 4, 64, 128]


def test_a_given_curve_speaks_where_nothing_is_measured_until_contradicted():
    p = Profile("J", 1, 64, Curve((1, 8, 32), (1000.0, 8000.0, 32000.0)), 18.0, 12.0)
    assert given_points(p, 0.15) == [(1, math.log(1000.0), 0.15), (8, math.log(8000.0), 0.15),
                                     (32, math.log(32000.0), 0.15)]
    p.add(8, math.log(8000.0 * 1.3), 1.0)                  # 26 % off: within 3 sd of log
    assert [n for n, _, _ in given_points(p, 0.15)] == [1, 32]
    p.add(32, math.log(32000.0 / 2.0), 1.0)                # half the claim: the curve is withdrawn
    assert given_points(p, 0.15) is None
    assert given_points(Profile("K", 1, 64, None, 18.0, 12.0), 0.15) is None
