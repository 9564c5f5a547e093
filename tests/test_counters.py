"""core/counters.py: the solve-time histogram /metrics reads is kept up to date per solve and
agrees with counting every solve again (bucket edges included, as Prometheus' `le`)."""
from __future__ import annotations

import random

from core.counters import SOLVE_BUCKETS_S, SolveTimes


def test_the_running_histogram_matches_a_recount():
    rng = random.Random(3)
    times = SolveTimes()
    values_ms = [rng.lognormvariate(0, 2) for _ in range(2000)] + [b * 1000 for b in SOLVE_BUCKETS_S] + [9000.0]
    for ms in values_ms:
        times.add(ms)
    h = times.histogram()
    assert h.count == len(values_ms) and times.ms == values_ms
    assert abs(h.sum_s - sum(values_ms) / 1000) < 1e-9
    assert h.le == tuple(sum(1 for v in values_ms if v / 1000 <= b) for b in SOLVE_BUCKETS_S)
    assert h.le[-1] < h.count, "a solve slower than the last bucket counts only in +Inf"


def test_an_empty_histogram():
    h = SolveTimes().histogram()
    assert h.count == 0 and h.sum_s == 0 and h.le == (0,) * len(SOLVE_BUCKETS_S)
