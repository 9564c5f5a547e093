"""Live mode: the controller in wall time. Each tick polls the node source and the dispatcher,
steps the controller when anything changed and flushes the store about once a second.

Pausing freezes the allocator (no node is handed out or taken from a job by choice) while
leaves are still honoured at once: the main scheduler's nodes are never held hostage. A source
that hears of a leave between ticks wakes the loop (`wake`), so the leave does not wait for the
next tick.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from ..controller import Controller
from ..snapshot import Snapshot
from ..sources.base import LiveNodeSource
from .base import ACTIVE, Runner


#: a tick that stepped nothing publishes a snapshot at most this often (describing 10,624 nodes
#: five times a second was most of an idle harvester's CPU)
IDLE_PUBLISH_S = 1.0


class LiveRunner(Runner):
    job_id = "live-tick"
    speed = 1.0
    _ticking = ACTIVE

    def __init__(self, controller: Controller, source: LiveNodeSource, tick_s: float = 0.2,
                 flush_s: float = 1.0, first_seq: int = 0) -> None:
        self.source = source
        self.flush_s = flush_s
        self._last_flush = 0.0
        self._woken = threading.Event()
        self._stepped = True                # a step since the last snapshot
        self._published_at = 0.0            # time.monotonic() of the last snapshot
        self._waker: Optional[threading.Thread] = None
        super().__init__(controller, tick_s, first_seq)

    def _build(self, seq: int) -> Snapshot:
        return self.controller.snapshot(self.status, seq, self.source.status().to_dict(),
                                        {**self.source.node_states(), **self.controller.dispatcher.node_states()})

    def _on_start(self) -> None:
        self._waker = threading.Thread(target=self._wake_loop, name="live-wake", daemon=True)
        self._waker.start()

    def _started(self) -> None:
        self.source.start(wake=self.wake)

    def wake(self) -> None:
        """Tick now, off the scheduler's timer (a source heard of a leave); bursts coalesce."""
        self._woken.set()

    def _wake_loop(self) -> None:
        """Leaves are handled as they come; the snapshot (10,624 nodes described: ~0.3 s) only
        once no more wait, so a storm of leaves is steps back to back, not a step and a
        snapshot each (the timer's ticks publish anyway)."""
        while True:
            self._woken.wait()
            self._woken.clear()
            if self.status not in ACTIVE:
                return
            self._tick(publish=False)
            if not self._woken.is_set():
                self._publish()

    def _publish_due(self) -> bool:
        return self._stepped or time.monotonic() - self._published_at >= IDLE_PUBLISH_S

    def _publish(self) -> None:
        self._stepped, self._published_at = False, time.monotonic()
        super()._publish()

    def _on_pause(self) -> None:
        self.controller.frozen = True

    def _on_resume(self) -> None:
        self.controller.frozen = False
        self.controller.step(force=True)

    def _advance(self) -> bool:
        ctl = self.controller
        now = ctl.clock.now()
        events = self.source.poll(now) + ctl.dispatcher.poll(now)
        if events or ctl.pending or ctl.advisor is not None or ctl.replan_due(now):   # the advisor takes samples
            ctl.step(events)
            self._stepped = True
        self.source.want(*ctl.node_demand())
        if time.monotonic() - self._last_flush >= self.flush_s:
            ctl.flush()
            self._last_flush = time.monotonic()
        return True

    def _on_stop(self, was_active: bool) -> None:
        self.controller.flush()

    def _stopped(self) -> None:
        self._woken.set()
        if self._waker is not None:
            self._waker.join(10)
