"""One job's record in the advisor: its log-rate sums per size, measured pauses, probe state and
cached fit; plain bookkeeping that the priors, fits, costs, probes and view all read."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ..model import Curve
from ..scaling import Fit, SizeStats

if TYPE_CHECKING:
    from .beliefs import Belief

PAUSE_KINDS = ("up", "down")


@dataclass
class Profile:
    job_id: str
    min_nodes: int
    max_nodes: int
    given: Optional[Curve]
    up_prior: float
    down_prior: float
    group: str = ""                   # jobs of one name and owner: each other's first prior
    sums: dict[int, list[float]] = field(default_factory=dict)   # size -> [weight, sum w x, sum w x^2, count]
    pauses: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PAUSE_KINDS})
    pause_log: float = 0.0            # sum of log(measured pause / its prior)
    probe: Optional[int] = None       # size of the probe asked for or running
    probe_since: Optional[float] = None
    probe_placed: bool = False        # the job has run at the probe's size
    return_to: Optional[int] = None   # the size a probe left, to go back to if it was better
    ramp_to: Optional[int] = None     # climbing past the cap towards this size
    ramp_from: tuple[int, float] = (0, 0.0)
    last_probe: Optional[float] = None
    probes: list[tuple[float, int, str, str]] = field(default_factory=list)   # (time, size, why, kind)
    size: int = 0                     # size the job runs at now
    size_since: Optional[float] = None
    version: int = 0                  # bumped when the samples say something new: refit then
    checked: int = -1                 # the version probes were last reckoned at
    fit_cache: Optional[tuple[tuple, Fit]] = None           # (key, the fit under the priors)
    belief_cache: Optional[tuple[tuple, "Belief"]] = None
    priors_cache: Optional[tuple[tuple, tuple]] = None

    def add(self, n: int, x: float, w: float) -> bool:
        """One log-rate sample of weight w at n; True when it is the first at that size. The
        fit is redone for a new size and each time a size's weight doubles: later samples at a
        size well measured move its mean by little, and a fit per sample costs much."""
        acc = self.sums.get(n)
        if acc is None:
            self.sums[n] = [w, w * x, w * x * x, 1]
            self.version += 1
            return True
        before = acc[0]
        acc[0] += w
        acc[1] += w * x
        acc[2] += w * x * x
        acc[3] += 1
        if math.floor(math.log2(acc[0])) > math.floor(math.log2(before)):
            self.version += 1
        return False

    def stats(self) -> dict[int, SizeStats]:
        out = {}
        for n, (w, s1, s2, _) in self.sums.items():
            m = s1 / w
            out[n] = SizeStats(w, m, max(0.0, s2 / w - m * m))
        return out

    def noise(self, floor: float) -> float:
        """The sd of one reference-length sample's log rate, as this job's repeated samples at
        one size show it (never below `floor`, the assumed noise): real workers on a busy
        machine measure far less steadily than the few percent assumed."""
        dev = count = 0.0
        for w, s1, s2, k in self.sums.values():
            if k >= 2:                           # sum w_i (x_i - m)^2 ~ (k - 1) noise^2
                dev += max(0.0, s2 - s1 * s1 / w)
                count += k - 1
        if count < 3:
            return floor
        return max(floor, math.sqrt(dev / count))

    def rate(self, n: int) -> float:
        """The measured mean rate at size n (which must have samples)."""
        return math.exp(self.stats()[n].mean_log)
