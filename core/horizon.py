"""The allocation horizon learned from the idle fragments the node source has shown so far.

BFTrainer's objective looks T_fwd seconds ahead: a rescale must pay for itself within T_fwd. The
right span is how long a job keeps the allocation it pays for, which ends when one of its nodes
is reclaimed; so it differs per job (HorizonLearner.decide: T_j from the nodes it holds), and
the trace says how long nodes stay idle:
every idle fragment that ended is one observation of a node's idle time, every node idle now is
one that has lasted at least its age so far (right-censored). A Kaplan-Meier estimate over both
gives the survival S(t) of an idle fragment, and from it, for a node idle for `a` seconds,

    expected remaining idle time  m(a) = ∫_a^∞ S(t) dt / S(a)
    chance it is reclaimed within T     1 - S(a + T) / S(a)

Nothing is fitted to a machine: S is whatever the fragments seen so far say (heavy-tailed on
Summit, where long-idle nodes tend to stay idle), on a fixed log-spaced grid of ages (a
resolution, not a tuning: 16 bins per decade from 1 s to ~4 months). Only the past is used, so a
replay and a live run learn the same way; until the first fragment has ended the horizon is the
fallback (BFTrainer's 10 s).

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


@dataclass(frozen=True)
class Horizon:
    """What one allocation decision looks ahead with, and what it was learned from."""

    tfwd: float                  # seconds: the median job's horizon T_j (the fallback until learned)
    fragments: int               # idle fragments that had ended when it was learned
    nodes: int                   # idle nodes (censored fragments) it was learned with
    median_s: float              # median idle fragment length, Kaplan-Meier (nan: not known yet)
    node_life_s: float           # expected remaining idle time of an idle node (rate-averaged)
    learned: bool                # False: no fragment had ended yet, tfwd is the fallback
    jobs: Mapping[str, float] = field(default_factory=dict)   # T_j per running job (learned only)

    def to_dict(self) -> dict:
        def r(x: float) -> Optional[float]:
            return None if math.isnan(x) else round(x, 1)
        return {"tfwd": round(self.tfwd, 3), "fragments": self.fragments, "nodes": self.nodes,
                "median_s": r(self.median_s), "node_life_s": r(self.node_life_s), "learned": self.learned,
                "jobs": {j: round(t, 1) for j, t in self.jobs.items()}}


class FragmentSurvival:
    """Kaplan-Meier survival of idle fragments on a fixed log grid of durations."""

    def __init__(self) -> None:
        self.ended = np.zeros(len(EDGES) - 1)   # fragments that ended, by the bin of their length
        self.count = 0

    def observe(self, duration: float) -> None:
        """One idle fragment ended after `duration` seconds (the node was reclaimed)."""
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
        """Median idle fragment length (nan until a fragment has ended)."""
        surv, _ = fitted or self.curve(idle_ages)
        below = np.flatnonzero(surv <= 0.5)
        if not self.count or not len(below):
            return math.nan
        i = int(below[0])
        if i == 0:
            return 0.0
        s0, s1 = surv[i - 1], surv[i]
        f = (s0 - 0.5) / (s0 - s1) if s0 > s1 else 0.0
        return float(EDGES[i - 1] + f * (EDGES[i] - EDGES[i - 1]))


class HorizonLearner:
    """Learns the survival of idle fragments online and turns it into a Horizon per decision."""

    def __init__(self, fallback: float = FALLBACK_S) -> None:
        self.survival = FragmentSurvival()
        self.fallback = fallback
        self.last = Horizon(fallback, 0, 0, math.nan, math.nan, False)

    def ended(self, duration: float) -> None:
        """A node's idle fragment ended (the main scheduler took it back) after `duration` s."""
        self.survival.observe(duration)

    def state(self) -> dict:
        return self.survival.state()

    def load(self, state: dict) -> None:
        """After a restart: the fragments seen before it (core.restore; the nodes idle now come
        back with their idle-since times, so their ages stay right)."""
        self.survival.load(state)

    def expected(self, ages: Sequence[float], idle_ages: Sequence[float]) -> np.ndarray:
        """Expected remaining idle time per node of `ages` (placement ranks nodes by it)."""
        if not self.survival.count:
            return np.asarray(ages, dtype=float)        # nothing ended yet: older = safer
        return self.survival.remaining(np.asarray(ages, dtype=float), np.asarray(idle_ages, dtype=float))

    def decide(self, ages: Sequence[float], holders: Sequence[Optional[str]],
               jobs: Sequence[str]) -> Horizon:
        """The horizon of one decision from the ages of the idle nodes, who holds each (None:
        free) and the running `jobs`.

        A rescale pays off while the job keeps the allocation it bought; what ends that is the
        next reclaim of one of its nodes (a forced pause and re-plan). With m_i the expected
        remaining idle time of node i, node i is reclaimed at a rate of about 1/m_i, so job j,
        holding H_j and growing onto free nodes like those free now, keeps its allocation for

            T_j = 1 / ( sum_{i in H_j} 1/m_i  +  mean_{i free} 1/m_i )

        seconds: that is what its rescale is amortised over (core.objective). Long-idle nodes
        and small jobs lengthen it; a big job on freshly idle nodes shortens it. `tfwd` is the
        median T_j (what the probes and the dashboard quote)."""
        idle = np.asarray(ages, dtype=float)
        surv = self.survival
        if not surv.count or not len(idle):
            self.last = Horizon(self.fallback, surv.count, len(idle), math.nan, math.nan, False)
            return self.last
        fitted = surv.curve(idle)
        rem = surv.remaining(idle, idle, fitted)
        hazard = 1.0 / np.maximum(rem, 1.0)                      # reclaims per node-second
        held: dict[str, float] = {j: 0.0 for j in jobs}
        free = []
        for h, who in zip(hazard.tolist(), holders):
            if who is None or who not in held:
                free.append(h)
            else:
                held[who] += h
        join = float(np.mean(free)) if free else float(np.mean(hazard))
        per_job = {j: 1.0 / (h + join) for j, h in held.items()}
        tfwd = float(np.median(list(per_job.values()))) if per_job else 1.0 / join
        self.last = Horizon(tfwd, surv.count, len(idle), surv.median(idle, fitted),
                            1.0 / float(np.mean(hazard)), True, per_job)
        return self.last
