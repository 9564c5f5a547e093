"""The JPA facade the controller feeds and asks: it keeps one profile per job and hands each
question to the part that answers it (priors, fits, costs, beliefs, probes, view)."""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

from ..model import Job, PauseSample, RateSample
from .beliefs import Belief, Beliefs
from .config import JPAConfig
from .costs import Costs
from .fits import Fits
from .priors import Priors
from .probes import Probe, Prober
from .profile import Profile
from .view import cached_confidence, probing, profile_view


class JPA:
    """One advisor per controller; pure bookkeeping and arithmetic: no clock, no I/O (time is
    passed in), so that a replay gives the same result every time."""

    def __init__(self, config: Optional[JPAConfig] = None) -> None:
        self.config = config or JPAConfig()
        self._profiles: dict[str, Profile] = {}
        self._active: set[str] = set()     # jobs running at a size > 0
        self._priors = Priors(self.config)
        self._fits = Fits(self.config, self._priors)
        self._costs = Costs()
        self._beliefs = Beliefs(self.config, self._fits, self._priors, self._costs)
        self._prober = Prober(self.config, self._fits, self._beliefs, self._costs)

    # ---- registration and samples ---------------------------------------------------------
    def register(self, job: Job) -> None:
        """Start a profile. The job's `given_curve` (a user's curve) is a prior to refine; its
        scale_up/down_seconds are the cost priors unless `trust_given_costs` is off (replay with
        hidden job sets), when the configured defaults are."""
        if job.id in self._profiles:
            return
        c = self.config
        up, down = ((job.scale_up_seconds, job.scale_down_seconds) if c.trust_given_costs
                    else (c.up_seconds, c.down_seconds))
        group = f"{job.owner}/{job.name}" if (c.groups and job.name) else ""
        self._profiles[job.id] = Profile(job.id, job.min_nodes, job.max_nodes, job.given_curve, up, down,
                                         group)

    def forget(self, job_id: str) -> None:
        self._profiles.pop(job_id, None)
        self._active.discard(job_id)

    def known(self, job_id: str) -> bool:
        return job_id in self._profiles

    def observe(self, sample: RateSample | PauseSample) -> bool:
        """Record a sample; True when it is news the allocator should act on now (a first
        sample at a size, which moves the cap and ends a probe there)."""
        p = self._profiles.get(sample.job)
        if p is None:
            return False
        if isinstance(sample, PauseSample):
            self._costs.observe(p, sample)
            return False
        if not (sample.rate > 0 and math.isfinite(sample.rate)) or sample.nodes < 1 or sample.seconds <= 0:
            return False
        w = min(4.0, sample.seconds / self.config.sample_s)
        version = p.version
        first = p.add(sample.nodes, math.log(sample.rate), w)
        self._priors.top = max(self._priors.top, sample.nodes)
        if p.probe == sample.nodes:
            p.probe, p.probe_since = None, None
        if len(p.sums) >= 2 and p.version != version:
            self._priors.learn(p, self._fits.of(p, population=False))
        return first

    # ---- what the allocator gets ----------------------------------------------------------
    def cap(self, job_id: str) -> int:
        """The largest size the allocator may give the job (see beliefs.py)."""
        return self._beliefs.cap(self._profiles[job_id])

    def belief(self, job_id: str) -> Belief:
        """The job's curve up to its cap, and its rescale costs, as the allocator sees them."""
        return self._beliefs.belief(self._profiles[job_id])

    # ---- probes ---------------------------------------------------------------------------
    def ran(self, job_id: str, size: int, now: float) -> Optional[str]:
        """The job runs at `size` from `now`. Returns a line for the event log when that size
        has no sample yet (a measurement the allocator chose, or the probe asked for)."""
        p = self._profiles.get(job_id)
        if p is None or size == p.size:
            return None
        (self._active.add if size > 0 else self._active.discard)(job_id)
        return self._prober.ran(p, size, now)

    def wanted_probes(self, now: float, remaining: Mapping[str, float],
                      measured: Iterable[str] = (), room: Optional[int] = None,
                      tfwd: float = 10.0) -> dict[str, Probe]:
        """Probes to force now: those asked for and not yet placed, and new ones for the jobs
        just `measured` (the reckoning changes only with a sample), given their remaining work
        and the free nodes (`room`) a probe may grow into; `tfwd` is the allocator's look-ahead."""
        active = [self._profiles[jid] for jid in self._active]
        return self._prober.wanted(active, now, remaining, measured, room, tfwd)

    # ---- reading (dashboard, API) ---------------------------------------------------------
    def view(self, job_id: str) -> Optional[dict]:
        """Measured points, the fit with its band, cap, probes and learned costs of one job."""
        p = self._profiles.get(job_id)
        if p is None:
            return None
        f = self._fits.of(p)
        cap = self._beliefs.cap(p)
        return profile_view(p, f, cap, self._costs.cost(p, "up"), self._costs.cost(p, "down"), self.config.noise)

    def confidence(self, job_id: str) -> Optional[str]:
        """The jobs table's word for a job, cheaply: from the fit last made (none is made here),
        by the same rule as `view`."""
        p = self._profiles.get(job_id)
        return cached_confidence(p) if p is not None else None

    def probing(self) -> set[str]:
        """Jobs running now at a size they have no sample at, a probe's or the allocator's
        choice (the grid marks their nodes until the first sample there)."""
        return probing(self._profiles, self._active)
