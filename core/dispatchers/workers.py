"""Real training: one worker process per slot (GPU) of each node, started through a transport
(local processes, ssh, or a Slurm pilot), membership changes through the job's coordinator (the
processes stay up; only the process group is rebuilt, see core/runtime/coordinator.py). The node
stays the unit: a node's ranks come and go together (core/runtime/ranks.py).

Policy stays in the controller. This module only turns "job J runs on exactly these nodes now"
into actions, without ever blocking the controller thread on a node: starting and stopping
processes and liveness checks run on a small thread pool, and what they find comes back as
events through `poll()`:
  - grow: start workers on the added nodes (they import torch and build the model while the job
    keeps training), the coordinator regroups once they are warm;
  - shrink: regroup without the leaving nodes first, then dismiss them (clean exit);
  - vacate (the main scheduler took a node): regroup without it and SIGTERM it at once,
    SIGKILL after `vacate_grace_s`;
  - a worker that dies, or a node ssh cannot reach: the node is lost with all its ranks (one
    regroup; its other ranks are stopped) (a NODE_LEAVE, cause `lost`). Whose fault it was
    decides what follows (blame.py): a node that did not answer twice in a row (and whose
    workers' heartbeats stopped), went silent or was killed from outside is held out until a
    check of it passes (node_health.py), and never counts against the job; a job's own error
    offers the node again after `rejoin_after_s`, and fails the job only when it comes from
    every node it held, or follows it across `max_crashes` distinct nodes (failure named, core/
    failures.py). Before the job's first step a set-up error fails it at once, and a job that
    holds nodes without a step for `start_timeout_s` fails (health.py). Not so on a node the
    transport says its owner took back (a preempted Slurm pilot): the node source's own leave
    accounts for that worker.
It also measures for the profiler (metering.py), and adopts the workers that outlived an
earlier harvester run (adoption.py).
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .. import failures
from ..crashes import DEFAULT_CRASH_WINDOW_S, note_loss
from ..failures import Failure
from ..model import LAUNCHER_TORCHRUN, LEFT_LOST, Event, EventKind, Job
from ..runtime import ranks
from ..runtime.coordinator import JobCoordinator
from ..runtime.reports import ReportBook
from ..transports.base import STOP_KILL, STOP_LOST, Handle, NodeSpec, StartError, Transport, TransportError
from ..transports.cleanup import ENV_MARK, new_mark
from ..transports.runas import RunAs
from . import adoption, carryover, folders, node_checks
from .base import Dispatcher
from .blame import JobFaults, consequence, node_caused
from .health import Health, stalled_failure, story_of
from .limits import JobLimits, LimitWatch, Watched
from .metering import Meter
from .node_health import NodeHealth
from .restarts import RestartJobs, checkpoint_dir

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent.parent
ENV_CHECKPOINT_DIR = "HARVEST_CHECKPOINT_DIR"
HISTORY = 10                 # generations a job's status shows
#: a node is lost for not answering only after this many liveness checks in a row went unanswered
#: (and, for a runtime job, none of its workers' heartbeats came within UNANSWERED_HEARD_S)
UNANSWERED_CHECKS = 2
UNANSWERED_HEARD_S = 2.0


@dataclass
class _Run:
    job: Job
    coord: JobCoordinator
    target: list[str] = field(default_factory=list)
    handles: dict[str, Handle] = field(default_factory=dict)     # worker key -> its process
    incarnation: dict[str, int] = field(default_factory=dict)   # worker key -> its current one's
    ended: bool = False
    last_tail: list[str] = field(default_factory=list)
    meter: Meter = field(default_factory=Meter)       # the profiler's samples from its status
    health: Health = field(default_factory=Health)   # what its coordinator's status has said
    adopt_until: Optional[float] = None   # monotonic: after a restart, waiting for its workers to rejoin


class WorkerDispatcher(Dispatcher):
    def __init__(self, transport: Transport, nodes: Sequence[NodeSpec], logdir: Path,
                 report_base: Optional[str] = None, workdir: str = "", pythonpath: Optional[str] = str(ROOT),
                 coordinator_host: str = "127.0.0.1", coordinator_bind: Optional[str] = None,
                 worker_env: Sequence[str] = (), stop_grace_s: float = 5.0,
                 vacate_grace_s: float = 1.0, max_crashes: int = 3, rejoin_after_s: float = 5.0,
                 alive_every_s: float = 0.5, pg_timeout_s: float = 10.0, sample_s: float = 5.0,
                 crash_window_s: float = DEFAULT_CRASH_WINDOW_S, heartbeat_timeout_s: float = 15.0,
                 run_as: Optional[RunAs] = None, orphan_s: float = 0.0, adopt_s: float = 30.0,
                 start_timeout_s: float = 300.0, rendezvous_timeout_s: float = 60.0,
                 limits: JobLimits = JobLimits()) -> None:
        """A job fails when `max_crashes` of its workers are lost within `crash_window_s`; a worker
        whose heartbeat stops for `heartbeat_timeout_s` is lost (and its node taken out) too.
        `run_as`: the site's launcher, before the argv of a job that runs as its owner's account.
        `orphan_s` > 0 (workers that outlive the harvester: Slurm pilots): a worker that loses its
        job's store trains on and redials it that long, and after a restart each job's workers
        are waited for `adopt_s` to rejoin a coordinator on the same port, with the same secret.
        A job that holds nodes and commits no step for `start_timeout_s` fails, with its reason;
        a torchrun generation whose ranks form no group within `rendezvous_timeout_s` too (restarts.py);
        one over a cap of `limits` too (limits.py)."""
        self.transport = transport
        self.name = transport.name
        self.specs = {n.name: n for n in nodes}
        self.logdir = Path(logdir).resolve()
        folders.prepare(self.logdir, run_as is not None)
        self.report_base = report_base.rstrip("/") if report_base else None
        self.workdir = workdir
        self.pythonpath = pythonpath
        self.coordinator_host = coordinator_host      # the address workers dial for the job's store
        self.coordinator_bind = coordinator_bind      # where the store listens (None: torch's default)
        self.worker_env = tuple(worker_env)           # names of this process's variables workers get
        self.stop_grace_s, self.vacate_grace_s = stop_grace_s, vacate_grace_s
        self.max_crashes, self.rejoin_after_s = max_crashes, rejoin_after_s
        self.crash_window_s, self.heartbeat_timeout_s = crash_window_s, heartbeat_timeout_s
        self.run_as, self.orphan_s, self.adopt_s = run_as, orphan_s, adopt_s
        self.start_timeout_s = start_timeout_s
        self.interfaces: dict[str, str] = {}   # node -> the interface that reaches the head (its check's)
        self.life = 1                 # the harvester's start number (begin_life), in every log's name
        self.alive_every_s = alive_every_s
        self.pg_timeout_s = pg_timeout_s
        self.sample_s = sample_s
        self.book = ReportBook()
        self._runs: dict[str, _Run] = {}
        self._events: list[Event] = []
        self._rejoin: list[tuple[float, str]] = []
        self.node_health = NodeHealth()       # nodes held out for reasons of their own (blame.py)
        self.checks_nodes = self.holds_nodes_out = type(transport).run is not Transport.run   # it can tell when one is back
        self._faults: dict[str, JobFaults] = {}     # job -> its own errors, by node
        self._unanswered: dict[str, int] = {}      # node -> liveness checks unanswered in a row
        self._store_downs: dict[str, list[float]] = {}   # job -> when its store process ended
        self._reviving: dict[str, list[str]] = {}        # job -> nodes it starts again on (`_revive`)
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="dispatch")
        self._checking = False
        self._last_check = 0.0
        self.restarts = RestartJobs(transport, self.specs, self.logdir, self.launch, self._base_env,
                                    self._pool.submit, self._post, self._restart_lost, sample_s=sample_s,
                                    start_timeout_s=start_timeout_s, interfaces=self.interfaces,
                                    rendezvous_timeout_s=rendezvous_timeout_s)
        self.limits = LimitWatch(transport, limits, self._pool.submit, self._limited)

    # ---- what the controller asks ---------------------------------------------------------
    def resize(self, job: Job, nodes: Sequence[str], now: float) -> None:
        if job.launcher == LAUNCHER_TORCHRUN:
            unknown = [n for n in nodes if n not in self.specs]
            if unknown:
                raise ValueError(f"node {unknown[0]} is not in the inventory")
            return self.restarts.resize(job, nodes, now)
        with self._lock:
            run = self._run(job)
            want = list(nodes)
            if run.adopt_until is not None:
                run.target = want          # applied once its workers rejoined (`_adoption_over`)
                return
            old = run.target
            removed = [n for n in old if n not in want]
            added = [n for n in want if n not in old]
            unknown = [n for n in added if n not in self.specs]
            if unknown:
                raise ValueError(f"node {unknown[0]} is not in the inventory")
            run.target = want
            survivors = [n for n in want if n in old]
            order = self._keys(survivors + added)
            for n in added:
                self._start(run, n, order)
            run.coord.regroup(order)
            for n in removed:
                for key in self._keys([n]):
                    run.coord.dismiss(key, incarnation=run.incarnation.get(key))
                self._retire(run, n, self.stop_grace_s, wait_exit_s=self.pg_timeout_s + 5)

    def resume(self, job: Job, nodes: Sequence[str], now: float) -> None:
        """Workers that outlive the harvester (`orphan_s`) are adopted: the job's coordinator
        comes back on its old port with its old secret, its workers rejoin it from memory (the
        generation they run goes on), and only the nodes none rejoins from within `adopt_s`
        get new workers. Otherwise, or when the old port cannot be had, it starts again."""
        kept = adoption.load_kept(self.logdir, job.id) if self.orphan_s > 0 and job.launcher != LAUNCHER_TORCHRUN else None
        if kept is None:
            return self.resize(job, nodes, now)
        with self._lock:
            try:
                run = self._run(job, kept)
            except (OSError, RuntimeError) as e:       # the port is taken: start it again
                log.warning("job %s: cannot serve its store on port %s again (%s): its workers "
                            "cannot rejoin, new ones start", job.id, kept.get("port"), e)
                adoption.kept_path(self.logdir, job.id).unlink(missing_ok=True)
                return self.resize(job, nodes, now)
            run.target = [n for n in nodes if n in self.specs]
            run.adopt_until = time.monotonic() + self.adopt_s

    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        if job.launcher == LAUNCHER_TORCHRUN:
            return self.restarts.vacate(job, lost, now)
        with self._lock:
            run = self._runs.get(job.id)
            if job.id in self._reviving:
                self._reviving[job.id] = [n for n in self._reviving[job.id] if n not in lost]
            if run is None:
                return
            gone = set(lost)
            run.target = [n for n in run.target if n not in gone]
            if run.adopt_until is None:
                run.coord.regroup(self._keys(run.target))
            for n in lost:
                self._retire(run, n, self.vacate_grace_s, wait_exit_s=0.0, lost=True)

    def stop(self, job: Job, now: float) -> None:
        self.limits.forget(job.id)
        if job.launcher == LAUNCHER_TORCHRUN:
            self._faults.pop(job.id, None)
            return self.restarts.stop(job)
        with self._lock:
            run = self._runs.pop(job.id, None)
            self._reviving.pop(job.id, None)
        if run is None:
            return
        st = run.coord.status()
        job.samples_done = max(job.samples_done, float(st["samples_done"]))
        job.story = story_of(st, run.coord.generations()[-HISTORY:])
        run.ended = True
        self._faults.pop(job.id, None)
        run.coord.close(wait=False)
        self.book.revoke(job.id)
        adoption.kept_path(self.logdir, job.id).unlink(missing_ok=True)
        for n in {ranks.node_of(k) for k in run.handles}:
            self._retire(run, n, self.stop_grace_s, wait_exit_s=3.0)

    def progress(self, job: Job, now: float) -> float:
        if job.launcher == LAUNCHER_TORCHRUN:
            return self.restarts.progress(job)
        run = self._runs.get(job.id)
        if run is None:
            return job.samples_done
        return max(job.samples_done, float(run.coord.status()["samples_done"]))

    def rate(self, job: Job) -> float:
        if job.launcher == LAUNCHER_TORCHRUN:
            return self.restarts.rate(job)
        run = self._runs.get(job.id)
        if run is None:
            return 0.0
        return float(run.coord.status().get("samples_per_second") or 0.0)

    def samples(self, now: float) -> list:
        """Throughput over each generation's last `sample_s` of training, and the pause of each
        regroup between two sizes, since the last call (core/dispatchers/metering.py)."""
        out: list = self.restarts.samples()
        t = time.monotonic()
        with self._lock:
            runs = [r for r in self._runs.values() if not r.ended]
        for run in runs:
            out += run.meter.measure(run.job.id, run.job.global_batch, run.coord.status(), now, t, self.sample_s)
        return out

    takes_reports = True

    def host_of(self, node: str) -> Optional[str]:
        spec = self.specs.get(node)
        return self.transport.host_of(spec) if spec is not None else None

    def status(self, job_id: str) -> Optional[dict]:
        """The coordinator's status of the job with its last `HISTORY` generations (members,
        per-rank checksums and places at each sync and stop)."""
        run = self._runs.get(job_id)
        if run is None:
            return self.restarts.status(job_id)
        return {**run.coord.status(), "generations": run.coord.generations()[-HISTORY:]}

    def accept_report(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        return self.book.accept_http(job_id, authorization, body)

    def carry_over(self, old: Job, new: Job) -> float:
        """A resubmitted job resumes from a copy of the old one's checkpoint folder (carryover.py)."""
        return carryover.carry(self.logdir, old, new)

    def forget_carried(self, new: Job) -> None:
        carryover.forget(self.logdir, new)

    def poll(self, now: float) -> list[Event]:
        events: list[Event] = []
        with self._lock:
            events, self._events = self._events, []
            t = time.time()
            due = [node for when, node in self._rejoin if when <= t]
            self._rejoin = [(w, n) for w, n in self._rejoin if w > t]
            events += [Event(now, EventKind.NODE_JOIN, node=n, detail="offered again after a lost worker")
                       for n in due if not self.node_health.is_out(n) and not self.transport.taken_back(n)]
            for node in self.node_health.due():
                self._pool.submit(node_checks.check, self.transport, self.specs.get(node), self.node_health,
                                  self._post, node)
            for run in list(self._runs.values()):
                if run.ended:
                    continue
                if run.adopt_until is not None:
                    self._adopt(run, now)
                st = run.coord.status()
                if st["finished"]:
                    run.ended = True
                    events.append(Event(now, EventKind.JOB_DONE, job=run.job.id))
                elif st["failed"]:
                    self._fail(run, failures.from_error_text(st["error"] or "the job's workers failed",
                                                             tail=run.last_tail), now)
                elif st.get("store_down"):
                    self._store_down(run, st, now)
                else:
                    self._watch_progress(run, st, now)
            events += self._events
            self._events = []
            if not self._checking and time.monotonic() - self._last_check >= self.alive_every_s and \
                    (any(r.handles for r in self._runs.values()) or self.restarts.handles()):
                self._checking = True
                self._pool.submit(self._check_alive)
        self.limits.poll(self._watched)
        return events

    def begin_life(self, life: int) -> None:
        self.life = self.restarts.life = life

    def close(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            run.ended = True            # a start still under way stops what it started (`_start`)
            run.coord.close(wait=False)
            adoption.kept_path(self.logdir, run.job.id).unlink(missing_ok=True)   # its workers are told to exit: none rejoins
            for n in {ranks.node_of(k) for k in run.handles}:
                self._retire(run, n, self.stop_grace_s, wait_exit_s=2.0)
        for job in [r.job for r in self.restarts.runs.values()]:
            self.restarts.stop(job)
        self._pool.shutdown(wait=True)
        self.transport.close()

    # ---- mechanism ------------------------------------------------------------------------
    def _run(self, job: Job, kept: Optional[dict] = None) -> _Run:
        """The job's run, made on first use; `kept`: its coordinator's port, secret and token
        from the earlier harvester run (its workers rejoin that)."""
        run = self._runs.get(job.id)
        if run is None:
            if not job.command or not job.global_batch:
                raise ValueError(f"job {job.id} has no command or global batch to run on workers")
            kept = kept or {}
            token = kept.get("token") or secrets.token_urlsafe(24)
            url = f"{self.report_base}/{job.id}/report" if self.report_base else None
            ckpt = checkpoint_dir(self.logdir, job.id)
            extra = self._base_env()
            extra[ENV_CHECKPOINT_DIR] = str(ckpt)
            coord = JobCoordinator(job.id, job.global_batch, int(job.total_samples),
                                   host=self.coordinator_host, bind_host=self.coordinator_bind,
                                   report_url=url, token=token, heartbeat_timeout_s=self.heartbeat_timeout_s,
                                   pg_timeout_s=self.pg_timeout_s, extra_env=extra,
                                   port=int(kept.get("port") or 0), secret=kept.get("secret"),
                                   orphan_s=self.orphan_s)
            if self.orphan_s > 0:
                adoption.keep(self.logdir, job.id, coord.address[1], coord.secret, coord.token)
            self.book.register(job.id, coord.token)
            run = self._runs[job.id] = _Run(job, coord)
        return run

    def _adopt(self, run: _Run, now: float) -> None:
        """When every node of the job is back, or `adopt_s` is up, the job goes on: the nodes
        whose every rank rejoined are its again, `resize` starts new workers where none came
        back and dismisses adopted ones the job no longer has."""
        back = adoption.take_rejoined(run, run.job.id, run.coord.rejoined(), self.transport, self.specs, self._keys)
        if not back and time.monotonic() < (run.adopt_until or 0.0):
            return
        whole, partial, want = adoption.settle(run, run.coord.status()["members"], self._keys)
        run.adopt_until, run.target = None, whole
        for n in partial:           # a part of a node's ranks: the node starts afresh
            self._retire(run, n, self.vacate_grace_s, wait_exit_s=0.0, lost=True)
        st = run.coord.status()
        if whole:
            fresh = [n for n in want if n not in whole]
            self._events.append(Event(now, EventKind.WORKERS_ADOPTED, job=run.job.id, detail=(
                f"{len(whole)} node(s) of workers rejoined after the restart and trained on from step "
                f"{st['committed_step']} (generation {st['generation']}, {st['phase']})"
                + (f"; new workers for {len(fresh)} node(s)" if fresh else ""))))
        self.resize(run.job, want, now)

    def _base_env(self) -> dict[str, str]:
        """What every worker gets besides its job's own variables: the site's names
        (`worker_env`), one thread per rank, and this checkout on PYTHONPATH."""
        env = {k: os.environ[k] for k in self.worker_env if k in os.environ}
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"        # a log that shows each line as it is printed
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env

    def launch(self, job: Job, node: NodeSpec, env: dict[str, str], log_path: str) -> Handle:
        """Start one of `job`'s workers on `node`. A job that runs as its owner's account gets the
        site's launcher before its argv and its checkpoint directory given to that account first;
        the harvester's own files stay out of its reach (see README, Accounts). Its mark is made
        here, so that the launcher keeps it (sudo resets the environment) and a stop finds every
        process the job starts."""
        argv = list(job.command)
        if job.run_as:
            if self.run_as is None:
                raise StartError(node.name, f"the job runs as {job.run_as!r}, and this harvester has no launcher "
                                            "for other accounts (run_as)")
            self.transport.give_dir(node, str(checkpoint_dir(self.logdir, job.id)), job.run_as)
            env = {**env, ENV_MARK: new_mark()}
            return self.transport.start_as(node, self.run_as, job.run_as, argv, env, self.workdir, log_path)
        return self.transport.start(node, argv, env, self.workdir, log_path)

    def _restart_lost(self, job_id: str, node: str, failure: Failure) -> None:
        """A restart-based job lost `node` (a rank died or it cannot be reached): judged as a
        runtime job's lost node is (`_judge`)."""
        run = self.restarts.runs.get(job_id)
        if run is None:
            return
        with self._lock:
            verdict = self._judge(job_id, node, failure, [*run.target, node])
            if verdict is not None:
                failure.message = f"{verdict}, after {run.samples:,.0f} samples: {failure.message}"
                self.restarts.fail(run, failure)

    def _keys(self, nodes: Sequence[str]) -> list[str]:
        """The worker keys of `nodes`, node after node: one rank per slot, a node's consecutive."""
        return [k for n in nodes for k in ranks.keys_of(n, self.specs[n].slots)]

    def _start(self, run: _Run, node: str, order: list[str]) -> None:
        """Start one worker per slot of `node` (a new incarnation of each of its keys); `order`
        is the generation they are started for, which sets their first RANK, NODE_RANK, ..."""
        spec = self.specs[node]
        starts: list[tuple[str, dict[str, str], str]] = []
        for key in ranks.keys_of(node, spec.slots):
            env = run.coord.worker_env(key)
            env.update(ranks.place(order, key).env())
            inc = env.get("HARVEST_INCARNATION", "0")
            run.incarnation[key] = int(inc)
            starts.append((key, env, str(self.logdir / run.job.id / f"{key}-s{self.life}-{inc}.log")))

        def start() -> None:
            started: dict[str, Handle] = {}
            try:
                for key, env, log_path in starts:
                    started[key] = self.launch(run.job, spec, env, log_path)
            except (StartError, ValueError) as e:
                with self._lock:
                    self._fail(run, failures.from_start_error(getattr(e, "message", str(e)), node), time.time())
                self._stop_handles(list(started.values()), 0.5)
                return
            except TransportError as e:
                self._stop_handles(list(started.values()), 0.5)
                if not self.transport.taken_back(node):    # else the source's leave covers it
                    self._lost(run, node, failures.named(failures.UNREACHABLE, f"cannot reach {node}: {e.message}", node))
                return
            with self._lock:
                late = run.ended or node not in run.target
                if not late:
                    run.handles.update(started)
            if late:
                self._stop_handles(list(started.values()), self.stop_grace_s)
        self._pool.submit(start)

    def _retire(self, run: _Run, node: str, grace_s: float, wait_exit_s: float, lost: bool = False) -> None:
        """Get every worker on `node` out: give them `wait_exit_s` to exit on their own (after a
        dismiss), then SIGTERM, SIGKILL after `grace_s`; always reaps them. A lost node is
        reported to the coordinator at once, all its ranks in one decision (before a new worker
        may start there: the coordinator knows workers by key)."""
        keys = self._keys([node])
        handles = {k: h for k in keys if (h := run.handles.pop(k, None)) is not None}
        incs = {k: run.incarnation.get(k) for k in keys}
        if lost:
            run.coord.workers_lost(list(incs.items()))
        if not handles:
            return

        def retire() -> None:
            deadline = time.monotonic() + wait_exit_s
            try:
                while time.monotonic() < deadline and any(self.transport.alive_many(handles.values()).values()):
                    time.sleep(0.05)
            except TransportError:
                pass
            results = self._stop_handles(list(handles.values()), grace_s)
            with self._lock:
                newer = node in run.target or any(k in run.handles for k in keys)
            killed = [(k, incs[k]) for k, h in handles.items() if results.get(h) == STOP_KILL]
            if killed and not lost and not newer:
                run.coord.workers_lost(killed)     # they did not leave by themselves
        self._pool.submit(retire)

    def _stop_handles(self, handles: list[Handle], grace_s: float) -> dict[Handle, str]:
        if not handles:
            return {}
        results = self.transport.stop_many(handles, grace_s)
        for h, r in results.items():
            if r == STOP_LOST:
                log.warning("could not stop the worker %d on %s", h.pid, h.node.name)
        return results

    def _check_alive(self) -> None:
        """A worker that died or cannot be reached takes its whole node out of its job: every
        rank of the node leaves in one regroup, the others are stopped."""
        try:
            with self._lock:
                watched = [(run, k, h) for run in self._runs.values() if not run.ended
                           for k, h in run.handles.items()]
            restarted = self.restarts.handles()
            alive = self.transport.alive_many([h for _, _, h in watched] + [h for _, _, h in restarted])
            unanswered = self._count_unanswered([h for _, _, h in watched + restarted], alive)
            self.restarts.check({h: True if ok is None and unanswered.get(h.node.name, 0) < UNANSWERED_CHECKS
                                 else ok for h, ok in alive.items()},
                                frozenset(h.node.name for h, ok in alive.items() if ok is None))
            down: dict[tuple[str, str], tuple[_Run, Handle, Optional[bool]]] = {}
            for run, key, handle in watched:
                ok = alive.get(handle)
                node = ranks.node_of(key)
                if ok or self.transport.taken_back(node, handle):
                    continue          # alive, or gone with a node its owner took back (a leave)
                if ok is None and (unanswered.get(node, 0) < UNANSWERED_CHECKS
                                   or run.coord.heard_within(self._keys([node]), UNANSWERED_HEARD_S)):
                    continue          # one slow answer, or its heartbeats still come: not lost yet
                down.setdefault((run.job.id, node), (run, handle, ok))
            for (_, node), (run, handle, ok) in down.items():
                with self._lock:
                    if not any(h is handle for h in run.handles.values()):
                        continue          # retired meanwhile: not a crash
                    mates = [run.handles.pop(k) for k in self._keys([node]) if k in run.handles]
                if ok is None:
                    failure = failures.named(failures.UNREACHABLE, (
                        f"{node} did not answer {UNANSWERED_CHECKS} liveness checks in a row "
                        f"({self._alive_limit():g} s each), and its workers' heartbeats stopped"), node)
                else:
                    failure = failures.from_exit(self._tail(handle), self.transport.exit_status(handle), node)
                self._lost(run, node, failure)
                self._pool.submit(self._stop_handles, mates, self.vacate_grace_s)
            self._take_out_silent([run for run, _, _ in watched])
        finally:
            self._last_check = time.monotonic()
            self._checking = False

    def _count_unanswered(self, handles: list[Handle], alive: dict[Handle, Optional[bool]]) -> dict[str, int]:
        """Liveness checks unanswered in a row, per node (a node that answers starts again from 0)."""
        seen: dict[str, bool] = {}
        for handle in handles:
            if handle in alive:
                node = handle.node.name
                seen[node] = seen.get(node, False) or alive[handle] is not None
        with self._lock:
            for node, answered in seen.items():
                self._unanswered[node] = 0 if answered else self._unanswered.get(node, 0) + 1
            return dict(self._unanswered)

    def _alive_limit(self) -> float:
        return float(getattr(self.transport, "alive_timeout_s", 0.0) or 0.0)

    def _take_out_silent(self, runs: list[_Run]) -> None:
        """A worker alive as a process but silent past the heartbeat timeout (hung, SIGSTOPped)
        loses its node at once, as a crash would: the node leaves the job (and is offered again
        after `rejoin_after_s`), its processes are killed, and the loss counts."""
        for run in {id(r): r for r in runs}.values():
            for key, inc in run.coord.silent_workers():
                node = ranks.node_of(key)
                with self._lock:
                    if run.incarnation.get(key) != inc or key not in run.handles:
                        continue          # already taken out, or a newer worker there
                    mates = [run.handles.pop(k) for k in self._keys([node]) if k in run.handles]
                silent = f"no heartbeat from {node} for {run.coord.heartbeat_timeout_s:g} s: its workers are killed"
                self._lost(run, node, failures.named(failures.HUNG, silent, node))
                self._pool.submit(self._stop_handles, mates, self.vacate_grace_s)

    def _lost(self, run: _Run, node: str, failure: Failure) -> None:
        """A node's workers are gone. Before the job's first step a set-up error (the command,
        the folder, the script's own exception) fails it at once: every node would fail alike."""
        run.coord.workers_lost([(k, run.incarnation.get(k)) for k in self._keys([node])])
        with self._lock:
            self._unanswered.pop(node, None)
            run.last_tail = failure.tail or run.last_tail
            if run.health.fails_at_once(failure):
                self._fail(run, failure, time.time())
                return
            verdict = self._judge(run.job.id, node, failure, [*run.target, node])
            if verdict is not None:
                step = run.coord.status().get("committed_step")
                failure.message = f"{verdict}, during training at step {step}: {failure.message}"
                self._fail(run, failure, time.time())

    def _judge(self, job_id: str, node: str, failure: Failure, held: Sequence[str]) -> Optional[str]:
        """A node's workers were lost (under the lock): it leaves the job (cause `lost`). The
        node's fault holds it out until a check passes; anything else offers it again after
        `rejoin_after_s`. Why the job fails now (its own error everywhere, or on too many
        distinct nodes: blame.py), or None: it shrinks and trains on."""
        now = time.time()
        self._events.append(Event(now, EventKind.NODE_LEAVE, node=node, job=job_id, detail=failure.line(),
                                  failure=failure.to_dict(), cause=LEFT_LOST))
        if node_caused(failure) and self.checks_nodes:
            if self.node_health.hold_out(node, failure.line()):
                log.info("node %s held out (job %s trains on without it): %s; checked again in %g s",
                         node, job_id, failure.line(), self.node_health.first_check_s)
            return None
        self._rejoin.append((now + self.rejoin_after_s, node))
        if node_caused(failure) or consequence(failure):
            return None
        faults = self._faults.setdefault(job_id, JobFaults(self.crash_window_s, self.max_crashes))
        return faults.add(node, failure, held, now)

    def node_states(self) -> dict[str, str]:
        """The nodes held out for reasons of their own, and why (the cluster page, /api/cluster)."""
        return self.node_health.states()

    def clear_node(self, node: str) -> bool:
        return node_checks.clear(self.node_health, self._post, node)

    def _fail(self, run: _Run, failure: Failure, now: float) -> None:
        """The job fails, once, with its named reason (under the lock)."""
        if run.ended:
            return
        run.ended = True
        self._events.append(Event(now, EventKind.JOB_FAILED, job=run.job.id, node=failure.node,
                                  detail=failure.line(), failure=failure.to_dict()))

    def _watch_progress(self, run: _Run, st: dict, now: float) -> None:
        """Per poll (under the lock): what the job's health says goes to its events; a job that
        holds nodes and commits no step for `start_timeout_s` fails with its workers' last words."""
        events, stalled = run.health.observe(run.job.id, st, bool(run.target) and run.adopt_until is None, now,
                                             time.monotonic(), self.start_timeout_s)
        self._events += events
        if run.health.fatal is not None:
            self._fail(run, run.health.fatal, now)
        elif stalled is not None:
            self._pool.submit(self._fail_stalled, run, *stalled)

    def _fail_stalled(self, run: _Run, gen: int, errors: list[str]) -> None:
        """Read off the controller's thread: the first node's log, for the stalled job's failure."""
        handles = list(run.handles.values())
        tail = self._tail(handles[0]) if handles else run.last_tail
        failure = stalled_failure(self.start_timeout_s, gen, errors, handles[0].node.name if handles else None, tail)
        with self._lock:
            self._fail(run, failure, time.time())

    def logs(self, job_id: str, lines: int = 40) -> dict[str, list[str]]:
        """The last `lines` of each running worker's log, rank 0's first; of a job that has
        ended, what its failure kept."""
        run = self._runs.get(job_id)
        if run is not None:
            order = {k: i for i, k in enumerate(run.coord.status().get("members") or [])}
            keyed = sorted(run.handles.items(), key=lambda kh: (order.get(kh[0], len(order)), kh[0]))
        else:
            keyed = self.restarts.keyed_handles(job_id)
        return {k: self._tail(h, lines) for k, h in keyed}

    def _tail(self, handle: Handle, lines: int = 20) -> list[str]:
        try:
            return self.transport.tail(handle, lines)
        except (TransportError, OSError):
            return []

    def _store_down(self, run: _Run, st: dict, now: float) -> None:
        """The job's store process ended under it (its limits, under a flood): its workers are
        stopped and the job starts again on the same nodes from its last checkpoint with a new
        store, unless that happened `max_crashes` times within the crash window (under the lock)."""
        job, reason = run.job, str(st["store_down"])
        run.ended = True
        self._runs.pop(job.id, None)
        job.samples_done = max(job.samples_done, float(st["samples_done"]))
        self.book.revoke(job.id)
        adoption.kept_path(self.logdir, job.id).unlink(missing_ok=True)
        failure = failures.named(failures.STORE_DOWN, f"the job's store at {st['store']} ended: {reason}", None,
                                 tail=run.last_tail)
        downs = self._store_downs.setdefault(job.id, [])
        if note_loss(downs, time.time(), self.crash_window_s) >= self.max_crashes:
            failure.message = f"{len(downs)} times within {self.crash_window_s:g} s; last: {failure.message}"
            self._events.append(Event(now, EventKind.JOB_FAILED, job=job.id, detail=failure.line(),
                                      failure=failure.to_dict()))
            self._pool.submit(self._stop_handles, list(run.handles.values()), self.vacate_grace_s)
            return
        self._events.append(Event(now, EventKind.JOB_TROUBLE, job=job.id, failure=failure.to_dict(), detail=(
            f"{failure.message}: its workers start again on the same nodes from the last checkpoint")))
        self._reviving[job.id] = list(run.target)
        self._pool.submit(self._revive, job, list(run.handles.values()))

    def _revive(self, job: Job, handles: list[Handle]) -> None:
        """After `_store_down`, off the controller's thread: the old workers out first (their
        checkpoint written), then new ones, unless the job was stopped or placed again meanwhile."""
        self._stop_handles(handles, self.stop_grace_s)
        with self._lock:
            nodes = self._reviving.pop(job.id, None)
            if nodes is None or job.id in self._runs or not nodes:
                return
        try:
            self.resize(job, nodes, time.time())
        except (ValueError, OSError, RuntimeError) as e:
            with self._lock:
                failure = failures.named(failures.STORE_DOWN, f"the job's store could not be started again: {e}", None)
                self._events.append(Event(time.time(), EventKind.JOB_FAILED, job=job.id, detail=failure.line(),
                                          failure=failure.to_dict()))

    def _watched(self) -> list[Watched]:
        """The running jobs and their workers, for their limits."""
        with self._lock:
            runs = [(r.job.id, tuple(r.handles.values())) for r in self._runs.values() if not r.ended]
        runs += [(j, tuple(r.gen.handles.values())) for j, r in list(self.restarts.runs.items())
                 if not r.ended and r.gen is not None]
        return [Watched(j, str(checkpoint_dir(self.logdir, j)), hs) for j, hs in runs]

    def _limited(self, job_id: str, node: Optional[str], failure: Failure) -> None:
        """A job over a cap fails (its own fault), its workers on `node` killed at once: out of its
        handles first, so that no liveness check takes their end for a lost node, held out."""
        with self._lock:
            run, rr = self._runs.get(job_id), self.restarts.runs.get(job_id)
            taken: list[Handle] = []
            if run is not None:
                taken = [run.handles.pop(k) for k, h in list(run.handles.items()) if h.node.name == node]
                self._fail(run, failure, time.time())
        if rr is not None:
            with rr.applying:
                if rr.gen is not None:
                    taken = [h for h in rr.gen.handles.values() if h.node.name == node]
                    rr.gen.handles = {k: h for k, h in rr.gen.handles.items() if h.node.name != node}
                self.restarts.fail(rr, failure)
        self._stop_handles(taken, 0.0)

    def _post(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

