"""How many jobs one user may register: at most `per_minute` in any 60 s and `per_day` in any
24 h (sliding windows, wall clock), every registration counted, the ones cancelled since too,
so that a register-then-cancel loop cannot fill the store; staff are exempt (as from
--user-max-jobs). A registration over either is refused before anything is stored, with how
long to wait (HTTP 429 Retry-After). The day's counts survive a restart: `seed` takes them from
the store's registrations of the last 24 h."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from .windows import Limit, SlidingWindow

#: registrations one (non-staff) user may make per minute and per day; 0: no limit
DEFAULT_PER_MINUTE = 30
DEFAULT_PER_DAY = 1000
MINUTE_S = 60.0
DAY_S = 86400.0
#: users whose registrations are remembered at once (the least recent are forgotten first)
MAX_USERS = 100_000


@dataclass(frozen=True)
class RegistrationLimits:
    per_minute: int = DEFAULT_PER_MINUTE
    per_day: int = DEFAULT_PER_DAY


class TooManyRegistrations(ValueError):
    """A registration over a limit: `retry_after` whole seconds until one more fits."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after_s))


class Registrations:
    """Each user's registrations in the last minute and day; thread-safe (the service checks and
    records under the controller's lock, so parallel registrations of one user see each other)."""

    def __init__(self, limits: RegistrationLimits = RegistrationLimits(),
                 clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self._windows = [(w, n, what) for w, n, what in (
            (SlidingWindow(Limit(limits.per_minute, MINUTE_S), MAX_USERS, clock), limits.per_minute, "minute"),
            (SlidingWindow(Limit(limits.per_day, DAY_S), MAX_USERS, clock), limits.per_day, "24 hours"))
            if n > 0]
        self._clock = clock
        self.seeded = False

    def seed_once(self, ctl) -> None:
        """At the first start of this process: count the store's registrations of the last 24 h
        (on the controller's clock), so that a restart does not reset the day's counts."""
        if not self.seeded and ctl.store is not None:
            now = ctl.clock.now()
            self.seed(recent(ctl.store, now - DAY_S), now)
            self.seeded = True

    def admit(self, owner: str, staff: bool, register: Callable[[], None]) -> None:
        """`register()` if `owner` may register one more job now, counted once it returned;
        TooManyRegistrations (nothing called) if not. The caller holds the lock registrations
        are made under, so that parallel ones of one user see each other."""
        self.check(owner, staff)
        register()
        self.record(owner, staff)

    def check(self, owner: str, staff: bool) -> None:
        """Raise TooManyRegistrations if `owner` may not register one more job now."""
        if staff:
            return
        for window, limit, what in self._windows:
            wait = window.wait_s(owner)
            if wait > 0:
                raise TooManyRegistrations(
                    f"job: you registered {limit} job(s) in the last {what}, the most one user may "
                    f"(cancelled ones count too); try again in {math.ceil(wait)} s", wait)

    def record(self, owner: str, staff: bool) -> None:
        """Count a registration that was made (stored)."""
        if staff:
            return
        for window, _, _ in self._windows:
            window.add(owner)

    def seed(self, registrations: Iterable[tuple[str, float]], now: Optional[float] = None) -> int:
        """Count earlier registrations, (owner, time) with `time` on the clock `now` is read on
        (the controller's): each is placed as long ago as it was made. Returns how many counted."""
        if now is None:
            now = self._clock()
        wall, counted = self._clock(), 0
        for owner, t in registrations:
            age = now - t
            if owner and 0 <= age < DAY_S:
                for window, _, _ in self._windows:
                    window.add(owner, wall - age)
                counted += 1
        return counted

    def count(self, owner: str) -> tuple[int, int]:
        """(in the last minute, in the last 24 h); a window without a limit counts nothing."""
        got = {what: w.count(owner) for w, _, what in self._windows}
        return got.get("minute", 0), got.get("24 hours", 0)


def recent(store, since: float) -> list[tuple[str, float]]:
    """(owner, submit time) of every registration made since `since` (the store's jobs by their
    indexed submit_time): what `Registrations.seed` counts after a restart."""
    return [(o, t) for o, t in store.db.execute(
        "select owner, submit_time from jobs where submit_time >= ? and coalesce(owner, '') != ''", (since,))]
