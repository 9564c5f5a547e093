"""The evidence cap: cap_factor x the largest size with evidence, the population's for a job with
none, and further only as far as the fit's band stays narrower than cap_sd."""
from __future__ import annotations

import math

from core.jpa.beliefs import Beliefs
from core.jpa.config import JPAConfig
from core.jpa.costs import Costs
from core.jpa.fits import Fits
from core.jpa.priors import Priors
from core.jpa.profile import Profile


def beliefs(**kw) -> Beliefs:
    config = JPAConfig(**kw)
    priors = Priors(config)
    return Beliefs(config, Fits(config, priors), priors, Costs())


def test_the_cap_follows_the_evidence_and_a_narrow_band():
    p = Profile("J", 1, 64, None, 18.0, 12.0)
    plain = beliefs(cap_sd=0.0)
    assert plain.cap(p) == 64                                # nothing measured anywhere
    plain.priors.top = 8
    assert plain.cap(p) == 16                                # the population's evidence stands for the job
    p.add(3, math.log(3000.0), 1.0)
    assert plain.cap(p) == 6
    assert beliefs(cap_sd=0.3).cap(p) < beliefs(cap_sd=10.0).cap(p) == 64   # a band that narrow everywhere


def test_the_belief_is_measured_where_measured_and_stops_at_the_cap():
    b = beliefs(cap_sd=0.0)
    p = Profile("J", 1, 64, None, 18.0, 12.0)
    p.add(4, math.log(4000.0), 1.0)
    belief = b.belief(p)
    assert belief.max_nodes == 8 and belief.curve.nodes == tuple(range(1, 9))
    assert math.isclose(belief.curve(4), 4000.0)
    assert (belief.scale_up_seconds, belief.scale_down_seconds) == (18.0, 12.0)
    assert b.belief(p) is belief                             # cached until something changes
