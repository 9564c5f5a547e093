"""What every runner shares: an APScheduler interval job is the only thread that moves the
controller; commands run between ticks (`command`), and readers get the last published Snapshot,
so a web callback never waits on the allocator. Variants say what one tick does (`_advance`) and
what the snapshot shows (`_build`), like APScheduler's BaseScheduler and its BackgroundScheduler.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional, TypeVar

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from ..controller import Controller
from ..snapshot import Snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")
ACTIVE = ("running", "paused")


class Runner:
    """Status runs stopped -> running <-> paused -> stopped | finished | error."""

    job_id = "tick"
    can_set_speed = False

    def __init__(self, controller: Controller, tick_s: float, first_seq: int = 0,
                 scheduler: Optional[BaseScheduler] = None) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be positive")
        self.controller = controller
        self.tick_s = tick_s
        self._own = scheduler is None
        self.scheduler = scheduler or BackgroundScheduler(daemon=True)
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self.status = "stopped"
        self.error: Optional[str] = None
        self._seq = first_seq
        self._snapshot = self._build(first_seq)

    # ---- what a variant says ----------------------------------------------------------------
    def _advance(self) -> bool:
        """One tick's work (under the lock, status running or paused); False when the run is over."""
        raise NotImplementedError

    def _build(self, seq: int) -> Snapshot:
        return self.controller.snapshot(self.status, seq)

    def _on_start(self) -> None:
        """Called under the lock as the run starts."""

    def _on_pause(self) -> None:
        """Called under the lock as a running run pauses."""

    def _on_resume(self) -> None:
        """Called under the lock as a paused run resumes."""

    def _on_stop(self, was_active: bool) -> None:
        """Called under the lock as the run stops (`was_active`: it was running or paused)."""

    # ---- life cycle ---------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def start(self) -> None:
        with self._lock:
            if self.status != "stopped":
                return
            self.status = "running"
            self._on_start()
            self.scheduler.add_job(self._tick, "interval", seconds=self.tick_s, id=self.job_id,
                                   max_instances=1, coalesce=True, replace_existing=True)
            if self._own and not self.scheduler.running:
                self.scheduler.start()
        self._started()
        self._publish()

    def _started(self) -> None:
        """Called after start, outside the lock (a live source starts its threads here)."""

    def pause(self) -> None:
        with self._lock:
            if self.status == "running":
                self.status = "paused"
                self._on_pause()
        self._publish()

    def resume(self) -> None:
        with self._lock:
            if self.status == "paused":
                self.status = "running"
                self._on_resume()
        self._publish()

    def stop(self) -> None:
        """Stop ticking and save where the run stands."""
        with self._lock:
            self._unschedule()
            was_active = self.status in ACTIVE
            if was_active:
                self.status = "stopped"
            self._on_stop(was_active)
        self._stopped()
        if self._own and self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self._publish()

    def _stopped(self) -> None:
        """Called after stop, outside the lock, before the scheduler shuts down."""

    # ---- the tick and commands ----------------------------------------------------------------
    def tick(self) -> None:
        """One step of the loop (also callable directly, e.g. from a test)."""
        self._tick()

    def _tick(self, publish: bool = True) -> None:
        """One step of the run, then (unless `publish` is False) a new snapshot for the web tier."""
        with self._lock:
            if self.status not in self._ticking:
                return
            try:
                more = self._advance()
            except Exception as e:   # stop visibly (health turns 503) rather than fail every tick
                log.exception("tick failed; the run is stopped")
                self.error = f"{type(e).__name__}: {e}"
                self.status = "error"
                more = False
            else:
                if not more:
                    self.status = "finished"
            if not more:
                self._unschedule()
        if publish and self._publish_due():
            self._publish()

    def _publish_due(self) -> bool:
        """Whether a tick's snapshot is worth building (every tick, unless a runner says)."""
        return True

    #: statuses in which a tick does work (a paused replay does nothing; a paused live run
    #: still honours leaves)
    _ticking: tuple[str, ...] = ("running",)

    def _unschedule(self) -> None:
        if self.scheduler.get_job(self.job_id):
            self.scheduler.remove_job(self.job_id)

    def command(self, fn: Callable[[], T]) -> T:
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
            self._snapshot = self._build(self._seq)
