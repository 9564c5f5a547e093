"""Each idle node's true remaining idle time, read from the trace's future: a benchmark reference.

Placement ranks free nodes by how long they are expected to stay idle (core.horizon learns that
from the fragments seen so far). How much better could it do with a perfect prediction? A replay
with `--clairvoyant` gives placement the moment the main scheduler really takes each node back,
so `bench.policy` can set the learned placement against the best any predictor of idle time could
reach. With `--clairvoyant groups` placement is also told which nodes go back *together*: its
groups are the nodes the trace takes back at the same moment instead of the nodes freed at the
same moment (cohorts), the most any prediction of which nodes share fate could give. Both read
events a live harvester cannot have: replay-only references, never a policy.
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .sources.trace import read_transitions


class Clairvoyant:
    """When each node goes busy within a replay window, and so how long an idle one stays idle."""

    def __init__(self, reclaims: Mapping[str, Sequence[float]], end: float) -> None:
        self._at = {n: sorted(ts) for n, ts in reclaims.items()}
        self.end = end

    @classmethod
    def from_trace(cls, path: str | Path, nodes: Iterable[str], start: float, end: float) -> "Clairvoyant":
        """The busy transitions of `nodes` in [start, end) of the trace at `path`."""
        allowed = set(nodes)
        reclaims: dict[str, list[float]] = {}
        for t, node, is_idle, _ in read_transitions(path):
            if t >= end:
                break
            if t >= start and not is_idle and node in allowed:
                reclaims.setdefault(node, []).append(t)
        return cls(reclaims, end)

    def taken_at(self, nodes: Sequence[str], now: float) -> dict[str, float]:
        """The moment the trace next takes each node back after `now` (the window's end for one
        it never does): nodes with the same moment go back in one reclaim."""
        out = {}
        for n in nodes:
            times = self._at.get(n, ())
            i = bisect.bisect_right(times, now)
            out[n] = times[i] if i < len(times) else max(self.end, now)
        return out

    def remaining(self, nodes: Sequence[str], now: float) -> dict[str, float]:
        """Seconds until each node next goes busy after `now`; a node the window never takes back
        stays idle at least to its end."""
        return {n: t - now for n, t in self.taken_at(nodes, now).items()}
