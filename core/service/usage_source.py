"""Where a harvester's usage figures come from: a report over any window reads the store's whole
history (core/usage.py); the counters since the run began are kept up to date from what is new
(core/usage_tally.py), one tally per run, its one full read done in the background at the start."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..store import UsageHistory
from ..usage import Change, JobRecord, Progress, Totals, UsageReport, report
from ..usage_tally import UsageFeed

EMPTY = {"changes": [], "progress": [], "jobs": [], "timeline": [], "until": None}


class UsageSource:
    def __init__(self, db: Path) -> None:
        self.db = Path(db)
        self._history = UsageHistory(self.db)
        self._feed: Optional[UsageFeed] = None

    def begin_run(self, slots: Callable[[str], int]) -> None:
        """A run (re)started: a new tally, brought up to date in the background."""
        if self._feed is not None:
            self._feed.close()
        self._feed = feed = UsageFeed(self.db, slots)
        threading.Thread(target=feed.totals, name="usage-seed", daemon=True).start()

    def report(self, start: Optional[float], end: Optional[float], by: str, accounts: Optional[Mapping[str, str]],
               slots: Callable[[str], int], now: float, series: bool) -> UsageReport:
        """core.usage.report over the store's history as of its last flush (`now` if none yet)."""
        history = self._history.read() or EMPTY
        until = history["until"]
        return report((Change(t, j, tuple(a), tuple(r)) for t, j, a, r in history["changes"]),
                      (Progress(*row) for row in history["progress"]),
                      (JobRecord(*row) for row in history["jobs"]), history["timeline"], start, end,
                      now if until is None else until, by, accounts, slots, series)

    def totals(self) -> dict[str, Totals]:
        feed = self._feed
        return feed.totals() if feed is not None else {}

    def close(self) -> None:
        self._history.close()
        if self._feed is not None:
            self._feed.close()
