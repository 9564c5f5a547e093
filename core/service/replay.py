"""Replay mode: a trace drives the controller at `speed` x wall time.

On open, a store that already holds a replay is resumed with the settings it was made with (so
a process killed mid-demo continues where it was); `fresh` starts over instead. `restart` loads a
new run in the background; readers see a `loading` snapshot meanwhile."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Optional

from ..controller import Controller
from ..errors import SettingsError
from ..model import Job
from ..replay import Replay, ReplayInputs, ReplaySettings, prepare_jobs
from ..runners import ReplayRunner
from ..schemas import JobSpec
from ..settings import check_speed
from ..store import Store
from .base import Capabilities, Harvester, Unsupported, new_job_id

log = logging.getLogger(__name__)


class ReplayHarvester(Harvester):
    capabilities = Capabilities(can_restart=True, can_set_speed=True)

    def __init__(self, db: Path, settings: ReplaySettings, speed: float = 60.0,
                 tick_s: float = 0.5, fresh: bool = False) -> None:
        super().__init__(db, tick_s, fresh)
        self.settings = settings
        self._speed = float(speed)                 # checked in HarvesterSettings
        self._loading: Optional[threading.Thread] = None

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def replay(self) -> Optional[Replay]:
        runner = self.runner
        return runner.replay if isinstance(runner, ReplayRunner) else None

    def _open(self, fresh: bool, settings: Optional[ReplaySettings] = None) -> None:
        settings = settings or self.settings
        resumable = False
        if self.db.exists():
            store = Store(self.db)
            try:
                saved = store.meta("replay")
                resumable = saved is not None and store.meta("replay_cursor") is not None
                if fresh or (not resumable and not store.is_empty()):
                    store.reset()
                elif resumable:
                    settings = ReplaySettings.from_key(saved)
                    self._speed = check_speed(store.meta("speed", self._speed))
            finally:
                store.close()
        try:
            replay = Replay(settings, self.db, resume=resumable and not fresh)
        except SettingsError as e:
            raise e.within("replay") from None
        replay.checkpoint()
        last = self._last_life(replay.controller.store, resumable and not fresh)
        replay.controller.dispatcher.begin_life(last[0] + 1)
        self._begin_life(replay.controller, last, {"speed": self._speed})
        self.settings = settings
        self._run(ReplayRunner(replay, self._speed, self.tick_s, first_seq=self._seq + 1))

    def _save(self, runner) -> None:
        runner.replay.checkpoint()

    def _job_from(self, spec: JobSpec, owner: str, ctl: Controller) -> Job:
        """A replayed job runs at the curve it is given; with hidden curves (`--curves learned`)
        the allocator does not see it, as for the job set's jobs. A replay that has ended takes
        no more jobs: nothing would ever run them."""
        runner = self.runner
        if runner is not None and runner.status == "finished":
            raise Unsupported("the replay has ended: no job would run any more; staff can restart it or "
                              "start a new run on the Replay page")
        if spec.curve is None:
            raise ValueError("curve: a simulated job runs at the curve it is given; give one "
                             "(only jobs on real workers may leave it to the profiler)")
        curve = spec.curve.to_curve()
        job = Job(id=new_job_id(ctl), min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                  total_samples=spec.total_samples, curve=curve,
                  scale_up_seconds=spec.scale_up_seconds, scale_down_seconds=spec.scale_down_seconds,
                  priority=spec.priority, submit_time=ctl.clock.now(), name=spec.name, owner=owner,
                  true_curve=curve, given_curve=curve)
        prepare_jobs([job], self.settings.curves)
        return job

    def check(self, settings: ReplaySettings) -> None:
        """Raise SettingsError or InputError if a run with these settings would not start (reads
        the trace and the job set; changes nothing)."""
        ReplayInputs.check(settings)

    def restart(self, settings: Optional[ReplaySettings] = None, speed: Optional[float] = None,
                wait: bool = False) -> None:
        """Start a new run (new settings or the same ones) in the background; the old run's
        history is dropped. Readers see a `loading` snapshot meanwhile. New settings are checked
        against the trace and the job set first: a refused run leaves the running one as it was."""
        if speed is not None:
            check_speed(speed)
        if settings is not None:
            self.check(settings)
        with self._lock:
            if self._loading is not None and self._loading.is_alive():
                raise RuntimeError("a replay is already loading")
            self._close_runner()
            if speed is not None:
                self._speed = float(speed)
            target = settings or self.settings

            def load() -> None:
                with self._lock:
                    try:
                        self._open(True, target)
                    except Exception as e:  # shown on the replay page, the old run is gone
                        log.exception("replay failed to start")
                        self.error = str(e)
            self._loading = threading.Thread(target=load, name="replay-load", daemon=True)
            self._loading.start()
        if wait:
            self._loading.join()

    def set_speed(self, speed: float) -> None:
        runner = self._live()
        runner.set_speed(check_speed(speed))
        self._speed = runner.speed
        runner.controller.flush({"speed": self._speed})
