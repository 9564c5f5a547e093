"""The one object a running process is organised around: it owns the store, the replay and
the runner that ticks it. The web app (and any other front end) only calls its commands and
reads the snapshots it publishes; nothing here knows about HTTP."""
from __future__ import annotations

import logging
import secrets
import threading
from pathlib import Path
from typing import Optional

from .clock import WallClock
from .controller import Controller, ControllerConfig
from .dispatchers.base import Dispatcher
from .live import LiveRunner
from .jpa import JPA, JPAConfig
from .model import Curve, Event, EventKind, Job, JobState
from .sources.base import LiveNodeSource
from .replay import Replay, ReplaySettings, prepare_jobs
from .runner import ReplayRunner
from .schemas import JobSpec
from .snapshot import Snapshot, empty_snapshot
from .store import Store

log = logging.getLogger(__name__)

SPEED_MIN, SPEED_MAX = 1.0, 3600.0


class Harvester:
    mode = "replay"
    """Replay mode: the Summit trace (or any trace) drives the controller at `speed` x wall time.

    On start, a store that already holds a replay is resumed with the settings it was made with
    (so a process killed mid-demo continues where it was); `fresh` starts over instead.
    """

    def __init__(self, db: Path, settings: ReplaySettings, speed: float = 60.0,
                 tick_s: float = 0.5, fresh: bool = False) -> None:
        self.db = Path(db)
        self.settings = settings
        self.speed = check_speed(speed)
        self.tick_s = tick_s
        self.fresh = fresh
        self.runner: Optional[ReplayRunner] = None
        self.error: Optional[str] = None
        self._lock = threading.RLock()
        self._seq = 0
        self._loading: Optional[threading.Thread] = None

    # ---- life cycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Load (or resume) the replay and start ticking; raises on bad settings."""
        with self._lock:
            self._open(self.settings, self.fresh)

    def _open(self, settings: ReplaySettings, fresh: bool) -> None:
        if not self.db.exists():
            replay = Replay(settings, self.db)
            self._start(replay, settings)
            return
        store = Store(self.db)
        try:
            saved = store.meta("replay")
            resumable = saved is not None and store.meta("replay_cursor") is not None
            if fresh or (not resumable and not store.is_empty()):
                store.reset()
            elif resumable:
                settings = ReplaySettings.from_key(saved)
                self.speed = check_speed(store.meta("speed", self.speed))
        finally:
            store.close()
        replay = Replay(settings, self.db, resume=resumable and not fresh)
        self._start(replay, settings)

    def _start(self, replay, settings) -> None:
        replay.checkpoint()
        replay.controller.flush({"speed": self.speed})
        self.settings = settings
        self.runner = ReplayRunner(replay, self.speed, self.tick_s, first_seq=self._seq + 1)
        self.runner.start()
        self.error = None

    def restart(self, settings: Optional[ReplaySettings] = None, speed: Optional[float] = None,
                wait: bool = False) -> None:
        """Start a new run (new settings or the same ones) in the background; the old run's
        history is dropped. Readers see a `loading` snapshot meanwhile."""
        if speed is not None:
            check_speed(speed)
        with self._lock:
            if self._loading is not None and self._loading.is_alive():
                raise RuntimeError("a replay is already loading")
            self._close_runner()
            if speed is not None:
                self.speed = float(speed)
            target = settings or self.settings

            def load() -> None:
                with self._lock:
                    try:
                        self._open(target, fresh=True)
                    except Exception as e:  # shown on the replay page, the old run is gone
                        log.exception("replay failed to start")
                        self.error = str(e)
            self._loading = threading.Thread(target=load, name="replay-load", daemon=True)
            self._loading.start()
        if wait:
            self._loading.join()

    def _close_runner(self) -> None:
        if self.runner is not None:
            self._seq = self.runner.snapshot.seq
            self.runner.stop()
            store = self.runner.controller.store
            if store is not None:
                store.close()
            self.runner = None

    def close(self) -> None:
        with self._lock:
            self._close_runner()

    # ---- reading --------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        runner = self.runner
        if runner is None:
            return empty_snapshot("error" if self.error else "loading", self._seq)
        return runner.snapshot

    @property
    def problem(self) -> Optional[str]:
        """What stopped the harvester, if anything did (shown by /api/health and the pages)."""
        return self.error or (self.runner.error if self.runner else None)

    @property
    def replay(self) -> Optional[Replay]:
        return self.runner.replay if self.runner else None

    @property
    def controller(self):
        return self.runner.controller if self.runner else None

    def job(self, job_id: str) -> Optional[Job]:
        ctl = self.controller
        return ctl.job(job_id) if ctl else None

    # ---- commands -------------------------------------------------------------------------
    def _live(self) -> ReplayRunner:
        runner = self.runner
        if runner is None:
            raise RuntimeError("the replay is still loading")
        return runner

    def _job_from(self, spec: JobSpec, owner: str, ctl) -> Job:
        """A replayed job runs at the curve it is given; with hidden curves (`--curves learned`)
        the allocator does not see it, as for the job set's jobs."""
        if spec.curve is None:
            raise ValueError("curve: a simulated job runs at the curve it is given; give one "
                             "(only jobs on real workers may leave it to the profiler)")
        curve = spec.curve.to_curve()
        job = Job(id=new_job_id(ctl), min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                  total_samples=spec.total_samples, curve=curve,
                  scale_up_seconds=spec.scale_up_seconds, scale_down_seconds=spec.scale_down_seconds,
                  priority=spec.priority, submit_time=ctl.clock.now(), name=spec.name, owner=owner,
                  true_curve=curve, given_curve=curve)
        if self.settings is not None:
            prepare_jobs([job], self.settings.curves)
        return job

    def profile(self, job_id: str) -> Optional[dict]:
        """What the profiler knows of a job (measured points, fit and band, probes, learned
        costs), or None when the profiler is off or does not know the job."""
        ctl = self.controller
        if ctl is None or ctl.advisor is None:
            return None
        with ctl.lock:
            return ctl.advisor.view(job_id)

    def submit(self, spec: JobSpec, owner: str) -> Job:
        """Register a job a person asked for; it is in the store when this returns."""
        runner = self._live()
        ctl = runner.controller
        with ctl.lock:
            job = self._job_from(spec, owner, ctl)
            ctl.submit(job, durable=True)
        runner.publish()
        return job

    def cancel(self, job_id: str) -> Job:
        runner = self._live()
        ctl = runner.controller
        job = ctl.job(job_id)
        if job is None:
            raise KeyError(job_id)

        def do() -> None:
            if job.state.finished:
                raise ValueError(f"job {job_id} has already ended ({job.state.value})")
            ctl.cancel(job_id, durable=True)
            ctl.step()    # between ticks (runner lock held): the cancellation takes effect at once
            self._checkpoint(runner)
        runner.command(do)
        return job

    def _checkpoint(self, runner) -> None:
        runner.replay.checkpoint()

    def pause(self) -> None:
        self._live().pause()

    def resume(self) -> None:
        self._live().resume()

    def set_speed(self, speed: float) -> None:
        runner = self._live()
        runner.set_speed(check_speed(speed))
        self.speed = runner.speed
        runner.controller.flush({"speed": self.speed})


