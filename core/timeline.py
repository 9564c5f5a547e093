"""When the controller adds a point to the charts' time series: every `every` simulated seconds,
and in live mode also whenever the node or job counts change, so the charts follow each rescale
without a point per step of a fast replay."""
from __future__ import annotations

from typing import Optional

from .store import Batch


class Timeline:
    def __init__(self, every: float = 60.0) -> None:
        self.every = every              # simulated seconds between points
        self.on_change = False          # also a point whenever the counts change (live)
        self.at: Optional[float] = None  # time of the last point
        self._counts: tuple = ()        # (idle, used, running, queued) at that point

    def due(self, now: float, counts: tuple) -> bool:
        if self.at is None or now - self.at >= self.every:
            return True
        return self.on_change and counts != self._counts

    def point(self, batch: Batch, now: float, counts: tuple, rate: float) -> None:
        self.at, self._counts = now, counts
        batch.timeline_point(now, *counts, rate)
