"""Failures counted per key over a sliding window: the mechanism behind login throttling.

A key that has failed `Limit.failures` times within `Limit.window_s` seconds is refused until
its oldest failure leaves the window; the caller turns that wait into a 429 `Retry-After`.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Limit:
    failures: int
    window_s: float


class FailureWindow:
    """Thread-safe; holds at most `max_keys` keys (the least recently failed are forgotten first)
    so that a flood of made-up user names cannot grow it without bound."""

    def __init__(self, limit: Limit, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._fails.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.limit.window_s:
            times.popleft()
        if not times:
            del self._fails[key]
        return times

    def wait_s(self, key: str) -> float:
        """Seconds until `key` may try again; 0 when it may now."""
        with self._lock:
            now = self._clock()
            times = self._recent(key, now)
            if len(times) < self.limit.failures:
                return 0.0
            return max(times[-self.limit.failures] + self.limit.window_s - now, 0.001)

    def fail(self, key: str) -> None:
        with self._lock:
            self._add(key, self._clock())

    def reserve(self, key: str) -> tuple[float, float]:
        """(wait, stamp): with wait > 0 the attempt is refused; else it is counted as a failure
        now, before it is checked, so that parallel attempts see each other; `forgive(key, stamp)`
        takes it back once it succeeded (or was never checked)."""
        with self._lock:
            now = self._clock()
            times = self._recent(key, now)
            if len(times) >= self.limit.failures:
                return max(times[-self.limit.failures] + self.limit.window_s - now, 0.001), now
            self._add(key, now)
            return 0.0, now

    def forgive(self, key: str, stamp: float) -> None:
        with self._lock:
            times = self._fails.get(key)
            if times is not None and stamp in times:
                times.remove(stamp)
                if not times:
                    del self._fails[key]

    def _add(self, key: str, now: float) -> None:
        times = self._recent(key, now)
        times.append(now)
        self._fails[key] = times
        self._fails.move_to_end(key)
        while len(self._fails) > self.max_keys:
            self._fails.popitem(last=False)

    def clear(self, key: str) -> None:
        with self._lock:
            self._fails.pop(key, None)