class LiveHarvester(Harvester):
    """Live mode: a live node source and a dispatcher that runs real (or simulated) workers, in
    wall time. The store keeps jobs and history; restarted with the same store, jobs that were
    running are taken up again on the nodes the source offers now."""

    mode = "live"

    def __init__(self, db: Path, source: LiveNodeSource, dispatcher: Dispatcher,
                 config: Optional[ControllerConfig] = None, tick_s: float = 0.2,
                 fresh: bool = False, require_command: bool = False,
                 jpa: Optional[JPAConfig] = None) -> None:
        super().__init__(db, None, speed=1.0, tick_s=tick_s, fresh=fresh)
        self.source = source
        self.dispatcher = dispatcher
        self.config = config or ControllerConfig()
        self.require_command = require_command
        self.jpa = jpa                  # the profiler's settings; None: curves are taken as given

    def _open(self, settings, fresh: bool) -> None:
        store = Store(self.db)
        if fresh or (not store.is_empty() and store.meta("live") is None):
            store.reset()
        clock = WallClock()
        names = self.source.node_names()
        idle = self.source.initial_idle()
        advisor = JPA(self.jpa) if self.jpa is not None else None
        if store.meta("live") is not None:
            ctl = Controller.restore(store, self.dispatcher, clock, self.config, names, advisor=advisor)
            known = set(ctl.idle)
            for n in known - set(idle):
                ctl.post(Event(clock.now(), EventKind.NODE_LEAVE, node=n))
            for n in idle:
                if n not in known:
                    ctl.post(Event(clock.now(), EventKind.NODE_JOIN, node=n))
        else:
            ctl = Controller(self.dispatcher, clock, self.config, store, names, advisor=advisor)
            ctl.start(idle)
        ctl.flush({"live": {"source": self.source.name, "dispatcher": self.dispatcher.name}})
        self.runner = LiveRunner(ctl, self.source, self.tick_s, first_seq=self._seq + 1)
        self.runner.start()
        self.error = None

    def restart(self, settings=None, speed=None, wait: bool = False) -> None:
        raise RuntimeError("live mode has no replay to restart")

    def set_speed(self, speed: float) -> None:
        raise ValueError("live mode runs at wall-clock speed")

    def _checkpoint(self, runner) -> None:
        runner.controller.flush()

    def _job_from(self, spec: JobSpec, owner: str, ctl) -> Job:
        """On real workers the curve is optional: given, it is the profiler's prior; left out,
        the profiler learns it from scratch. Simulated workers run at the curve given."""
        if self.require_command and not spec.command:
            raise ValueError("command: a job on real workers needs the command to run on each node")
        if spec.command and not spec.global_batch:
            raise ValueError("global_batch: give the samples per step of the command")
        if spec.curve is None and not (self.require_command and ctl.advisor is not None):
            raise ValueError("curve: give the job's throughput curve (simulated workers run at it)"
                             if not self.require_command else
                             "curve: give the job's throughput curve (the profiler is off)")
        given = spec.curve.to_curve() if spec.curve is not None else None
        job = Job(id=new_job_id(ctl), min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                  total_samples=spec.total_samples, curve=given or Curve((spec.min_nodes,), (0.0,)),
                  scale_up_seconds=spec.scale_up_seconds, scale_down_seconds=spec.scale_down_seconds,
                  priority=spec.priority, submit_time=ctl.clock.now(), name=spec.name, owner=owner,
                  true_curve=None if self.require_command else given, given_curve=given,
                  command=tuple(spec.command or ()), global_batch=spec.global_batch or 0)
        return job

    def close(self) -> None:
        super().close()
        self.source.close()
        close = getattr(self.dispatcher, "close", None)
        if close:
            close()


def check_speed(speed: float) -> float:
    speed = float(speed)
    if not SPEED_MIN <= speed <= SPEED_MAX:
        raise ValueError(f"speed must be between {SPEED_MIN:g}x and {SPEED_MAX:g}x")
    return speed


def new_job_id(ctl) -> str:
    while True:
        job_id = "u-" + secrets.token_hex(4)
        if ctl.job(job_id) is None:
            return job_id


__all__ = ["Harvester", "LiveHarvester", "JobState", "SPEED_MIN", "SPEED_MAX", "check_speed"]
