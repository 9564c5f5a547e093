"""The allocation horizon learned online, and what an idle node is expected to do.

BFTrainer's objective looks T_fwd seconds ahead: a rescale must pay for itself within T_fwd. The
right span is how long the allocation a job pays for will stand before it changes again, for
whatever reason: a reclaim of one of its nodes, a join that makes another size better, another
job starting or ending. So the learner watches exactly that: every time a running job's
allocation changes, the allocation it had stood for one observation; the allocations standing
now have lasted at least their age so far (right-censored). One change ends no stand: a grow
while the job is still regrouping onto its start or its last grow (within its scale-up time of
it). The allocator folds such a grow into the regroup under way (it charges only the pause it
adds), so the allocation it replaces never ran, and nothing was taken from the job. A cold
start on hundreds of nodes grows a job once per pilot that connects, ms apart: counted, those
stands taught a horizon of 0.5 s, after which no grow paid and 240 held nodes sat idle. A grow
after the regroup still ends a stand: the allocation stood, and the next decision replaced it
(counting those too as going on lengthened the horizon and cost the replay 0.09 points).

The horizon of a decision is the Kaplan-Meier median of those stands, one for every job (a
rescale is a bet that the new allocation stands long enough; the median is the span over which
it wins more often than not, and on heavy-tailed stands the mean is ruled by a few quiet
nights). Per-job horizons from the nodes each job holds were measured too and lost to it
(docs/policy-experiments.md): their spread made jobs thrash.

The idle fragments give what placement needs: every fragment that ended is one observation of a
node's idle time, every node idle now one still going. From their survival S(t), for a node idle
for `a` seconds,

    expected remaining idle time  m(a) = ∫_a^∞ S(t) dt / S(a)
    chance it is reclaimed within T     1 - S(a + T) / S(a)

Nothing is fitted to a machine: both survivals are whatever was seen so far (heavy-tailed on
Summit), on a fixed log-spaced grid of durations (a resolution, not a tuning: 16 bins per decade
from 1 s to ~4 months). Only the past is used, so a replay and a live run learn the same way.
Until MIN_STANDS allocations have changed, the horizon is the fallback (BFTrainer's 10 s) or, once
allocations have stood longer than that, the lower bound they vouch for: the median with those
standing taken as ended now. On a calm machine the first changes can take hours, and 10 s would
keep the first jobs on every idle node all that while.

Pure: plain numbers in, plain records out; no clock, no I/O. The controller feeds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

PER_DECADE = 16
EDGES = np.concatenate(([0.0], np.logspace(0.0, 7.0, 7 * PER_DECADE + 1)))   # 0, 1 s .. 1e7 s
FALLBACK_S = 10.0
MIN_STANDS = 5     # stands that ended before their median counts (a median of fewer says little)
#: decisions are made on events, but the horizon grows while nothing happens (the stands standing
#: get older); once it is this many times the one the last plan used, the plan is made again
REPLAN_GROWTH = 2.0


@dataclass(frozen=True)
class Horizon:
    """What one allocation decision looks ahead with, and what it was learned from."""

    tfwd: float                  # seconds a rescale is amortised over (the fallback until learned)
    fragments: int               # idle fragments that had ended when it was learned
    nodes: int                   # idle nodes (censored fragments) it was learned with
    median_s: float              # median idle fragment length, Kaplan-Meier (nan: not known yet)
    node_life_s: float           # expected remaining idle time of an idle node (rate-averaged)
    learned: bool                # False: too few allocations have changed yet (tfwd: fallback or bound)
    jobs: Mapping[str, float] = field(default_factory=dict)   # the horizon of each running job
    stands: int = 0              # allocations that stood and then changed
    standing: int = 0            # allocations standing now (censored stands)
    bound: bool = False          # not learned yet, but tfwd is the lower bound the stands give (above the fallback)

    def to_dict(self) -> dict:
        def r(x: float) -> Optional[float]:
            return None if math.isnan(x) else round(x, 1)
        return {"tfwd": round(self.tfwd, 3), "fragments": self.fragments, "nodes": self.nodes,
                "median_s": r(self.median_s), "node_life_s": r(self.node_life_s), "learned": self.learned,
                "jobs": {j: round(t, 1) for j, t in self.jobs.items()}, "stands": self.stands,
                "standing": self.standing, "bound": self.bound}


class FragmentSurvival:
    """Kaplan-Meier survival of durations on a fixed log grid: idle fragments, allocation stands."""

    def __init__(self) -> None:
        self.ended = np.zeros(len(EDGES) - 1)   # fragments that ended, by the bin of their length
        self.count = 0

    def observe(self, duration: float) -> None:
        """One duration ended: an idle fragment (the node was reclaimed), a stand (it changed)."""
        b = int(np.searchsorted(EDGES, max(0.0, duration), side="right")) - 1
        self.ended[min(b, len(self.ended) - 1)] += 1
        self.count += 1

    def state(self) -> dict:
        """What survives a restart: ended fragments per bin (nonzero bins only), on this grid."""
        nz = np.flatnonzero(self.ended)
        return {"per_decade": PER_DECADE, "bins": len(self.ended), "count": self.count,
                "ended": {str(int(b)): int(self.ended[b]) for b in nz}}

    def load(self, state: dict) -> None:
        """Take up what `state()` wrote; refuses a state from another grid or a count that does
        not add up, rather than learning from a wrong histogram."""
        if state.get("per_decade") != PER_DECADE or state.get("bins") != len(self.ended):
            raise ValueError(f"horizon state is for another grid ({state.get('per_decade')} bins per decade, "
                             f"{state.get('bins')} bins; this one has {PER_DECADE}, {len(self.ended)})")
        ended = np.zeros(len(self.ended))
        for b, n in state.get("ended", {}).items():
            if not 0 <= int(b) < len(ended) or int(n) < 0:
                raise ValueError(f"horizon state: bin {b} with {n} fragments is out of range")
            ended[int(b)] = int(n)
        if int(ended.sum()) != state.get("count"):
            raise ValueError(f"horizon state: {int(ended.sum())} fragments in the bins, {state.get('count')} counted")
        self.ended, self.count = ended, int(state["count"])

    def curve(self, ages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """S at every grid edge and ∫ S from each edge to the end, given the nodes idle now
        (their ages are censored fragments). S is 0 past the last bin anything reached."""
        censored = np.histogram(np.clip(ages, 0.0, EDGES[-1] * 0.999), EDGES)[0]
        # at risk at a bin's start: every fragment (ended or still idle) that got that far
        at_risk = np.cumsum((self.ended + censored)[::-1])[::-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(at_risk > 0, self.ended / at_risk, 1.0)
        surv = np.concatenate(([1.0], np.cumprod(1.0 - hazard)))
        area = np.diff(EDGES) * (surv[:-1] + surv[1:]) / 2.0
        tail = np.concatenate((np.cumsum(area[::-1])[::-1], [0.0]))
        return surv, tail

    @staticmethod
    def _at(surv: np.ndarray, tail: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """S(t) and ∫_t^∞ S, linear in t within a bin."""
        t = np.clip(t, 0.0, EDGES[-1])
        b = np.clip(np.searchsorted(EDGES, t, side="right") - 1, 0, len(EDGES) - 2)
        lo, hi = EDGES[b], EDGES[b + 1]
        f = (t - lo) / (hi - lo)
        s = surv[b] + f * (surv[b + 1] - surv[b])
        rest = (hi - t) * (s + surv[b + 1]) / 2.0
        return s, tail[b + 1] + rest

    def remaining(self, ages: np.ndarray, idle_ages: np.ndarray,
                  fitted: Optional[tuple[np.ndarray, np.ndarray]] = None) -> np.ndarray:
        """Expected remaining idle time of nodes idle for `ages` seconds, with `idle_ages` the
        nodes idle now (censored); 0 where S has fallen to 0 (older than anything seen ended).
        `fitted`: curve(idle_ages) when the caller has it already."""
        surv, tail = fitted or self.curve(idle_ages)
        s, rest = self._at(surv, tail, np.asarray(ages, dtype=float))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s > 1e-12, rest / np.maximum(s, 1e-12), 0.0)

    def reclaim_within(self, ages: np.ndarray, horizon: float, idle_ages: np.ndarray,
                       fitted: Optional[tuple[np.ndarray, np.ndarray]] = None) -> np.ndarray:
        """Chance that a node idle for `ages` seconds is reclaimed within `horizon` seconds."""
        surv, tail = fitted or self.curve(idle_ages)
        a = np.asarray(ages, dtype=float)
        s0, _ = self._at(surv, tail, a)
        s1, _ = self._at(surv, tail, a + horizon)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s0 > 1e-12, 1.0 - s1 / np.maximum(s0, 1e-12), 1.0)

    def median(self, idle_ages: np.ndarray, fitted: Optional[tuple[np.ndarray, np.ndarray]] = None) -> float:
        """Median duration, with `idle_ages` those still going (nan until enough have ended)."""
        surv, _ = fitted or self.curve(idle_ages)
        return _median(surv) if self.count else math.nan

    def lower_median(self, going: np.ndarray) -> float:
        """The median with every duration still going taken as ended now, at its age: no more
        than the median they will all have once they end, whatever that turns out to be (nan with
        nothing observed). What a few observations can vouch for before Kaplan-Meier can."""
        counts = self.ended + np.histogram(np.clip(going, 0.0, EDGES[-1] * 0.999), EDGES)[0]
        total = counts.sum()
        if not total:
            return math.nan
        return _median(np.concatenate(([1.0], 1.0 - np.cumsum(counts) / total)))


def _median(surv: np.ndarray) -> float:
    """Where a survival on the grid's edges falls to one half, linear within a bin (nan: never)."""
    below = np.flatnonzero(surv <= 0.5)
    if not len(below):
        return math.nan
    i = int(below[0])
    if i == 0:
        return 0.0
    s0, s1 = surv[i - 1], surv[i]
    f = (s0 - 0.5) / (s0 - s1) if s0 > s1 else 0.0
    return float(EDGES[i - 1] + f * (EDGES[i] - EDGES[i - 1]))


