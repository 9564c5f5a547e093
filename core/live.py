"""Live mode: the controller in wall time. An APScheduler interval job polls the node source
and the dispatcher, steps the controller when anything changed, flushes the store about once a
second and publishes a snapshot; commands from the web run between ticks (`command`).

Pausing freezes the allocator (no node is handed out or taken from a job by choice) while
leaves are still honoured at once: the main scheduler's nodes are never held hostage. A source
that hears of a leave between ticks wakes the loop (`wake`), so the leave does not wait for the
next tick.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, TypeVar

from apscheduler.schedulers.background import BackgroundScheduler

from .controller import Controller
from .snapshot import Snapshot, build_snapshot
from .sources.base import LiveNodeSource

log = logging.getLogger(__name__)
JOB_ID = "live-tick"
T = TypeVar("T")


class LiveRunner:
    speed = 1.0

    def __init__(self, controller: Controller, source: LiveNodeSource, tick_s: float = 0.2,
                 flush_s: float = 1.0, first_seq: int = 0) -> None:
        self.controller = controller
        self.source = source
        self.tick_s = tick_s
        self.flush_s = flush_s
        self.scheduler = BackgroundScheduler(daemon=True)
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self.status = "stopped"
        self.error: Optional[str] = None
        self._seq = first_seq
        self._last_flush = 0.0
        self._woken = threading.Event()
        self._waker: Optional[threading.Thread] = None
        self._snapshot = self._build(first_seq)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def start(self) -> None:
        with self._lock:
            if self.status != "stopped":
                return
            self.status = "running"
            self.scheduler.add_job(self._tick, "interval", seconds=self.tick_s, id=JOB_ID,
                                   max_instances=1, coalesce=True, replace_existing=True)
            self.scheduler.start()
            self._waker = threading.Thread(target=self._wake_loop, name="live-wake", daemon=True)
            self._waker.start()
        self.source.start(wake=self.wake)
        self._publish()

    def wake(self) -> None:
        """Tick now, off the scheduler's timer (a source heard of a leave); bursts coalesce."""
        self._woken.set()

    def _wake_loop(self) -> None:
        while True:
            self._woken.wait()
            self._woken.clear()
            if self.status not in ("running", "paused"):
                return
            self._tick()

    def pause(self) -> None:
        with self._lock:
            if self.status == "running":
                self.status = "paused"
                self.controller.frozen = True
        self._publish()

    def resume(self) -> None:
        with self._lock:
            if self.status == "paused":
                self.status = "running"
                self.controller.frozen = False
                self.controller.step(force=True)
        self._publish()

    def set_speed(self, speed: float) -> None:
        raise ValueError("live mode runs at wall-clock speed")

    def command(self, fn: Callable[[], T]) -> T:
        with self._lock:
            result = fn()
        self._publish()
        return result

    def publish(self) -> None:
        self._publish()

    def tick(self) -> None:
        self._tick()

    def _tick(self) -> None:
        with self._lock:
            if self.status not in ("running", "paused"):
                return
            ctl = self.controller
            try:
                now = ctl.clock.now()
                events = self.source.poll(now) + ctl.dispatcher.poll(now)
                if events or ctl.pending or ctl.advisor is not None:   # the advisor takes samples
                    ctl.step(events)
                if time.monotonic() - self._last_flush >= self.flush_s:
                    ctl.flush()
                    self._last_flush = time.monotonic()
            except Exception as e:
                log.exception("live tick failed; the harvester is stopped")
                self.error = f"{type(e).__name__}: {e}"
                self.status = "error"
                if self.scheduler.get_job(JOB_ID):
                    self.scheduler.remove_job(JOB_ID)
        self._publish()

    def stop(self) -> None:
        with self._lock:
            if self.scheduler.get_job(JOB_ID):
                self.scheduler.remove_job(JOB_ID)
            if self.status in ("running", "paused"):
                self.status = "stopped"
            self.controller.flush()
        self._woken.set()
        if self._waker is not None:
            self._waker.join(10)
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self._publish()

    def _publish(self) -> None:
        with self._publish_lock:
            self._seq += 1
            self._snapshot = self._build(self._seq)

    def _build(self, seq: int) -> Snapshot:
        return build_snapshot(self.controller, self.status, seq, self.source.status().to_dict(),
                              self.source.node_states())
