"""Live replay: the runner advances a Replay at `speed` x wall time. Pause, resume and speed
only move the anchors that map wall time to simulated time."""
from __future__ import annotations

import time
from typing import Optional

from apscheduler.schedulers.base import BaseScheduler

from ..replay import Replay
from .base import Runner


class ReplayRunner(Runner):
    job_id = "replay-tick"
    can_set_speed = True

    def __init__(self, replay: Replay, speed: float = 60.0, tick_s: float = 0.5,
                 scheduler: Optional[BaseScheduler] = None, first_seq: int = 0) -> None:
        if speed <= 0:
            raise ValueError("speed and tick_s must be positive")
        self.replay = replay
        self.speed = float(speed)
        self.summary: Optional[dict] = None
        self._anchor()
        super().__init__(replay.controller, tick_s, first_seq, scheduler)

    def _anchor(self) -> None:
        self._wall0 = time.monotonic()
        self._sim0 = self.replay.clock.now()

    def _on_start(self) -> None:
        self._anchor()

    def _on_resume(self) -> None:
        self._anchor()

    def _on_stop(self, was_active: bool) -> None:
        if was_active:
            self.replay.checkpoint()

    def set_speed(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        with self._lock:
            self._anchor()
            self.speed = float(speed)

    def _advance(self) -> bool:
        target = self._sim0 + (time.monotonic() - self._wall0) * self.speed
        more = self.replay.advance(target)
        if not more:
            self.summary = self.replay.finish()
        return more
