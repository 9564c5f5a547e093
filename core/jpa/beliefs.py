"""What the allocator is told about a job: the measured mean where a size has samples, the fit's
expected rate elsewhere, and nothing beyond the evidence cap, `cap_factor` x the largest size
with evidence (AdaptDL's rule), extended only as far as the fit's band stays narrower than
`cap_sd` (the job's own samples agree with a well-known group, say)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model import Curve
from .config import JPAConfig
from .costs import Costs
from .fits import Fits
from .priors import Priors
from .profile import Profile


@dataclass(frozen=True)
class Belief:
    """What the allocator is told about one job."""

    curve: Curve
    max_nodes: int                # the job's max, capped by the evidence
    scale_up_seconds: float
    scale_down_seconds: float


class Beliefs:
    """The cap and belief of each job, from its fit, the population's top size and its costs."""

    def __init__(self, config: JPAConfig, fits: Fits, priors: Priors, costs: Costs) -> None:
        self.config = config
        self.fits = fits
        self.priors = priors
        self.costs = costs

    def cap(self, p: Profile) -> int:
        """The largest size the allocator may give the job: cap_factor x its largest size with
        evidence; for a job with none, the population's (the prior stands for the job)."""
        top = max(p.sums, default=0)
        if p.given is not None and self.fits.given(p) is not None:
            top = max(top, p.given.nodes[-1])
        top = top or self.priors.top
        if top == 0:
            return p.max_nodes
        cap = max(p.min_nodes, min(p.max_nodes, int(self.config.cap_factor * top)))
        if self.config.cap_sd > 0 and cap < p.max_nodes and p.sums:
            f = self.fits.of(p)
            sd = f.sd_log[cap + 1:min(p.max_nodes, len(f.mean) - 1) + 1]
            wide = np.nonzero(sd > self.config.cap_sd)[0]
            cap += int(wide[0]) if len(wide) else len(sd)
        return cap

    def belief(self, p: Profile) -> Belief:
        """The job's curve up to its cap and its learned costs, cached until either changes."""
        f = self.fits.of(p)
        key = (p.fit_cache[0] if p.fit_cache else None, len(p.pauses["up"]), len(p.pauses["down"]),
               self.priors.top)
        cached = p.belief_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        cap = self.cap(p)
        rates = f.mean[1:cap + 1].copy()
        for n, s in p.stats().items():
            if n <= cap:
                rates[n - 1] = math.exp(s.mean_log)
        curve = Curve(tuple(range(1, cap + 1)), tuple(float(r) for r in rates))
        b = Belief(curve, cap, self.costs.cost(p, "up"), self.costs.cost(p, "down"))
        p.belief_cache = (key, b)
        return b
