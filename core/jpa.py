"""Job Profiling Advisor (JPA): learn each job's scalability and rescale costs online.

MalleTrain's point (arXiv 2404.15668): users need not hand in a throughput curve; running the
job is the measurement. For every job the advisor keeps
- throughput samples per size (from the workers' progress, or the simulated profiler),
- measured rescale pauses (grow / shrink), which replace the given or default costs,
- a USL fit with an uncertainty band (core/scaling.py).

Priors are hierarchical (empirical Bayes): a job never measured starts from what the jobs of
its group (same name and owner) and then all jobs measured before it showed, for its 1-node
rate and for the shape of its curve, with the flat prior kept as one more "job" so that no
shape is ruled out; a curve the user gave enters as pseudo-observations at the sizes not yet
measured, until a measurement contradicts it. With one sample the priors are what tell a job
that scales well from one that does not.

What the allocator gets (`belief`): the measured mean where a size has samples, the fit's
expected rate elsewhere, and nothing beyond the evidence cap: `cap_factor` x the largest size
with evidence (AdaptDL's rule), extended only as far as the fit's band stays narrower than
`cap_sd` (the job's own samples agree with a well-known group, say).

The allocator looks T_fwd seconds ahead; the advisor looks at the job's remaining work and
asks the controller to force a size (into free nodes only, never taking another job's) when
- learning an untried size is worth more than a short run there costs (value of information:
  E[max(X, now)] - max(E[X], now), over the rest of the job or the time sizes last anyway);
- a probe is measured and the size it left was better (the way back);
- the job is capped below where the allocator would grow it at once if it saw the fit: it
  climbs there one cap at a time, each step measured.
Each is logged with its reckoning. Pure bookkeeping and arithmetic: no clock, no I/O; the
controller feeds it and asks it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

import numpy as np

from .model import Curve, Job, PauseSample, RateSample
from .scaling import MODELS, Fit, SizeStats, fit

PAUSE_KINDS = ("up", "down")
PRIOR_PAUSES = 0.25                   # what a cost prior weighs against measured pauses
BAND_Z = 2.0                          # the band shown: +-2 sd of log throughput (~95 %)
_SQRT2 = math.sqrt(2.0)


@dataclass
class JPAConfig:
    model: str = "usl"
    cap_factor: float = 2.0       # never beyond this x the largest size with evidence...
    cap_sd: float = 0.3           # ...unless the fit's band stays this narrow (sd of log) there
    noise: float = 0.03           # sd of the log throughput of one sample of `sample_s` seconds
    sample_s: float = 30.0        # the measuring window `noise` refers to
    model_error: float = 0.03     # how far a real curve may stray from the model
    prior_rate: float = 1000.0    # 1-node samples/s assumed before any job has been measured
    prior_tau: float = 2.0        # sd of that log rate
    given_sd: float = 0.15        # trust in a user-given curve point (sd of log)
    probe_s: float = 60.0         # how long a probe is expected to run before the next decision
    probe_gap_s: float = 60.0     # at least this long between two probes of one job
    probe_timeout_s: float = 600.0
    probe_margin: float = 1.0     # probe when expected gain > margin x expected cost
    min_sizes: int = 0            # profile at least this many sizes whatever it costs (0: by value only)
    up_seconds: float = 18.0      # rescale-cost priors when nothing was given
    down_seconds: float = 12.0
    trust_given_costs: bool = True
    concentration: float = 1.0    # weight, in jobs, of the flat prior among measured jobs' shapes
    groups: bool = True           # jobs of one name and owner inform each other's priors first

    @classmethod
    def live(cls, sizes: int = 3) -> "JPAConfig":
        """On real workers: samples are 5 s of steps (noisier than the replay's 30 s windows),
        rescale costs are measured (a regroup takes ~0.1 s, so probes are cheap), and each new
        job is measured at `sizes` sizes early on, for its curve."""
        if sizes < 0:
            raise ValueError("--profile-sizes must be 0 or more")
        return cls(sample_s=5.0, noise=0.05, min_sizes=sizes, probe_gap_s=10.0, probe_s=10.0)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown scalability model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.cap_factor < 1 or self.noise <= 0 or self.prior_rate <= 0 or self.sample_s <= 0:
            raise ValueError("cap_factor >= 1, noise > 0, sample_s > 0 and prior_rate > 0 are required")
        if self.min_sizes < 0 or self.probe_s <= 0 or self.probe_timeout_s <= 0 or self.probe_margin <= 0:
            raise ValueError("min_sizes >= 0 and positive probe_s, probe_timeout_s, probe_margin are required")


@dataclass(frozen=True)
class Belief:
    """What the allocator is told about one job."""

    curve: Curve
    max_nodes: int                # the job's max, capped by the evidence
    scale_up_seconds: float
    scale_down_seconds: float


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


@dataclass
class _Profile:
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
    _fit: Optional[tuple[tuple, Fit]] = None
    _belief: Optional[tuple[tuple, Belief]] = None
    _priors: Optional[tuple[tuple, tuple]] = None

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


class _Pool:
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

    def lam_prior(self, floor: float) -> Optional[tuple[float, float]]:
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


class JPA:
    def __init__(self, config: Optional[JPAConfig] = None) -> None:
        self.config = config or JPAConfig()
        self._profiles: dict[str, _Profile] = {}
        self._active: set[str] = set()     # jobs running at a size > 0
        self._pop = _Pool()                # every job measured at 2+ sizes
        self._groups: dict[str, _Pool] = {}   # ... and those of each group (same name and owner)
        self._pop_top = 0                  # largest size any job has been measured at
        self._tenure = [0.0, 0]            # seconds jobs stayed at one size, and how many times
        self._pause_log = (0.0, 0)         # sum of log(pause / prior) over every job's pauses, count
        self._prior_fits: dict[tuple, Fit] = {}   # fits of jobs with nothing measured, by prior

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
        self._profiles[job.id] = _Profile(job.id, job.min_nodes, job.max_nodes, job.given_curve, up, down,
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
            if sample.kind in p.pauses and sample.seconds >= 0 and math.isfinite(sample.seconds):
                p.pauses[sample.kind].append(float(sample.seconds))
                prior = p.up_prior if sample.kind == "up" else p.down_prior
                if prior > 0:
                    x = math.log(max(sample.seconds, 1e-3) / prior)
                    p.pause_log += x
                    self._pause_log = (self._pause_log[0] + x, self._pause_log[1] + 1)
            return False
        if not (sample.rate > 0 and math.isfinite(sample.rate)) or sample.nodes < 1 or sample.seconds <= 0:
            return False
        w = min(4.0, sample.seconds / self.config.sample_s)
        version = p.version
        first = p.add(sample.nodes, math.log(sample.rate), w)
        self._pop_top = max(self._pop_top, sample.nodes)
        if p.probe == sample.nodes:
            p.probe, p.probe_since = None, None
        if len(p.sums) >= 2 and p.version != version:
            self._learn_population(p)
        return first

    # ---- the priors (empirical Bayes) ---------------------------------------------------
    def _learn_population(self, p: _Profile) -> None:
        """Fold a job measured at 2+ sizes into the priors of jobs not yet measured: the whole
        population's, and its group's. A prior changes (and cached fits are dropped) only when a
        job joins, so that a stream of samples does not refit every job every time."""
        f = self._fit_of(p, population=False)
        self._pop.learn(p.job_id, f.log_lam, f.evidence)
        if p.group:
            self._groups.setdefault(p.group, _Pool()).learn(p.job_id, f.log_lam, f.evidence)

    def _priors(self, p: _Profile) -> tuple[tuple[float, float], Optional[np.ndarray], tuple]:
        """The job's prior on log 1-node rate, its log prior over shapes, and a key that changes
        when they do. Shapes: the flat prior counted as `concentration` jobs beside the
        measured jobs' shapes (so no shape is ruled out, and the flat share fades as jobs are
        measured), and that mixture in turn counted as `concentration` jobs beside the shapes
        of the job's group. The 1-node rate: the group's, else the population's, else the
        configured default."""
        c = self.config
        group = self._groups.get(p.group) if p.group else None
        if group is not None and (len(group) == 0 or (len(group) == 1 and p.job_id in group.lam)):
            group = None                     # its only member is the job itself
        key = (self._pop.version, group.version if group is not None else -1)
        if p._priors is not None and p._priors[0] == key:
            return p._priors[1]
        lam = (group.lam_prior(0.05) if group is not None else None) or \
              (self._pop.lam_prior(0.25) if len(self._pop) >= 2 else None) or \
              (math.log(c.prior_rate), c.prior_tau)
        shape = None
        a = c.concentration
        pop = self._pop.shapes()
        if pop is not None:
            k = len(self._pop.shape_of)
            shape = (a / len(pop) + k * pop) / (a + k)
        grp = group.shapes() if group is not None else None
        if grp is not None:
            k = len(group.shape_of)
            base = shape if shape is not None else np.full(len(grp), 1.0 / len(grp))
            shape = (a * base + k * grp) / (a + k)
        out = (lam, None if shape is None else np.log(np.maximum(shape, 1e-300)), key)
        p._priors = (key, out)
        return out

    # ---- fits -----------------------------------------------------------------------------
    def _fit_of(self, p: _Profile, population: bool = True) -> Fit:
        """The job's fit. `population`: with the priors of its group and the population (what
        the allocator gets); without, what its own data say under flat priors (what feeds the
        population)."""
        c = self.config
        if population:
            (mu, tau), shape, pkey = self._priors(p)
            key = (p.version, pkey)
            if p._fit is not None and p._fit[0] == key:
                return p._fit[1]
        else:
            (mu, tau), shape, key = (math.log(c.prior_rate), 10.0), None, None
        shared = (pkey, _grid_size(p.max_nodes)) if population and not p.sums and p.given is None else None
        f = self._prior_fits.get(shared) if shared else None
        if f is None:
            f = fit(p.stats(), _grid_size(p.max_nodes), noise=p.noise(c.noise), model_error=c.model_error,
                    prior_mu=mu, prior_tau=tau, model=c.model, extra=self._given_points(p), shape_prior=shape)
            if shared:                      # every unmeasured job of a group has the same fit
                if len(self._prior_fits) > 256:
                    self._prior_fits.clear()
                self._prior_fits[shared] = f
        if population:
            p._fit = (key, f)
        return f

    def _given_points(self, p: _Profile) -> Optional[list[tuple[int, float, float]]]:
        """A user's curve as pseudo-observations at the sizes not measured yet; none once a
        measurement contradicts it (off by more than 3 x `given_sd` where both speak)."""
        if p.given is None or not p.given.nodes:
            return None
        sd = self.config.given_sd
        for n, st in p.stats().items():
            g = p.given(n)
            if g <= 0 or abs(st.mean_log - math.log(g)) > 3.0 * sd:
                return None
        return [(n, math.log(v), sd) for n, v in zip(p.given.nodes, p.given.samples_per_second)
                if v > 0 and n not in p.sums]

    def cap(self, job_id: str) -> int:
        """The largest size the allocator may give the job: cap_factor x its largest size with
        evidence; for a job with none, the population's (the prior stands for the job)."""
        p = self._profiles[job_id]
        top = max(p.sums, default=0)
        if p.given is not None and self._given_points(p) is not None:
            top = max(top, p.given.nodes[-1])
        top = top or self._pop_top
        if top == 0:
            return p.max_nodes
        cap = max(p.min_nodes, min(p.max_nodes, int(self.config.cap_factor * top)))
        if self.config.cap_sd > 0 and cap < p.max_nodes and p.sums:
            f = self._fit_of(p)
            sd = f.sd_log[cap + 1:min(p.max_nodes, len(f.mean) - 1) + 1]
            wide = np.nonzero(sd > self.config.cap_sd)[0]
            cap += int(wide[0]) if len(wide) else len(sd)
        return cap

    def belief(self, job_id: str) -> Belief:
        p = self._profiles[job_id]
        f = self._fit_of(p)
        key = (p._fit[0] if p._fit else None, len(p.pauses["up"]), len(p.pauses["down"]), self._pop_top)
        cached = p._belief
        if cached is not None and cached[0] == key:
            return cached[1]
        cap = self.cap(job_id)
        rates = f.mean[1:cap + 1].copy()
        for n, s in p.stats().items():
            if n <= cap:
                rates[n - 1] = math.exp(s.mean_log)
        curve = Curve(tuple(range(1, cap + 1)), tuple(float(r) for r in rates))
        b = Belief(curve, cap, self._cost(p, "up"), self._cost(p, "down"))
        p._belief = (key, b)
        return b

    def _cost(self, p: _Profile, kind: str) -> float:
        """Seconds a rescale of this kind pauses the job: the measured pauses, with the prior
        counted as a quarter of one; the prior itself scaled by what every measured pause of
        the job (or, before any, of all jobs) showed against its prior, so that a job whose
        shrinks take 0.1 s is not assumed to grow in 18 s."""
        prior = p.up_prior if kind == "up" else p.down_prior
        logs, count = p.pause_log, len(p.pauses["up"]) + len(p.pauses["down"])
        if count == 0:
            logs, count = self._pause_log
        prior *= math.exp(logs / (count + PRIOR_PAUSES))
        xs = p.pauses[kind]
        return (PRIOR_PAUSES * prior + sum(xs)) / (PRIOR_PAUSES + len(xs))

    # ---- probes ---------------------------------------------------------------------------
    def ran(self, job_id: str, size: int, now: float) -> Optional[str]:
        """The job runs at `size` from `now`. Returns a line for the event log when that size
        has no sample yet (a measurement the allocator chose, or the probe asked for)."""
        p = self._profiles.get(job_id)
        if p is None or size == p.size:
            return None
        if p.size > 0 and p.size_since is not None and size > 0:
            self._tenure[0] += now - p.size_since
            self._tenure[1] += 1
        p.size, p.size_since = size, now
        (self._active.add if size > 0 else self._active.discard)(job_id)
        if p.probe is not None:
            if size == p.probe:
                p.probe_placed = True
                return next((w for _, n, w, _ in reversed(p.probes) if n == size), None)
            if p.probe_placed or size <= 0:
                p.probe, p.probe_since = None, None      # interrupted (a preemption, the end)
        if size <= 0 or size in p.sums:
            return None
        f = self._fit_of(p)
        i = min(size, len(f.mean) - 1)
        lo, hi = f.band(i, BAND_Z)
        why = f"untried size {nodes(size)}: fit expects {f.mean[i]:,.0f} samples/s (band {lo:,.0f}-{hi:,.0f})"
        p.probes.append((now, size, why, "try"))
        del p.probes[:-100]
        return why

    def wanted_probes(self, now: float, remaining: Mapping[str, float],
                      measured: Iterable[str] = (), room: Optional[int] = None,
                      tfwd: float = 10.0) -> dict[str, Probe]:
        """Probes to force now: those asked for and not yet placed, and new ones for the jobs
        just `measured` (the reckoning changes only with a sample), given their remaining work
        and the free nodes (`room`) a probe may grow into; `tfwd` is the allocator's look-ahead."""
        out: dict[str, Probe] = {}
        fresh = set(measured)
        for jid in list(self._active):
            p = self._profiles[jid]
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
            probe = self._choose_probe(p, remaining.get(jid, 0.0), room, rested, tfwd)
            p.checked = p.version if rested else p.checked
            if probe is not None:
                if not probe.back:
                    p.return_to = p.size if probe.learn else None
                p.probe, p.probe_since, p.last_probe, p.probe_placed = probe.size, now, now, False
                p.probes.append((now, probe.size, probe.why, probe.kind))
                out[jid] = probe
        return out

    def _choose_probe(self, p: _Profile, remaining: float, room: Optional[int] = None,
                      rested: bool = True, tfwd: float = 10.0) -> Optional[Probe]:
        """The untried size where learning the rate is worth most more than a short run there
        costs; None when none pays (or, below `min_sizes`, the nearest). Value of information:
        E[max(X, now)] - max(E[X], now) per second, over the rest of the job or, if shorter, the
        time jobs have stayed at one size on average (sizes change anyway); a size the fit
        already says is better is the allocator's business, not a probe's. `room`: free nodes,
        the most a probe may grow by (a probe never takes nodes from another job). `rested`:
        the last probe was long enough ago for another one to learn from (ramps need not wait)."""
        c = self.config
        cap = self.cap(p.job_id)
        f = self._fit_of(p)
        rc = math.exp(p.stats()[p.size].mean_log)
        back = self._back(p, f, rc, room)
        if back is not None:
            return back
        ramp = self._ramp(p, f, rc, cap, room, tfwd)
        if ramp is not None:
            return ramp
        sizes = np.array([n for n in range(p.min_nodes, cap + 1) if n not in p.sums], dtype=int)
        if len(sizes) == 0:
            return None
        mu = np.log(f.center[sizes])
        s = np.maximum(f.sd_log[sizes], 1e-9)
        mean = np.exp(mu + 0.5 * s * s)                    # X at a size taken as lognormal
        d2 = (mu - math.log(rc)) / s
        ei = mean * _phi(d2 + s) - rc * _phi(d2)          # E[max(0, X - rc)], X lognormal
        voi = ei - np.maximum(0.0, mean - rc)              # what knowing X adds to deciding on its mean
        t_rest = remaining / rc
        if self._tenure[1] >= 10:          # a better size is kept only until the next change
            t_rest = min(t_rest, self._tenure[0] / self._tenure[1])
        up, down = self._cost(p, "up"), self._cost(p, "down")
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

    def _back(self, p: _Profile, f: Fit, rc: float, room: Optional[int]) -> Optional[Probe]:
        """Once a probe is measured, the job goes back to the size it left when that was
        better: the allocator, looking T_fwd ahead, would seldom pay for the way back, and a
        probe is a short detour, not a move."""
        home, p.return_to = p.return_to, None
        if home is None or home == p.size or home not in p.sums:
            return None
        was = math.exp(p.stats()[home].mean_log)
        if was <= rc or (room is not None and home - p.size > room):
            return None
        return Probe(home, f"back to {nodes(home)} after the probe at {p.size}: {was:,.0f} samples/s there "
                           f"against {rc:,.0f} here", kind="back")

    def _ramp(self, p: _Profile, f: Fit, rc: float, cap: int, room: Optional[int],
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
            value = tfwd * rates - np.where(ns > p.size, self._cost(p, "up") * rc, 0.0)
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

    # ---- reading (dashboard, API) ---------------------------------------------------------
    def view(self, job_id: str) -> Optional[dict]:
        """Measured points, the fit with its band, cap, probes and learned costs of one job."""
        p = self._profiles.get(job_id)
        if p is None:
            return None
        f = self._fit_of(p)
        cap = self.cap(job_id)
        ns = list(range(1, min(max(p.max_nodes, 1), len(f.mean) - 1) + 1))
        counts = {n: int(acc[3]) for n, acc in p.sums.items()}
        spread = _spread(f, p.max_nodes)
        return {
            "measured": [{"nodes": n, "samples_per_second": math.exp(s.mean_log), "weight": s.weight,
                          "count": counts[n],
                          "sd_pct": 100.0 * math.sqrt(s.var_log) if counts[n] >= 2 else None}
                         for n, s in sorted(p.stats().items())],
            "fit": {"nodes": ns, "mean": [float(f.mean[n]) for n in ns],
                    "lo": [f.band(n, BAND_Z)[0] for n in ns], "hi": [f.band(n, BAND_Z)[1] for n in ns],
                    "band_sd": BAND_Z, "model": f.model, "lam": f.lam, "sigma": f.sigma, "kappa": f.kappa,
                    "peak": int(np.argmax(f.mean[1:ns[-1] + 1]) + 1), "noise_pct": 100.0 * p.noise(self.config.noise)},
            "cap": cap, "given": p.given.to_dict() if p.given else None,
            "probe": p.probe,
            "probes": [{"time": t, "nodes": n, "why": w, "kind": k} for t, n, w, k in p.probes[-50:]],
            "scale_up_seconds": self._cost(p, "up"), "scale_down_seconds": self._cost(p, "down"),
            "pauses": {k: len(v) for k, v in p.pauses.items()},
            "confidence": confidence(len(p.sums), spread, p.given is not None),
            "uncertainty_pct": 100.0 * (math.exp(spread) - 1.0),
            "size": p.size, "probing": p.size > 0 and p.size not in p.sums,
        }

    def confidence(self, job_id: str) -> Optional[str]:
        """The jobs table's word for a job, cheaply: from the fit last made (none is made here),
        by the same rule as `view`."""
        p = self._profiles.get(job_id)
        if p is None:
            return None
        spread = _spread(p._fit[1], p.max_nodes) if p._fit is not None else 1.0
        return confidence(len(p.sums), spread, p.given is not None)

    def probing(self) -> set[str]:
        """Jobs running now at a size they have no sample at, a probe's or the allocator's
        choice (the grid marks their nodes until the first sample there)."""
        return {jid for jid in self._active
                if self._profiles[jid].size > 0 and self._profiles[jid].size not in self._profiles[jid].sums}


_erf = np.vectorize(math.erf, otypes=[float])


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF."""
    return 0.5 * (1.0 + _erf(x / _SQRT2))


def _spread(f: Fit, max_nodes: int) -> float:
    """Mean sd of log throughput over the sizes the job may run at: how unsure its curve is."""
    top = min(max(1, max_nodes), len(f.sd_log) - 1)
    return float(np.mean(f.sd_log[1:top + 1]))


def _grid_size(max_nodes: int) -> int:
    """Fits are tabulated up to the next power of two (few distinct grids to cache)."""
    n = 1
    while n < max(1, max_nodes):
        n *= 2
    return n


def nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def confidence(sizes: int, spread: float, given: bool) -> str:
    """A word for the jobs table: how much of the curve in use rests on measurements."""
    if sizes == 0:
        return "given" if given else "prior"
    if sizes < 3 or spread > 0.25:
        return "low"
    if spread > 0.10:
        return "medium"
    return "high"
