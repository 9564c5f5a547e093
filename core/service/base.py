"""The one object a running process is organised around: it owns the store and the runner
that moves the controller. The web app (and any other front end) calls only its commands,
reads the snapshots it publishes and asks its `capabilities`; nothing here knows about HTTP."""
from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from pydantic import ValidationError

from ..admission import DEFAULT_USER_MAX_JOBS, over_quota, too_big
from ..controller import Controller
from ..lifecycle import life_events
from ..model import Job, JobState
from ..quotas import QuotaBook
from ..registrations import Registrations
from ..runners import Runner
from ..schemas import JobSpec, explain
from ..snapshot import Snapshot, empty_snapshot
from ..slots import Slots
from ..store import Store, refuse_foreign
from ..storelock import StoreLock
from ..usage import Totals, UsageReport
from .usage_source import UsageSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """What a front end may offer for this harvester (the rest of the interface is common)."""
    can_restart: bool = False       # start a new run with other settings (`restart`)
    can_set_speed: bool = False     # simulated time at a chosen speed (`set_speed`)
    runs_workers: bool = False      # real workers report progress (`worker_report`, `worker_status`)
    operates_nodes: bool = False    # staff take nodes back and give them again (`reclaim_node`)
    clears_nodes: bool = False      # staff clear a node skipped after failed pilots (`clear_node`)


class Unsupported(RuntimeError):
    """A command this harvester's capabilities do not include."""


class Conflict(Exception):
    """A command the job's state does not allow (HTTP 409): resubmitting a job that neither
    failed nor was cancelled, or one whose checkpoint cannot be copied."""


