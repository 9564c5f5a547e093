"""Fair shares: each owner's weight in the `fairshare` objective, from what they used lately
against their share (Slurm's classic fair-share factor, F = 2^(-U/S)).

    U_o = owner o's node-seconds, decayed with a half-life, over all owners' (decayed) use
    S_o = o's share (users file `share`, default 1) over the shares of the owners running now
    F_o = 2 ** (-U_o / S_o)             1 for an owner who used nothing, 1/2 for one exactly at
                                        their share, 1/4 at twice it (never below
                                        MIN_FACTOR)

The allocator multiplies each job's value table by its owner's F (core.objective), so the solve
stays exact and linear: an owner below their share wins scarce nodes from one above it unless
the other's jobs scale that much better. Jobs without an owner count as one owner ("")."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence

from .objective import JobRequest

if TYPE_CHECKING:
    from .clock import Clock
    from .controller_config import ControllerConfig
    from .model import Job

#: Slurm's default PriorityDecayHalfLife: usage a week old counts half
DEFAULT_HALF_LIFE_S = 7 * 86400.0
#: the least weight an owner gets (2^-10): far enough below 1 to yield, near enough that the
#: solvers' tolerances still see the owner's jobs' values
MIN_FACTOR = 2.0 ** -10


class DecayedUsage:
    """Node-seconds per owner, each second's weight halving every `half_life_s`. Holds only
    (value, as of when) per owner; a hold reported late (a restart's history) is decayed to the
    newer moment, so the order holds are added in does not matter."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half-life must be positive seconds, not {half_life_s!r}")
        self.half_life_s = half_life_s
        self._by_owner: dict[str, tuple[float, float]] = {}     # owner -> (decayed node-s, as of)

    def _decay(self, dt: float) -> float:
        return 2.0 ** (-dt / self.half_life_s)

    def add(self, owner: str, nodes: int, t0: float, t1: float) -> None:
        """`nodes` held by `owner` from t0 to t1: their decayed integral as of t1."""
        if nodes <= 0 or t1 <= t0:
            return
        gained = nodes * self.half_life_s / math.log(2.0) * (1.0 - self._decay(t1 - t0))
        value, at = self._by_owner.get(owner, (0.0, t1))
        now = max(at, t1)
        self._by_owner[owner] = (value * self._decay(now - at) + gained * self._decay(now - t1), now)

    def value(self, owner: str, now: float) -> float:
        value, at = self._by_owner.get(owner, (0.0, now))
        return value * self._decay(max(0.0, now - at))

    def owners(self) -> list[str]:
        return list(self._by_owner)


def factors(usage: DecayedUsage, owners: Iterable[str], shares: Mapping[str, float], now: float) -> dict[str, float]:
    """F per owner in `owners` (those competing now). Usage is normalised over every owner seen
    (an owner who is idle now still used the machine); shares over those competing."""
    competing = sorted(set(owners))
    if not competing:
        return {}
    seen = sorted(set(usage.owners()) | set(competing))        # sorted: the same sum in every process
    total_use = sum(usage.value(o, now) for o in seen)
    total_share = sum(shares.get(o, 1.0) for o in competing)
    out = {}
    for o in competing:
        u = usage.value(o, now) / total_use if total_use > 0 else 0.0
        s = shares.get(o, 1.0) / total_share
        out[o] = max(MIN_FACTOR, 2.0 ** (-u / s))
    return out


class FairShare:
    """What a controller keeps for the `fairshare` objective: every owner's decayed use, and the
    weighing of a solve's job requests by their owners' factors."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        self.usage = DecayedUsage(half_life_s)

    @classmethod
    def wanted(cls, config: "ControllerConfig") -> Optional["FairShare"]:
        """One where the objective or the queue order is `fairshare`, else None."""
        return cls(config.fair_half_life) if "fairshare" in (config.objective, config.queue) else None

    def ranker(self, shares: Callable[[], Mapping[str, float]], clock: "Clock") -> Callable[["Job"], float]:
        """The fair-share queue's order: a job's owner's use per share now."""
        return lambda job: self.use_per_share(job.owner, shares(), clock.now())

    def count(self, held: Iterable[tuple[str, int]], t0: float, t1: float) -> None:
        """(owner, nodes) of each running job, held from t0 to t1."""
        for owner, n in held:
            self.usage.add(owner, n, t0, t1)

    def seed(self, holds: Iterable[tuple[str, float, float]]) -> None:
        """One node per (owner, start, end), from the store's history: a restart weighs the same."""
        for owner, start, end in holds:
            self.usage.add(owner, 1, start, end)

    def use_per_share(self, owner: str, shares: Mapping[str, float], now: float) -> float:
        """What orders the fair-share queue (lowest first): F falls as this rises, whatever the
        other owners' figures."""
        return self.usage.value(owner, now) / shares.get(owner, 1.0)

    def factors(self, owners: Iterable[str], shares: Mapping[str, float], now: float) -> dict[str, float]:
        return factors(self.usage, owners, shares, now)

    def weigh(self, reqs: Sequence[JobRequest], owners: Sequence[str], shares: Mapping[str, float],
              now: float) -> list[JobRequest]:
        """Each request with its owner's factor (`owners[i]` owns `reqs[i]`)."""
        f = self.factors(owners, shares, now)
        return [replace(r, fair=f[o]) for r, o in zip(reqs, owners)]