class HorizonLearner:
    """Learns how long allocations stand and how long idle nodes stay, online; one Horizon per
    decision."""

    def __init__(self, fallback: float = FALLBACK_S) -> None:
        self.survival = FragmentSurvival()       # idle fragments (placement's expected idle time)
        self.stands = FragmentSurvival()         # how long a job's allocation stood before it changed
        self.fallback = fallback
        self._since: dict[str, float] = {}       # running job -> when its allocation last changed
        self._grown: dict[str, Optional[float]] = {}   # running job -> its last start or grow (None: a loss since)
        self.last = Horizon(fallback, 0, 0, math.nan, math.nan, False)

    def ended(self, duration: float) -> None:
        """A node's idle fragment ended (the main scheduler took it back) after `duration` s."""
        self.survival.observe(duration)

    def changed(self, job: str, now: float, grew: bool = False, regroup_s: float = 0.0) -> None:
        """`job`'s allocation changed at `now` (it started, grew, shrank or lost nodes): the one
        it had, if any, stood since its last change; except where it `grew` within `regroup_s`
        (its scale-up time) of a start or grow: that regroup absorbs this one, the stand goes on."""
        began = self._since.get(job)
        last = self._grown.get(job)
        self._grown[job] = now if grew else None
        if began is not None and grew and last is not None and now - last < regroup_s:
            return
        if began is not None:
            self.stands.observe(now - began)
        self._since[job] = now

    def left(self, job: str) -> None:
        """`job` holds nothing any more (it ended, stopped or went back to the queue)."""
        self._since.pop(job, None)
        self._grown.pop(job, None)

    def state(self) -> dict:
        return {"fragments": self.survival.state(), "stands": self.stands.state()}

    def load(self, state: dict) -> None:
        """After a restart: the fragments and stands seen before it (core.restore; the nodes idle
        now come back with their idle-since times, so their ages stay right; the allocations
        standing now start their stands again). A state from before stands were learned holds
        the fragments alone."""
        if "per_decade" in state:
            self.survival.load(state)
            return
        self.survival.load(state.get("fragments") or FragmentSurvival().state())
        self.stands.load(state.get("stands") or FragmentSurvival().state())

    def expected(self, ages: Sequence[float], idle_ages: Sequence[float]) -> np.ndarray:
        """Expected remaining idle time per node of `ages` (placement ranks nodes by it)."""
        if not self.survival.count:
            return np.asarray(ages, dtype=float)        # nothing ended yet: older = safer
        return self.survival.remaining(np.asarray(ages, dtype=float), np.asarray(idle_ages, dtype=float))

    def decide(self, ages: Sequence[float], jobs: Sequence[str], now: float) -> Horizon:
        """The horizon of one decision at `now`, with `ages` the idle nodes' ages and `jobs` the
        running ones: the Kaplan-Meier median of the allocation stands seen so far, those of the
        running jobs still going (censored); until MIN_STANDS have ended, the fallback or the lower
        bound of their median, whichever is longer."""
        idle = np.asarray(ages, dtype=float)
        frag, median_s, life = self.survival, math.nan, math.nan
        if frag.count and len(idle):
            fitted = frag.curve(idle)
            median_s = frag.median(idle, fitted)
            life = 1.0 / float(np.mean(1.0 / np.maximum(frag.remaining(idle, idle, fitted), 1.0)))
        going = np.array([now - self._since[j] for j in jobs if j in self._since], dtype=float)
        stand = math.nan
        if self.stands.count >= MIN_STANDS:
            stand = self.stands.median(np.maximum(going, 0.0))
        learned = not math.isnan(stand) and stand > 0
        tfwd, bound = (stand if learned else self.fallback), False
        if not learned:
            low = self.stands.lower_median(np.maximum(going, 0.0))
            if low > self.fallback:          # nan (nothing observed) is not
                tfwd, bound = low, True
        self.last = Horizon(tfwd, frag.count, len(idle), median_s, life, learned,
                            {j: tfwd for j in jobs} if learned else {}, self.stands.count, len(going), bound)
        return self.last


def learn_step(learner: Optional[HorizonLearner], idle: Mapping[str, float], jobs: Sequence[str], now: float,
               clairvoyant=None) -> tuple[Optional[Horizon], Optional[dict[str, float]]]:
    """One step's horizon (None with a fixed T_fwd) and every idle node's expected remaining idle
    time for placement (`idle`: node -> idle since; None with a fixed T_fwd or before a fragment
    has ended). A clairvoyant replay (`clairvoyant(names, now)`) gives the true times instead."""
    if not idle:
        return None, None
    names = list(idle)
    if learner is None:
        return None, clairvoyant(names, now) if clairvoyant is not None else None
    ages = now - np.fromiter(idle.values(), dtype=float, count=len(names))
    horizon = learner.decide(ages, list(jobs), now)
    if clairvoyant is not None:
        return horizon, clairvoyant(names, now)
    if not learner.survival.count:
        return horizon, None
    return horizon, dict(zip(names, learner.expected(ages, ages).tolist()))
