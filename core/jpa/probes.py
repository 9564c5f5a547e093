"""Sizes the advisor forces a job to, into free nodes only, never taking another job's. The
allocator looks T_fwd seconds ahead; the advisor looks at the job's remaining work and asks for
- a probe, when learning an untried size is worth more than a short run there costs (value of
  information: E[max(X, now)] - max(E[X], now), over the rest of the job or the time sizes last);
- the way back, once a probe is measured and the size it left was better;
- a climb, when the job is capped below where the allocator would grow it at once if it saw the
  fit: there one cap at a time, each step measured.
Each is logged with its reckoning."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import numpy as np

from ..scaling import Fit
from .beliefs import Beliefs
from .config import JPAConfig
from .costs import Costs
from .fits import Fits
from .profile import Profile
from .view import BAND_Z

_SQRT2 = math.sqrt(2.0)
_erf = np.vectorize(math.erf, otypes=[float])
MIN_TENURES = 10                      # size changes seen before their mean length bounds what a probe is worth


@dataclass(frozen=True)
class Probe:
    """A size the advisor wants a job to run at, and why (the event log shows `why`): a probe
    to learn a size, a step of a climb past the cap, or the way back from a probe."""

    size: int
    why: str
    kind: str = "probe"               # probe | climb | back

    @property
    def learn(self) -> bool:
        return self.kind == "probe"

    @property
    def back(self) -> bool:
        return self.kind == "back"


def nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF."""
    return 0.5 * (1.0 + _erf(x / _SQRT2))


def value_of_information(mu: np.ndarray, s: np.ndarray, rc: float) -> tuple[np.ndarray, np.ndarray]:
    """For rates X taken as lognormal (log mean `mu`, log sd `s`) against the rate `rc` now:
    E[X], and what knowing X adds to deciding on its mean, E[max(X, rc)] - max(E[X], rc)."""
    mean = np.exp(mu + 0.5 * s * s)
    d2 = (mu - math.log(rc)) / s
    ei = mean * _phi(d2 + s) - rc * _phi(d2)          # E[max(0, X - rc)], X lognormal
    return mean, ei - np.maximum(0.0, mean - rc)


