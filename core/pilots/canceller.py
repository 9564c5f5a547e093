"""Pilot cancels asked for on the hub's reader thread (a stray hello, a lost connection) run on a
thread of their own, all that came meanwhile in one command: the reader must never wait for
scancel, and a thousand pilots lost at once are one scancel, not a thousand."""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class Canceller:
    """Calls `cancel(jobs)` with every job `add`ed since its last call; `close` sends what is
    left and stops."""

    def __init__(self, cancel: Callable[[list[str]], None]) -> None:
        self._cancel = cancel
        self._jobs: list[str] = []
        self._cv = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="pilot-cancels", daemon=True)
        self._thread.start()

    def add(self, jobs: list[str]) -> None:
        with self._cv:
            self._jobs += [j for j in jobs if j not in self._jobs]
            self._cv.notify()

    def close(self, timeout: float) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._jobs or self._closing)
                jobs, self._jobs = self._jobs, []
                if not jobs and self._closing:
                    return
            try:
                self._cancel(jobs)
            except Exception:          # never let the thread die: the next cancel may work
                log.exception("cancelling pilots %s failed", ", ".join(jobs))
