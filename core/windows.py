"""Events counted per key over a sliding window: the one mechanism behind login throttling
(failed logins, app/throttle.py) and registration limits (core/registrations.py).

A key with `Limit.events` events within `Limit.window_s` seconds is refused until its oldest
event leaves the window; the caller turns that wait into a 429 `Retry-After`.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Limit:
    events: int
    window_s: float


class SlidingWindow:
    """Thread-safe; holds at most `max_keys` keys (the least recently counted are forgotten
    first) so that a flood of made-up keys cannot grow it without bound."""

    def __init__(self, limit: Limit, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._events.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.limit.window_s:
            times.popleft()
        if not times:
            del self._events[key]
        return times

    def _wait(self, times: deque[float], now: float) -> float:
        if len(times) < self.limit.events:
            return 0.0
        return max(times[-self.limit.events] + self.limit.window_s - now, 0.001)

    def wait_s(self, key: str) -> float:
        """Seconds until `key` may have another event; 0 when it may now."""
        with self._lock:
            now = self._clock()
            return self._wait(self._recent(key, now), now)

    def count(self, key: str) -> int:
        """Events of `key` within the window now."""
        with self._lock:
            return len(self._recent(key, self._clock()))

    def add(self, key: str, at: float | None = None) -> None:
        """Count an event of `key` now (or at `at`, on this window's clock: a seed from history)."""
        with self._lock:
            now = self._clock()
            self._add(key, now if at is None else min(at, now), now)

    def reserve(self, key: str) -> tuple[float, float]:
        """(wait, stamp): with wait > 0 the attempt is refused; else it is counted now, before
        it is checked, so that parallel attempts see each other; `forgive(key, stamp)` takes it
        back (a login that succeeded, or was never checked)."""
        with self._lock:
            now = self._clock()
            wait = self._wait(self._recent(key, now), now)
            if wait > 0:
                return wait, now
            self._add(key, now, now)
            return 0.0, now

    def forgive(self, key: str, stamp: float) -> None:
        with self._lock:
            times = self._events.get(key)
            if times is not None and stamp in times:
                times.remove(stamp)
                if not times:
                    del self._events[key]

    def _add(self, key: str, at: float, now: float) -> None:
        times = self._recent(key, now)
        if at <= now - self.limit.window_s:
            return
        if times and at < times[-1]:            # a seed out of order: keep the deque sorted
            times = deque(sorted((*times, at)))
        else:
            times.append(at)
        self._events[key] = times
        self._events.move_to_end(key)
        while len(self._events) > self.max_keys:
            self._events.popitem(last=False)

    def clear(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)
