"""Live mode: a live node source and a dispatcher that runs real (or simulated) workers, in
wall time. The store keeps jobs and history; restarted with the same store, jobs that were
running are taken up again on the nodes the source offers now."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..admission import runs_as
from ..clock import WallClock
from ..controller import Controller
from ..controller_config import ControllerConfig
from ..restore import restore
from ..dispatchers.base import Dispatcher
from ..jpa import JPA, JPAConfig
from ..model import LAUNCHER_TORCHRUN, RESTART_COST_PRIOR_S, Curve, Event, EventKind, Job
from ..runners import LiveRunner
from ..schemas import JobSpec
from ..slots import Slots
from ..sources.base import LiveNodeSource
from ..store import Store
from ..storelock import StoreLock
from ..worklogs import job_logs as logs_on_disk
from .base import Capabilities, Harvester, new_job_id

#: seconds between live timeline points when nothing changes (every change is a point of its own)
LIVE_TIMELINE_EVERY_S = 5.0


class LiveHarvester(Harvester):
    def __init__(self, db: Path, source: LiveNodeSource, dispatcher: Dispatcher,
                 config: Optional[ControllerConfig] = None, tick_s: float = 0.2,
                 fresh: bool = False, require_command: bool = False,
                 jpa: Optional[JPAConfig] = None, slots: Optional[Mapping[str, int]] = None,
                 lock: Optional[StoreLock] = None, maps_users: bool = False,
                 trust_user_commands: bool = False, preflight: Optional[Callable[[], object]] = None) -> None:
        """`slots`: ranks (GPUs) per node from the node list (missing: 1), for the pages, the API
        and /metrics. `maps_users`: the dispatcher runs a job as its owner's Unix account (a site
        launcher); `trust_user_commands`: any login's command may run as the harvester itself.
        `preflight`: run at `open()`, before the first idle nodes are read (the nodes' checks)."""
        super().__init__(db, tick_s, fresh, lock)
        self.source = source
        self.dispatcher = dispatcher
        self.config = config or ControllerConfig()
        self.require_command = require_command
        self.maps_users = maps_users
        self.trust_user_commands = trust_user_commands
        self.preflight = preflight
        self.jpa = jpa                  # the profiler's settings; None: curves are taken as given
        self.slots = Slots(slots)
        self.capabilities = Capabilities(runs_workers=dispatcher.takes_reports,
                                         operates_nodes=source.operated_by_hand,
                                         clears_nodes=source.clears_failures or dispatcher.holds_nodes_out)

    def _open(self, fresh: bool) -> None:
        store = Store(self.db)
        if fresh or (not store.is_empty() and store.meta("live") is None):
            store.reset()
        clock = WallClock()
        if self.preflight is not None:
            self.preflight()
        names = self.source.node_names()
        idle = self.source.initial_idle()
        advisor = JPA(self.jpa) if self.jpa is not None else None
        resumed = store.meta("live") is not None
        last = self._last_life(store, resumed)
        self.dispatcher.begin_life(last[0] + 1)
        if resumed:
            ctl = restore(store, self.dispatcher, clock, self.config, names, advisor=advisor, slots=self.slots)
            known = set(ctl.idle)
            for n in known - set(idle):
                ctl.post(Event(clock.now(), EventKind.NODE_LEAVE, node=n))
            for n in idle:
                if n not in known:
                    ctl.post(Event(clock.now(), EventKind.NODE_JOIN, node=n))
        else:
            ctl = Controller(self.dispatcher, clock, self.config, store, names, advisor=advisor, slots=self.slots)
            ctl.start(idle)
        ctl.timeline.every, ctl.timeline.on_change = LIVE_TIMELINE_EVERY_S, True   # charts follow every rescale
        self._begin_life(ctl, last, {"live": {"source": self.source.name, "dispatcher": self.dispatcher.name}})
        self._run(LiveRunner(ctl, self.source, self.tick_s, first_seq=self._seq + 1))

    def _job_from(self, spec: JobSpec, owner: str, ctl: Controller) -> Job:
        """On real workers the curve is optional: given, it is the profiler's prior; left out,
        the profiler learns it from scratch. Simulated workers run at the curve given."""
        if self.require_command and not spec.command:
            raise ValueError("command: a job on real workers needs the command to run on each node")
        torchrun = spec.launcher == LAUNCHER_TORCHRUN
        if torchrun and not spec.command:
            raise ValueError("command: a torchrun job needs the command each rank runs")
        if spec.command and not spec.global_batch and not torchrun:
            raise ValueError("global_batch: give the samples per step of the command")
        if spec.curve is None and not (self.require_command and ctl.advisor is not None):
            raise ValueError("curve: give the job's throughput curve (simulated workers run at it)"
                             if not self.require_command else
                             "curve: give the job's throughput curve (the profiler is off)")
        given = spec.curve.to_curve() if spec.curve is not None else None
        told = spec.model_fields_set       # a restart's cost is a prior until measured
        up = spec.scale_up_seconds if not torchrun or "scale_up_seconds" in told else RESTART_COST_PRIOR_S
        down = spec.scale_down_seconds if not torchrun or "scale_down_seconds" in told else RESTART_COST_PRIOR_S
        return Job(id=new_job_id(ctl), min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                   total_samples=spec.total_samples, curve=given or Curve((spec.min_nodes,), (0.0,)),
                   scale_up_seconds=up, scale_down_seconds=down,
                   priority=spec.priority, submit_time=ctl.clock.now(), name=spec.name, owner=owner,
                   true_curve=None if self.require_command else given, given_curve=given,
                   command=tuple(spec.command or ()), global_batch=spec.global_batch or 0,
                   launcher=spec.launcher, progress_pattern=spec.progress_pattern,
                   stop_grace_seconds=spec.stop_grace_seconds, samples_per_step=spec.samples_per_step)

    def _runs_as(self, spec: JobSpec, staff: bool, unix: str) -> tuple[str, Optional[str]]:
        """Only real workers run commands (simulated ones only count the command's samples)."""
        return runs_as(bool(spec.command) and self.require_command, unix, self.maps_users, staff,
                       self.trust_user_commands)

    def worker_status(self, job_id: str) -> Optional[dict]:
        return self.dispatcher.status(job_id)

    def worker_logs(self, job_id: str, lines: int) -> dict[str, list[str]]:
        """The running workers' logs; once they are gone (the job ended, a restart), the newest
        log file of each worker on disk, in its last generation's rank order."""
        logs = self.dispatcher.logs(job_id, lines)
        logdir = getattr(self.dispatcher, "logdir", None)
        if logs or logdir is None:
            return logs
        job = self.job(job_id)
        gens = ((job.story or {}).get("generations") or [{}]) if job is not None else [{}]
        return logs_on_disk(logdir, job_id, lines, gens[-1].get("members") if isinstance(gens[-1], dict) else None)

    def worker_report(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        if not self.capabilities.runs_workers:
            return super().worker_report(job_id, authorization, body)
        return self.dispatcher.accept_report(job_id, authorization, body)

    def reclaim_node(self, node: str) -> None:
        if not self.capabilities.operates_nodes:
            super().reclaim_node(node)
        self.source.reclaim(node, time.time())

    def release_node(self, node: str) -> None:
        if not self.capabilities.operates_nodes:
            super().release_node(node)
        self.source.release(node, time.time())

    def clear_node(self, node: str) -> bool:
        """A node held out by the dispatcher (lost for a reason of its own) or skipped by the
        source (failed pilots): either is offered again."""
        if not self.capabilities.clears_nodes:
            return super().clear_node(node)
        if node not in self.source.node_names():
            raise KeyError(node)
        cleared = self.dispatcher.clear_node(node)
        if self.source.clears_failures:
            cleared = self.source.clear(node) or cleared
        return cleared

    def _shutdown(self) -> None:
        self.source.close()
        self.dispatcher.close()
