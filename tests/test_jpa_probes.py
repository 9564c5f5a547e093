"""The value of information behind a probe, checked against sampling: what knowing a size's
rate adds to deciding on its expected rate alone."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.jpa.probes import Probe, nodes, value_of_information


def test_value_of_information_matches_sampling_a_lognormal():
    rng = np.random.default_rng(0)
    mu, s, rc = np.array([math.log(900.0), math.log(1100.0), math.log(400.0)]), np.array([0.2, 0.3, 0.5]), 1000.0
    mean, voi = value_of_information(mu, s, rc)
    for k in range(3):
        x = np.exp(mu[k] + s[k] * rng.standard_normal(400_000))
        assert mean[k] == pytest.approx(x.mean(), rel=0.01)
        assert voi[k] == pytest.approx(np.maximum(x, rc).mean() - max(x.mean(), rc), rel=0.03, abs=0.5)
    assert (voi > 0).all()


def test_a_size_known_exactly_is_worth_nothing_to_learn():
    mean, voi = value_of_information(np.log(np.array([500.0, 2000.0])), np.array([1e-9, 1e-9]), 1000.0)
    assert mean == pytest.approx([500.0, 2000.0])
    assert voi == pytest.approx([0.0, 0.0], abs=1e-6)


def test_wider_bands_are_worth_more_to_learn():
    mu = np.full(3, math.log(1000.0))
    _, voi = value_of_information(mu, np.array([0.05, 0.2, 0.5]), 1000.0)
    assert voi[0] < voi[1] < voi[2]


def test_probe_kinds_and_the_node_count_words():
    assert Probe(4, "why").learn and not Probe(4, "why").back
    assert Probe(4, "why", kind="back").back and not Probe(4, "why", kind="climb").learn
    assert (nodes(1), nodes(3)) == ("1 node", "3 nodes")
