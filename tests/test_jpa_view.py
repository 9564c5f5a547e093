"""The dashboard's word for a job's curve, and which jobs run at a size they have not measured."""
from __future__ import annotations

import math

from core.jpa.profile import Profile
from core.jpa.view import cached_confidence, confidence, probing


def test_confidence_words():
    assert confidence(0, 0.0, given=True) == "given" and confidence(0, 0.0, given=False) == "prior"
    assert confidence(2, 0.01, False) == "low" and confidence(5, 0.3, False) == "low"
    assert confidence(5, 0.2, False) == "medium" and confidence(5, 0.05, False) == "high"


def test_without_a_fit_made_the_word_is_low_once_measured():
    p = Profile("J", 1, 64, None, 18.0, 12.0)
    assert cached_confidence(p) == "prior"
    for n in (1, 2, 4):
        p.add(n, math.log(100.0 * n), 1.0)
    assert cached_confidence(p) == "low"                     # no fit yet: spread taken as 1


def test_probing_is_running_at_a_size_without_samples():
    a, b, c = (Profile(j, 1, 64, None, 18.0, 12.0) for j in "ABC")
    a.size, b.size = 4, 2
    b.add(2, 0.0, 1.0)
    assert probing({"A": a, "B": b, "C": c}, ["A", "B", "C"]) == {"A"}
