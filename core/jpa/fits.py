"""A job's USL fit with its band (core/scaling.py does the arithmetic): under the priors, what
the allocator and the dashboard get, or under flat priors, what the job adds to the priors;
cached per job and, for jobs with nothing measured, per prior."""
from __future__ import annotations

import math
from typing import Optional

from ..scaling import Fit, fit
from .config import JPAConfig
from .priors import Priors
from .profile import Profile

SHARED_FITS = 256                     # prior fits kept before the cache is emptied


def grid_size(max_nodes: int) -> int:
    """Fits are tabulated up to the next power of two (few distinct grids to cache)."""
    n = 1
    while n < max(1, max_nodes):
        n *= 2
    return n


def given_points(p: Profile, sd: float) -> Optional[list[tuple[int, float, float]]]:
    """A user's curve as pseudo-observations (size, log rate, `sd`) at the sizes not measured
    yet; none once a measurement contradicts it (off by more than 3 x `sd` where both speak)."""
    if p.given is None or not p.given.nodes:
        return None
    for n, st in p.stats().items():
        g = p.given(n)
        if g <= 0 or abs(st.mean_log - math.log(g)) > 3.0 * sd:
            return None
    return [(n, math.log(v), sd) for n, v in zip(p.given.nodes, p.given.samples_per_second)
            if v > 0 and n not in p.sums]


class Fits:
    """The fits of every job, through the shared priors."""

    def __init__(self, config: JPAConfig, priors: Priors) -> None:
        self.config = config
        self.priors = priors
        self._shared: dict[tuple, Fit] = {}     # fits of jobs with nothing measured, by prior

    def given(self, p: Profile) -> Optional[list[tuple[int, float, float]]]:
        return given_points(p, self.config.given_sd)

    def of(self, p: Profile, population: bool = True) -> Fit:
        """The job's fit. `population`: with the priors of its group and the population (what
        the allocator gets); without, what its own data say under flat priors (what feeds the
        population)."""
        c = self.config
        if population:
            (mu, tau), shape, pkey = self.priors.of(p)
            key = (p.version, pkey)
            if p.fit_cache is not None and p.fit_cache[0] == key:
                return p.fit_cache[1]
        else:
            (mu, tau), shape, key = (math.log(c.prior_rate), 10.0), None, None
        shared = (pkey, grid_size(p.max_nodes)) if population and not p.sums and p.given is None else None
        f = self._shared.get(shared) if shared else None
        if f is None:
            f = fit(p.stats(), grid_size(p.max_nodes), noise=p.noise(c.noise), model_error=c.model_error,
                    prior_mu=mu, prior_tau=tau, model=c.model, extra=self.given(p), shape_prior=shape)
            if shared:                      # every unmeasured job of a group has the same fit
                if len(self._shared) > SHARED_FITS:
                    self._shared.clear()
                self._shared[shared] = f
        if population:
            p.fit_cache = (key, f)
        return f
