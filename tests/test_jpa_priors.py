"""The empirical-Bayes priors: pooled 1-node rates and shapes, a job's group before the
population, and a group of one that is the job itself."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.jpa.config import JPAConfig
from core.jpa.priors import Pool, Priors
from core.jpa.profile import Profile
from core.scaling import Fit


def flat(log_lam: float, evidence: list[float]) -> Fit:
    return Fit(np.zeros(2), np.zeros(2), math.exp(log_lam), 0.0, 0.0, "usl", log_lam, np.array(evidence))


def test_a_pool_spreads_its_rates_and_counts_a_job_once():
    pool = Pool()
    assert pool.lam_prior(0.1) is None and pool.shapes() is None
    pool.learn("A", 1.0, np.array([1.0, 0.0]))
    assert pool.lam_prior(0.1) == (1.0, 0.3)                     # one job: a fixed spread
    pool.learn("B", 3.0, np.array([0.0, 1.0]))
    version = pool.version
    pool.learn("B", 3.0, np.array([0.0, 1.0]))                    # B again: replaced, not added
    assert pool.version == version and len(pool) == 2
    mean, sd = pool.lam_prior(0.1)
    assert mean == 2.0 and sd == pytest.approx(1.0 * math.sqrt(1.5))
    assert pool.shapes() == pytest.approx([0.5, 0.5])


def test_the_group_speaks_first_and_a_lone_member_is_not_its_own_prior():
    priors = Priors(JPAConfig(prior_rate=100.0, prior_tau=2.0))
    new = Profile("new", 1, 64, None, 18.0, 12.0, group="u/resnet")
    assert priors.of(new)[0] == (math.log(100.0), 2.0) and priors.of(new)[1] is None
    member = Profile("A", 1, 64, None, 18.0, 12.0, group="u/resnet")
    priors.learn(member, flat(math.log(3000.0), [0.9, 0.1]))
    priors.learn(Profile("B", 1, 64, None, 18.0, 12.0, group="u/bert"), flat(math.log(10.0), [0.1, 0.9]))
    (lam, tau), shape, _ = priors.of(new)
    assert lam == pytest.approx(math.log(3000.0)) and tau == 0.3       # the group's rate, not the population's
    assert np.exp(shape)[0] > np.exp(shape)[1]                          # and its shape first
    (lam, _), _, _ = priors.of(member)                                  # the group is only the job itself
    assert lam == pytest.approx((math.log(3000.0) + math.log(10.0)) / 2)


def test_priors_are_cached_until_a_job_joins():
    priors = Priors(JPAConfig())
    p = Profile("J", 1, 64, None, 18.0, 12.0)
    first = priors.of(p)
    assert priors.of(p) is first
    priors.learn(Profile("A", 1, 64, None, 18.0, 12.0), flat(5.0, [0.5, 0.5]))
    assert priors.of(p) is not first
