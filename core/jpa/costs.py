"""Learned rescale costs: measured pauses replace the given or default ones, and what one job's
pauses showed against its prior carries to its other kind of rescale and, before a job has any,
from the other jobs'."""
from __future__ import annotations

import math

from ..model import PauseSample
from .profile import Profile

PRIOR_PAUSES = 0.25                   # what a cost prior weighs against measured pauses


class Costs:
    """The pauses of every job, pooled for jobs that have none yet."""

    def __init__(self) -> None:
        self.pause_log = (0.0, 0)       # sum of log(pause / prior) over every job's pauses, count

    def observe(self, p: Profile, sample: PauseSample) -> None:
        """Record one measured pause (ignored unless a known kind and a finite, non-negative time)."""
        if sample.kind in p.pauses and sample.seconds >= 0 and math.isfinite(sample.seconds):
            p.pauses[sample.kind].append(float(sample.seconds))
            prior = p.up_prior if sample.kind == "up" else p.down_prior
            if prior > 0:
                x = math.log(max(sample.seconds, 1e-3) / prior)
                p.pause_log += x
                self.pause_log = (self.pause_log[0] + x, self.pause_log[1] + 1)

    def cost(self, p: Profile, kind: str) -> float:
        """Seconds a rescale of this kind pauses the job: the measured pauses, with the prior
        counted as a quarter of one; the prior itself scaled by what every measured pause of
        the job (or, before any, of all jobs) showed against its prior, so that a job whose
        shrinks take 0.1 s is not assumed to grow in 18 s."""
        prior = p.up_prior if kind == "up" else p.down_prior
        logs, count = p.pause_log, len(p.pauses["up"]) + len(p.pauses["down"])
        if count == 0:
            logs, count = self.pause_log
        prior *= math.exp(logs / (count + PRIOR_PAUSES))
        xs = p.pauses[kind]
        return (PRIOR_PAUSES * prior + sum(xs)) / (PRIOR_PAUSES + len(xs))
