"""Where the controller's `now` comes from: the wall clock live, a simulated clock in replay.

The same controller code runs in both; only replay moves its clock by hand.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod


class Clock(ABC):
    @abstractmethod
    def now(self) -> float:
        """Seconds since the epoch."""


class WallClock(Clock):
    def now(self) -> float:
        return time.time()


class SimClock(Clock):
    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"simulated time cannot go back ({t} < {self._t})")
        self._t = float(t)
