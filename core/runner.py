"""Live replay: an APScheduler interval job advances a Replay at `speed` x wall time.

The scheduler thread is the only one that moves the simulation; commands (pause, resume,
speed) only change the anchors, and readers get the last published Snapshot, so a web
callback never waits on the allocator.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from .replay import Replay
from .snapshot import Snapshot, build_snapshot

JOB_ID = "replay-tick"
log = logging.getLogger(__name__)


class ReplayRunner:
    def __init__(self, replay: Replay, speed: float = 60.0, tick_s: float = 0.5,
                 scheduler: Optional[BaseScheduler] = None, first_seq: int = 0) -> None:
        if speed <= 0 or tick_s <= 0:
            raise ValueError("speed and tick_s must be positive")
        self.replay = replay
        self.speed = float(speed)
        self.tick_s = tick_s
        self._own = scheduler is None
        self.scheduler = scheduler or BackgroundScheduler(daemon=True)
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self.status = "stopped"
        self.summary: Optional[dict] = None
        self.error: Optional[str] = None
        self._seq = first_seq
        self._wall0 = time.monotonic()
        self._sim0 = replay.clock.now()
        self._snapshot = build_snapshot(replay.controller, self.status, first_seq)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def controller(self):
        return self.replay.controller

    def _anchor(self) -> None:
        self._wall0 = time.monotonic()
        self._sim0 = self.replay.clock.now()

    def start(self) -> None:
        with self._lock:
            if self.status != "stopped":
                return
            self._anchor()
            self.status = "running"
            self.scheduler.add_job(self._tick, "interval", seconds=self.tick_s, id=JOB_ID,
                                   max_instances=1, coalesce=True, replace_existing=True)
            if self._own and not self.scheduler.running:
                self.scheduler.start()
        self._publish()

    def pause(self) -> None:
        with self._lock:
            if self.status == "running":
                self.status = "paused"
                self._publish()

    def resume(self) -> None:
        with self._lock:
            if self.status == "paused":
                self._anchor()
                self.status = "running"
                self._publish()

    def set_speed(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        with self._lock:
            self._anchor()
            self.speed = float(speed)

    def stop(self) -> None:
        """Stop ticking and save where the replay stands."""
        with self._lock:
            if self.scheduler.get_job(JOB_ID):
                self.scheduler.remove_job(JOB_ID)
            if self.status in ("running", "paused"):
                self.status = "stopped"
                self.replay.checkpoint()
            self._publish()
        if self._own and self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def tick(self) -> None:
        """One step of the live loop (also callable directly, e.g. from a test)."""
        self._tick()

    def _tick(self) -> None:
        with self._lock:
            if self.status != "running":
                return
            target = self._sim0 + (time.monotonic() - self._wall0) * self.speed
            try:
                more = self.replay.advance(target)
                if not more:
                    self.summary = self.replay.finish()
            except Exception as e:   # stop visibly (health turns 503) rather than fail every tick
                log.exception("replay tick failed; the replay is stopped")
                self.error = f"{type(e).__name__}: {e}"
                more = False
                self.status = "error"
            else:
                if not more:
                    self.status = "finished"
            if not more and self.scheduler.get_job(JOB_ID):
                self.scheduler.remove_job(JOB_ID)
            self._publish()

    def command(self, fn):
        """Run `fn()` between ticks (never during one) and publish what it changed."""
        with self._lock:
            result = fn()
        self._publish()
        return result

    def publish(self) -> None:
        """Publish a fresh snapshot now (after a command, so readers see it before the next tick)."""
        self._publish()

    def _publish(self) -> None:
        with self._publish_lock:
            self._seq += 1
            self._snapshot = build_snapshot(self.replay.controller, self.status, self._seq)