class Prober:
    """The probe state of every job: what it runs at, what is asked of it, and why."""

    def __init__(self, config: JPAConfig, fits: Fits, beliefs: Beliefs, costs: Costs) -> None:
        self.config = config
        self.fits = fits
        self.beliefs = beliefs
        self.costs = costs
        self.tenure = [0.0, 0]             # seconds jobs stayed at one size, and how many times

    def ran(self, p: Profile, size: int, now: float) -> Optional[str]:
        """The job runs at a new `size` from `now`. Returns a line for the event log when that
        size has no sample yet (a measurement the allocator chose, or the probe asked for)."""
        if p.size > 0 and p.size_since is not None and size > 0:
            self.tenure[0] += now - p.size_since
            self.tenure[1] += 1
        p.size, p.size_since = size, now
        if p.probe is not None:
            if size == p.probe:
                p.probe_placed = True
                return next((w for _, n, w, _ in reversed(p.probes) if n == size), None)
            if p.probe_placed or size <= 0:
                p.probe, p.probe_since = None, None      # interrupted (a preemption, the end)
        if size <= 0 or size in p.sums:
            return None
        f = self.fits.of(p)
        i = min(size, len(f.mean) - 1)
        lo, hi = f.band(i, BAND_Z)
        why = f"untried size {nodes(size)}: fit expects {f.mean[i]:,.0f} samples/s (band {lo:,.0f}-{hi:,.0f})"
        p.probes.append((now, size, why, "try"))
        del p.probes[:-100]
        return why

    def wanted(self, active: Iterable[Profile], now: float, remaining: Mapping[str, float],
               measured: Iterable[str], room: Optional[int], tfwd: float) -> dict[str, Probe]:
        """Probes to force now among the `active` jobs: see JPA.wanted_probes."""
        out: dict[str, Probe] = {}
        fresh = set(measured)
        for p in active:
            jid = p.job_id
            if p.probe is not None:
                if p.probe_since is not None and now - p.probe_since > self.config.probe_timeout_s:
                    p.probe, p.probe_since = None, None      # gave up: the allocator decides again
                elif not p.probe_placed:
                    last = next((x for x in reversed(p.probes) if x[1] == p.probe), None)
                    out[jid] = Probe(p.probe, last[2] if last else "probe", kind=last[3] if last else "probe")
                continue
            if jid not in fresh or p.size <= 0 or p.size not in p.sums or p.checked == p.version:
                continue                                       # measure where it runs first
            rested = p.last_probe is None or now - p.last_probe >= self.config.probe_gap_s
            probe = self.choose(p, remaining.get(jid, 0.0), room, rested, tfwd)
            p.checked = p.version if rested else p.checked
            if probe is not None:
                if not probe.back:
                    p.return_to = p.size if probe.learn else None
                p.probe, p.probe_since, p.last_probe, p.probe_placed = probe.size, now, now, False
                p.probes.append((now, probe.size, probe.why, probe.kind))
                out[jid] = probe
        return out

    def choose(self, p: Profile, remaining: float, room: Optional[int] = None,
               rested: bool = True, tfwd: float = 10.0) -> Optional[Probe]:
        """The way back after a probe, else a climb past the cap, else a probe to learn a size
        (`learning`). `room`: free nodes, the most a probe may grow by (a probe never takes nodes
        from another job). `rested`: the last probe was long enough ago for another one to learn
        from (ramps need not wait)."""
        cap = self.beliefs.cap(p)
        f = self.fits.of(p)
        rc = p.rate(p.size)
        back = self._back(p, rc, room)
        if back is not None:
            return back
        ramp = self._ramp(p, f, rc, cap, room, tfwd)
        if ramp is not None:
            return ramp
        return self.learning(p, f, rc, cap, remaining, room, rested)

    def learning(self, p: Profile, f: Fit, rc: float, cap: int, remaining: float, room: Optional[int],
                 rested: bool) -> Optional[Probe]:
        """The untried size where learning the rate is worth most more than a short run there
        costs; None when none pays (or, below `min_sizes`, the nearest). Value of information
        per second, over the rest of the job or, if shorter, the time jobs have stayed at one
        size on average (sizes change anyway); a size the fit already says is better is the
        allocator's business, not a probe's."""
        c = self.config
        sizes = np.array([n for n in range(p.min_nodes, cap + 1) if n not in p.sums], dtype=int)
        if len(sizes) == 0:
            return None
        mean, voi = value_of_information(np.log(f.center[sizes]), np.maximum(f.sd_log[sizes], 1e-9), rc)
        t_rest = remaining / rc
        if self.tenure[1] >= MIN_TENURES:          # a better size is kept only until the next change
            t_rest = min(t_rest, self.tenure[0] / self.tenure[1])
        up, down = self.costs.cost(p, "up"), self.costs.cost(p, "down")
        go = np.where(sizes > p.size, up, down)
        back = np.where(sizes > p.size, down, up)
        cost = go * rc + c.probe_s * np.maximum(0.0, rc - mean) + back * mean
        value = voi * max(0.0, t_rest - c.probe_s)
        net = value - c.probe_margin * cost
        if room is not None:
            net[sizes > p.size + room] = -np.inf
        if not rested:
            net[:] = -np.inf
        i = int(np.argmax(net))
        if net[i] > 0:
            n = int(sizes[i])
            return Probe(n, f"probe at {nodes(n)}: what learning it may add over the rest of the job, "
                            f"{value[i]:,.0f} samples, exceeds its cost, {cost[i]:,.0f} (now {rc:,.0f} "
                            f"samples/s at {p.size}; fit at {n}: {f.mean[n]:,.0f}, "
                            f"band {f.band(n, BAND_Z)[0]:,.0f}-{f.band(n, BAND_Z)[1]:,.0f})")
        if len(p.sums) < c.min_sizes and rested:
            n = int(sizes[np.argmin(np.abs(np.log(sizes) - math.log(p.size / 2 if p.size > p.min_nodes
                                                                    else p.size * 2)))])
            return Probe(n, f"probe at {nodes(n)}: profiling ({len(p.sums)} of {c.min_sizes} sizes measured)")
        return None

    @staticmethod
    def _back(p: Profile, rc: float, room: Optional[int]) -> Optional[Probe]:
        """Once a probe is measured, the job goes back to the size it left when that was
        better: the allocator, looking T_fwd ahead, would seldom pay for the way back, and a
        probe is a short detour, not a move."""
        home, p.return_to = p.return_to, None
        if home is None or home == p.size or home not in p.sums:
            return None
        was = p.rate(home)
        if was <= rc or (room is not None and home - p.size > room):
            return None
        return Probe(home, f"back to {nodes(home)} after the probe at {p.size}: {was:,.0f} samples/s there "
                           f"against {rc:,.0f} here", kind="back")

    def _ramp(self, p: Profile, f: Fit, rc: float, cap: int, room: Optional[int],
              tfwd: float) -> Optional[Probe]:
        """Growing past the cap, one cap at a time, into free nodes. The allocator never sees
        beyond the cap, so where it would grow the job there at once if it saw the fit (by its
        own T_fwd rule, from the size the job had when the climb began), the advisor climbs
        there in capped steps, each measured before the next. Stops when the fit no longer
        promises more at the target than where the job is."""
        if not room or room <= 0 or p.size >= p.max_nodes:
            p.ramp_to = None
            return None
        top = min(p.max_nodes, len(f.mean) - 1)
        if p.ramp_to is None:
            reach = min(top, p.size + room)
            if reach <= cap:
                return None
            ns = np.arange(p.size, reach + 1)
            rates = f.mean[ns].copy()
            rates[0] = rc
            value = tfwd * rates - np.where(ns > p.size, self.costs.cost(p, "up") * rc, 0.0)
            best = int(ns[int(np.argmax(value))])
            if best <= cap:
                return None
            p.ramp_to, p.ramp_from = best, (p.size, rc)
        target = p.ramp_to
        if p.size >= target or f.mean[target] <= rc * 1.02:
            p.ramp_to = None
            return None
        n = min(cap, target, p.size + room)
        if n <= p.size:
            return None
        start, rate0 = p.ramp_from
        return Probe(n, f"climb to {nodes(n)} on the way to {target}: from {nodes(start)} ({rate0:,.0f} samples/s) "
                        f"the allocator would grow it to {target} (fit: {f.mean[target]:,.0f} samples/s), but "
                        f"the evidence caps it at {cap} until measured there", kind="climb")