class Harvester:
    """Variants say how a run opens (`_open`), what a registered job becomes (`_job_from`) and
    how a command's effect is saved (`_save`)."""

    capabilities = Capabilities()

    def __init__(self, db: Path, tick_s: float, fresh: bool = False,
                 lock: Optional[StoreLock] = None, user_max_jobs: int = DEFAULT_USER_MAX_JOBS) -> None:
        """`lock`: the store's lock when the caller took it already (before starting anything that
        acts on the world, e.g. a Slurm source); else `open` takes it. `user_max_jobs`: queued
        plus running jobs one (non-staff) user may have; 0: no limit."""
        self.db = Path(db)
        self.user_max_jobs = user_max_jobs
        self.store_lock = lock or StoreLock(db)
        self.tick_s = tick_s
        self.fresh = fresh
        self.runner: Optional[Runner] = None
        self.error: Optional[str] = None
        self._lock = threading.RLock()
        self._seq = 0
        self._usage = UsageSource(self.db)
        self.registrations = Registrations()     # per-user registrations a minute and a day (core.assemble sets them)
        self._quota_source: Optional[Callable[[], Optional[QuotaBook]]] = None

    # ---- what a variant says ----------------------------------------------------------------
    def _open(self, fresh: bool) -> None:
        """Open or resume the run and start `self.runner`; raises on bad settings."""
        raise NotImplementedError

    def _job_from(self, spec: JobSpec, owner: str, ctl: Controller) -> Job:
        raise NotImplementedError

    def _runs_as(self, spec: JobSpec, staff: bool, unix: str) -> tuple[str, Optional[str]]:
        """The Unix account the job's command runs as, or why it may not run: nothing runs here."""
        return "", None

    def _save(self, runner: Runner) -> None:
        runner.controller.flush()

    # ---- life cycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Load (or resume) the run and start ticking; raises on bad settings."""
        with self._lock:
            self.store_lock.acquire()
            try:
                refuse_foreign(self.db, self.fresh)
                self._open(self.fresh)
            except BaseException:
                self.store_lock.release()
                raise

    @property
    def quota_source(self) -> Optional[Callable[[], Optional[QuotaBook]]]:
        """Where the controller reads its quotas (core.quotas) at every step: the front end's
        users file; None: no quotas."""
        return self._quota_source

    @quota_source.setter
    def quota_source(self, source: Optional[Callable[[], Optional[QuotaBook]]]) -> None:
        self._quota_source = source
        ctl = self.controller
        if ctl is not None:
            with ctl.lock:
                ctl.quota.source = source

    def _run(self, runner: Runner) -> None:
        runner.controller.quota.source = self._quota_source
        self.registrations.seed_once(runner.controller)     # the day's counts survive a restart
        self.runner = runner
        runner.start()
        self.error = None
        self._usage.begin_run(runner.controller.slots)

    @staticmethod
    def _last_life(store: Optional[Store], resumed: bool) -> tuple[int, Optional[bool], Optional[float]]:
        """What the store says of earlier starts: how many, whether the last one stopped cleanly,
        and when it last saved; read before anything starts workers (their logs carry the count)."""
        if store is None or not resumed:
            return 0, None, None
        return store.meta("starts", 0), store.meta("clean_stop"), store.meta("clock")

    def _begin_life(self, ctl: Controller, last: tuple[int, Optional[bool], Optional[float]],
                    meta: Optional[dict] = None) -> None:
        """Log this start (a new run, or a restart after a clean stop or a crash) and count it
        in the store, in the first flush (with `meta`)."""
        starts, clean, saved = last
        active = list(ctl.jobs.live)      # the jobs not ended (ended ones are the store's)
        for ev in life_events(ctl.clock.now(), starts, clean, saved, active):
            ctl.record(ev)
        ctl.flush({**(meta or {}), "starts": starts + 1, "clean_stop": False})

    def _close_runner(self) -> None:
        if self.runner is not None:
            self._seq = self.runner.snapshot.seq
            self.runner.stop()
            ctl = self.runner.controller
            ctl.flush({"clean_stop": True})     # the next start finds a clean stop, not a crash
            w = ctl.writer
            if w is not None and w.problem is not None:
                log.error("stopping with the store failing: %d rows were not saved (%s)", w.unsaved_rows, w.problem)
            store = ctl.store
            if store is not None:
                store.close()
            self._usage.close()
            self.runner = None

    def close(self) -> None:
        with self._lock:
            try:
                self._close_runner()
                self._shutdown()
            finally:
                self.store_lock.release()     # last: nothing of this process acts any more

    def _shutdown(self) -> None:
        """Stop what the variant started besides the runner (its node source, its workers)."""

    # ---- reading ----------------------------------------------------------------------------
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
    def store_problem(self) -> Optional[dict]:
        """While store writes fail (kept in memory and retried every flush): why, since when and
        how many rows wait; None while the store works."""
        w = self.controller.writer if self.controller is not None else None
        if w is None or w.problem is None:
            return None
        return {"state": "failing", "detail": w.problem, "since": w.failing_since, "unsaved_rows": w.unsaved_rows}

    @property
    def speed(self) -> float:
        return 1.0

    @property
    def controller(self) -> Optional[Controller]:
        return self.runner.controller if self.runner else None

    def job(self, job_id: str) -> Optional[Job]:
        ctl = self.controller
        return ctl.job(job_id) if ctl else None

    def profile(self, job_id: str) -> Optional[dict]:
        """What the profiler knows of a job (measured points, fit and band, probes, learned
        costs), or None when the profiler is off or does not know the job."""
        ctl = self.controller
        if ctl is None or ctl.advisor is None:
            return None
        with ctl.lock:
            return ctl.advisor.view(job_id)

    def usage(self, start: Optional[float] = None, end: Optional[float] = None, by: str = "owner",
              accounts: Optional[Mapping[str, str]] = None, series: bool = False) -> UsageReport:
        """Node-seconds, GPU-seconds and samples in [start, end) per owner, job or account, from
        the store's history as of its last flush (so a kill -9 loses nothing that was reported);
        `accounts`: each owner's account (the front end knows the users). ValueError for a `by`
        that is not one of core.usage.BY."""
        return self._usage.report(start, end, by, accounts, getattr(self.controller, "slots", None) or Slots(),
                                  self.snapshot.time, series)

    def usage_totals(self) -> dict[str, Totals]:
        """`usage()` per owner over the whole history, kept up to date (core/usage_tally.py)."""
        return self._usage.totals()

    def worker_status(self, job_id: str) -> Optional[dict]:
        """What a job's real workers say of themselves; None without real workers."""
        return None

    def worker_logs(self, job_id: str, lines: int) -> dict[str, list[str]]:
        """The last `lines` of each of a job's running workers' logs, rank 0's first ({} without)."""
        return {}

    # ---- commands ---------------------------------------------------------------------------
    def _live(self) -> Runner:
        runner = self.runner
        if runner is None:
            raise RuntimeError("the harvester is still loading")
        return runner

    def capacity(self) -> int:
        """The most nodes this harvester can ever offer at once."""
        ctl = self.controller
        return len(ctl.node_names or ctl.idle) if ctl is not None else 0

    def submit(self, spec: JobSpec, owner: str, staff: bool = False, unix: str = "") -> Job:
        """Register a job a person asked for; it is in the store when this returns. ValueError
        ("field: message") for a job that can never run here, an owner over quota, or a command
        its owner may not run. `unix`: the owner's Unix account, where the site maps logins."""
        runner = self._live()
        ctl = runner.controller
        with ctl.lock:
            job = self._vet(spec, owner, staff, unix, ctl)
            self.registrations.admit(owner, staff, lambda: ctl.submit(job, durable=True))
        runner.publish()
        return job

    def _vet(self, spec: JobSpec, owner: str, staff: bool, unix: str, ctl: Controller,
             run_as: Optional[str] = None) -> Job:
        """The job a registration makes (under the controller's lock), or ValueError why none;
        `run_as` given: the account its command runs as, already vetted (a resubmission)."""
        self.registrations.check(owner, staff)     # 429: nothing else is looked at, nothing stored
        refused = None
        if run_as is None:
            run_as, refused = self._runs_as(spec, staff, unix)
        refused = refused or too_big(spec.min_nodes, self.capacity()) or over_quota(
            ctl.active_jobs_of(owner), self.user_max_jobs, staff)
        if refused:
            raise ValueError(refused)
        job = self._job_from(spec, owner, ctl)
        job.run_as = run_as
        return job

    def resubmit(self, job_id: str, user: str, staff: bool = False, unix: str = "") -> Job:
        """Continue a failed or cancelled job as a new one (a new id, its own events, the old
        one's owner) from the old one's last checkpoint and sample count; checked as a new
        registration is (ValueError "field: message"), and in the store when this returns.
        KeyError: no such job; Conflict: it has not failed nor been cancelled, or its checkpoint
        cannot be copied. `user`, `staff`, `unix`: who asks (the front end checks that they are
        its owner or staff); staff resubmitting another's job keep the account it ran as."""
        runner = self._live()
        ctl = runner.controller
        old = ctl.job(job_id)
        if old is None:
            raise KeyError(job_id)
        if old.state not in (JobState.FAILED, JobState.CANCELLED):
            raise Conflict(f"job {job_id} is {old.state.value}: only a failed or cancelled job can be resubmitted")
        spec = spec_of(old)
        with ctl.lock:
            job = self._vet(spec, old.owner, staff, unix, ctl, run_as=None if user == old.owner else old.run_as)
        job.resubmitted_from = old.id
        dispatcher = ctl.dispatcher
        try:      # outside the lock: a large checkpoint's copy must not hold up the controller
            job.samples_done = dispatcher.carry_over(old, job)
        except OSError as e:
            raise Conflict(f"job {job_id}'s checkpoint cannot be copied for its resubmission "
                           f"({e.strerror or e}{': ' + str(e.filename) if getattr(e, 'filename', None) else ''}); "
                           "the harvester's account must be able to read it") from None
        done = job.samples_done
        detail = (f"resubmitted from job {old.id} ({old.state.value}): continues at {done:,.0f} of "
                  f"{job.total_samples:,.0f} samples" + ("" if done else " (it left no checkpoint: from the start)"))
        try:
            with ctl.lock:
                refused = over_quota(ctl.active_jobs_of(old.owner), self.user_max_jobs, staff)
                if refused:
                    raise ValueError(refused)
                self.registrations.admit(old.owner, staff, lambda: ctl.submit(job, durable=True, detail=detail))
        except BaseException:
            dispatcher.forget_carried(job)
            raise
        log.info("job %s resubmitted by %s as job %s, at %.0f of %.0f samples", old.id, user or "?", job.id, done,
                 job.total_samples)
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
            self._save(runner)
        runner.command(do)
        return job

    def pause(self) -> None:
        self._live().pause()

    def resume(self) -> None:
        self._live().resume()

    # ---- commands some harvesters have (see `capabilities`) --------------------------------
    def restart(self, settings=None, speed: Optional[float] = None, wait: bool = False) -> None:
        """Start a new run in the background (`can_restart`)."""
        raise Unsupported("this harvester runs live: there is no replay to restart")

    def set_speed(self, speed: float) -> None:
        """Simulated seconds per wall second (`can_set_speed`)."""
        raise Unsupported("live mode runs at wall-clock speed")

    def worker_report(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        """A progress report from a job's workers (`runs_workers`): an HTTP status."""
        raise Unsupported("this server runs no workers")

    def reclaim_node(self, node: str) -> None:
        """Staff play the node owner: take `node` back (`operates_nodes`); KeyError if unknown."""
        raise Unsupported("this server's node source is not operated by hand")

    def release_node(self, node: str) -> None:
        """Staff give `node` again (`operates_nodes`); KeyError if unknown."""
        raise Unsupported("this server's node source is not operated by hand")

    def clear_node(self, node: str) -> bool:
        """Staff clear a node skipped after failures (`clears_nodes`): whether it was skipped;
        KeyError if unknown."""
        raise Unsupported("this server's node source skips no node after failures")


def spec_of(job: Job) -> JobSpec:
    """The registration that makes `job` again (its resubmission), checked by the rules every
    registration is; ValueError ("field: message") for one they refuse now."""
    fields: dict = {"name": job.name or job.id, "min_nodes": job.min_nodes, "max_nodes": job.max_nodes,
                    "total_samples": job.total_samples, "scale_up_seconds": job.scale_up_seconds,
                    "scale_down_seconds": job.scale_down_seconds, "priority": job.priority,
                    "launcher": job.launcher, "progress_pattern": job.progress_pattern,
                    "stop_grace_seconds": job.stop_grace_seconds, "samples_per_step": job.samples_per_step}
    curve = job.given_curve or job.true_curve
    if curve is not None:
        fields["curve"] = curve.to_dict()
    if job.command:
        fields["command"] = list(job.command)
    if job.global_batch:
        fields["global_batch"] = job.global_batch
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as e:
        raise ValueError(explain(e)) from None


def new_job_id(ctl: Controller) -> str:
    while True:
        job_id = "u-" + secrets.token_hex(4)
        if ctl.job(job_id) is None:
            return job_id
