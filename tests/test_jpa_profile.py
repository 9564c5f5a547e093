"""One job's profile: when a sample asks for a refit, and the noise its repeated samples show."""
from __future__ import annotations

import math

import pytest

from core.jpa.profile import Profile


def profile() -> Profile:
    return Profile("J1", 1, 64, None, 18.0, 12.0)


def test_a_new_size_and_each_doubling_of_a_sizes_weight_ask_for_a_refit():
    p = profile()
    assert p.add(4, math.log(1000.0), 1.0) and p.version == 1
    assert not p.add(4, math.log(1000.0), 1.0) and p.version == 2      # weight 1 -> 2
    assert not p.add(4, math.log(1000.0), 1.0) and p.version == 2      # 2 -> 3: same power of two
    assert not p.add(4, math.log(1000.0), 1.0) and p.version == 3      # 3 -> 4
    assert p.add(8, math.log(1800.0), 1.0) and p.version == 4
    assert p.sums[4][3] == 4 and p.rate(4) == pytest.approx(1000.0) and p.rate(8) == pytest.approx(1800.0)


def test_stats_are_the_weighted_mean_and_spread_of_log_rates():
    p = profile()
    p.add(2, 1.0, 1.0)
    p.add(2, 2.0, 3.0)
    st = p.stats()[2]
    assert (st.weight, st.mean_log) == pytest.approx((4.0, 1.75))
    assert st.var_log == pytest.approx((1.0 * 1.0 + 3.0 * 4.0) / 4.0 - 1.75 ** 2)


def test_noise_is_the_floor_until_repeated_samples_show_more():
    p = profile()
    for x in (0.0, 0.2, 0.0, 0.2):
        p.add(4, x, 1.0)
    assert p.noise(0.03) == pytest.approx(math.sqrt(4 * 0.1 ** 2 / 3))      # sum of squared deviations / (k - 1)
    assert p.noise(0.5) == 0.5
    q = profile()
    q.add(4, 0.0, 1.0)
    q.add(4, 1.0, 1.0)                                                        # only one degree of freedom
    assert q.noise(0.03) == 0.03
