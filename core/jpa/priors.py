"""Empirical-Bayes priors for jobs not yet measured well: what the jobs of a job's group (same
name and owner), then all jobs measured at 2+ sizes, showed of the 1-node rate and the curve's
shape, with the flat prior kept as one more "job" so that no shape is ruled out. With one sample
the priors are what tell a job that scales well from one that does not."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..scaling import Fit
from .config import JPAConfig
from .profile import Profile

LogRatePrior = tuple[float, float]                     # mean and sd of the log 1-node rate
PriorsOf = tuple[LogRatePrior, Optional[np.ndarray], tuple]


class Pool:
    """What a set of jobs measured at 2+ sizes showed: their log 1-node rates and their shape
    evidence (posterior over the USL grid under the flat prior), summed."""

    def __init__(self) -> None:
        self.lam: dict[str, float] = {}
        self.shape_sum: Optional[np.ndarray] = None
        self.shape_of: dict[str, np.ndarray] = {}
        self.version = 0                    # bumped when a job joins: cached fits are dropped

    def __len__(self) -> int:
        return len(self.lam)

    def learn(self, job_id: str, log_lam: float, ev: Optional[np.ndarray]) -> None:
        joined = job_id not in self.lam
        self.lam[job_id] = log_lam
        if ev is not None:
            if self.shape_sum is None or len(ev) != len(self.shape_sum):
                self.shape_sum, self.shape_of = np.zeros_like(ev), {}
            old = self.shape_of.get(job_id)
            if old is not None:
                self.shape_sum -= old
            self.shape_sum += ev
            self.shape_of[job_id] = ev
        if joined:
            self.version += 1

    def lam_prior(self, floor: float) -> Optional[LogRatePrior]:
        """Mean and sd of log 1-node rate (the spread a little widened for the jobs' number)."""
        xs = list(self.lam.values())
        if not xs:
            return None
        if len(xs) == 1:
            return xs[0], max(floor, 0.3)
        return float(np.mean(xs)), max(floor, float(np.std(xs)) * math.sqrt(1.0 + 1.0 / len(xs)))

    def shapes(self) -> Optional[np.ndarray]:
        """Mean shape evidence of the jobs (a probability over the grid), None without any."""
        if self.shape_sum is None or not self.shape_of:
            return None
        return self.shape_sum / len(self.shape_of)


class Priors:
    """The population's pool, one pool per group, and the largest size any job was measured at
    (the cap of a job with no evidence of its own)."""

    def __init__(self, config: JPAConfig) -> None:
        self.config = config
        self.pop = Pool()                      # every job measured at 2+ sizes
        self.groups: dict[str, Pool] = {}      # ... and those of each group (same name and owner)
        self.top = 0                           # largest size any job has been measured at

    def learn(self, p: Profile, flat: Fit) -> None:
        """Fold a job measured at 2+ sizes (its fit under flat priors) into the priors of jobs
        not yet measured: the whole population's, and its group's. A prior changes (and cached
        fits are dropped) only when a job joins, so that a stream of samples does not refit
        every job every time."""
        self.pop.learn(p.job_id, flat.log_lam, flat.evidence)
        if p.group:
            self.groups.setdefault(p.group, Pool()).learn(p.job_id, flat.log_lam, flat.evidence)

    def of(self, p: Profile) -> PriorsOf:
        """The job's prior on log 1-node rate, its log prior over shapes, and a key that changes
        when they do. Shapes: the flat prior counted as `concentration` jobs beside the
        measured jobs' shapes (so no shape is ruled out, and the flat share fades as jobs are
        measured), and that mixture in turn counted as `concentration` jobs beside the shapes
        of the job's group. The 1-node rate: the group's, else the population's, else the
        configured default."""
        c = self.config
        group = self.groups.get(p.group) if p.group else None
        if group is not None and (len(group) == 0 or (len(group) == 1 and p.job_id in group.lam)):
            group = None                     # its only member is the job itself
        key = (self.pop.version, group.version if group is not None else -1)
        if p.priors_cache is not None and p.priors_cache[0] == key:
            return p.priors_cache[1]
        lam = (group.lam_prior(0.05) if group is not None else None) or \
              (self.pop.lam_prior(0.25) if len(self.pop) >= 2 else None) or \
              (math.log(c.prior_rate), c.prior_tau)
        shape = None
        a = c.concentration
        pop = self.pop.shapes()
        if pop is not None:
            k = len(self.pop.shape_of)
            shape = (a / len(pop) + k * pop) / (a + k)
        grp = group.shapes() if group is not None else None
        if grp is not None:
            k = len(group.shape_of)
            base = shape if shape is not None else np.full(len(grp), 1.0 / len(grp))
            shape = (a * base + k * grp) / (a + k)
        out = (lam, None if shape is None else np.log(np.maximum(shape, 1e-300)), key)
        p.priors_cache = (key, out)
        return out
