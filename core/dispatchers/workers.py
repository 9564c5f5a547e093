"""Real training: one worker process per node, started through a transport (local processes or
ssh), membership changes through the job's coordinator (the processes stay up; only the process
group is rebuilt, see core/runtime/coordinator.py).

Policy stays in the controller. This module only turns "job J runs on exactly these nodes now"
into actions, without ever blocking the controller thread on a node: starting and stopping
processes and liveness checks run on a small thread pool, and what they find comes back as
events through `poll()`:
  - grow: start workers on the added nodes (they import torch and build the model while the job
    keeps training), the coordinator regroups once they are warm;
  - shrink: regroup without the leaving nodes first, then dismiss them (clean exit);
  - vacate (the main scheduler took a node): regroup without it and SIGTERM it at once,
    SIGKILL after `vacate_grace_s`;
  - a worker that dies, or a node ssh cannot reach: the node is lost (a NODE_LEAVE), offered
    again after `rejoin_after_s`; after `max_crashes` such losses the job fails with the last
    lines of the worker's log in the event. Not so on a node the transport says its owner took
    back (a preempted Slurm pilot): the node source's own leave accounts for that worker.
It also measures for the profiler: committed steps over `sample_s` of one generation are a
throughput sample at that world size, and each regroup's pause (stop sent to first step at the
new size) a rescale-cost sample.
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

from ..model import Event, EventKind, Job, PauseSample, RateSample
from ..runtime.coordinator import JobCoordinator
from ..runtime.reports import ReportBook
from ..transports.base import Handle, NodeSpec, StartError, Transport, TransportError
from .base import Dispatcher

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent.parent
ENV_CHECKPOINT_DIR = "HARVEST_CHECKPOINT_DIR"


@dataclass
class _Run:
    job: Job
    coord: JobCoordinator
    target: list[str] = field(default_factory=list)
    handles: dict[str, Handle] = field(default_factory=dict)
    leaving: set[str] = field(default_factory=set)
    incarnation: dict[str, int] = field(default_factory=dict)   # node -> its current worker's
    crashes: int = 0
    ended: bool = False
    last_tail: list[str] = field(default_factory=list)
    meter: Optional[tuple[int, float, int]] = None   # (generation, monotonic start, committed step)
    paused_gen: int = 0                               # last generation whose pause was reported


class WorkerDispatcher(Dispatcher):
    def __init__(self, transport: Transport, nodes: Sequence[NodeSpec], logdir: Path,
                 report_base: Optional[str] = None, workdir: str = "", pythonpath: Optional[str] = str(ROOT),
                 coordinator_host: str = "127.0.0.1", coordinator_bind: Optional[str] = None,
                 worker_env: Sequence[str] = (), stop_grace_s: float = 5.0,
                 vacate_grace_s: float = 1.0, max_crashes: int = 3, rejoin_after_s: float = 5.0,
                 alive_every_s: float = 0.5, pg_timeout_s: float = 10.0, sample_s: float = 5.0) -> None:
        self.transport = transport
        self.name = transport.name
        self.specs = {n.name: n for n in nodes}
        self.logdir = Path(logdir).resolve()
        self.report_base = report_base.rstrip("/") if report_base else None
        self.workdir = workdir
        self.pythonpath = pythonpath
        self.coordinator_host = coordinator_host      # the address workers dial for the job's store
        self.coordinator_bind = coordinator_bind      # where the store listens (None: torch's default)
        self.worker_env = tuple(worker_env)           # names of this process's variables workers get
        self.stop_grace_s = stop_grace_s
        self.vacate_grace_s = vacate_grace_s
        self.max_crashes = max_crashes
        self.rejoin_after_s = rejoin_after_s
        self.alive_every_s = alive_every_s
        self.pg_timeout_s = pg_timeout_s
        self.sample_s = sample_s
        self.book = ReportBook()
        self._runs: dict[str, _Run] = {}
        self._events: list[Event] = []
        self._rejoin: list[tuple[float, str]] = []
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="dispatch")
        self._checking = False
        self._last_check = 0.0

    # ---- what the controller asks ---------------------------------------------------------
    def resize(self, job: Job, nodes: Sequence[str], now: float) -> None:
        with self._lock:
            run = self._run(job)
            want = list(nodes)
            old = run.target
            removed = [n for n in old if n not in want]
            added = [n for n in want if n not in old]
            run.target = want
            for n in added:
                self._start(run, n)
            survivors = [n for n in want if n in old]
            run.coord.regroup(survivors + [n for n in want if n not in survivors])
            for n in removed:
                run.coord.dismiss(n, incarnation=run.incarnation.get(n))
                self._retire(run, n, self.stop_grace_s, wait_exit_s=self.pg_timeout_s + 5)

    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        with self._lock:
            run = self._runs.get(job.id)
            if run is None:
                return
            gone = set(lost)
            run.target = [n for n in run.target if n not in gone]
            run.coord.regroup(list(run.target))
            for n in lost:
                self._retire(run, n, self.vacate_grace_s, wait_exit_s=0.0, lost=True)

    def stop(self, job: Job, now: float) -> None:
        with self._lock:
            run = self._runs.pop(job.id, None)
        if run is None:
            return
        st = run.coord.status()
        job.samples_done = max(job.samples_done, float(st["samples_done"]))
        run.ended = True
        run.coord.close(wait=False)
        self.book.revoke(job.id)
        for n in list(run.handles):
            self._retire(run, n, self.stop_grace_s, wait_exit_s=3.0)

    def progress(self, job: Job, now: float) -> float:
        run = self._runs.get(job.id)
        if run is None:
            return job.samples_done
        return max(job.samples_done, float(run.coord.status()["samples_done"]))

    def rate(self, job: Job) -> float:
        run = self._runs.get(job.id)
        if run is None:
            return 0.0
        return float(run.coord.status().get("samples_per_second") or 0.0)

    def samples(self, now: float) -> list:
        """Throughput over each generation's last `sample_s` of training, and the pause of each
        regroup between two sizes, since the last call."""
        out: list = []
        t = time.monotonic()
        with self._lock:
            runs = [r for r in self._runs.values() if not r.ended]
        for run in runs:
            st = run.coord.status()
            rescale = st.get("last_rescale")
            if rescale and rescale["gen"] > run.paused_gen and rescale.get("first_step_at") is not None:
                run.paused_gen = rescale["gen"]
                size, before = len(rescale["members"]), rescale.get("prev_size") or 0
                pause = rescale.get("switch_s")
                if before > 0 and size != before and pause is not None and rescale.get("reason") != "failure":
                    out.append(PauseSample(now, run.job.id, "up" if size > before else "down", float(pause)))
            gen, world, step = st["generation"], st["world_size"], st["committed_step"]
            if st["regrouping"] or world <= 0 or st["finished"] or st["failed"]:
                run.meter = None
                continue
            if run.meter is None or run.meter[0] != gen:
                run.meter = (gen, t, step)
                continue
            _, t0, s0 = run.meter
            if t - t0 >= self.sample_s and step > s0:
                rate = (step - s0) * run.job.global_batch / (t - t0)
                out.append(RateSample(now, run.job.id, world, rate, t - t0))
                run.meter = (gen, t, step)
        return out

    takes_reports = True

    def host_of(self, node: str) -> Optional[str]:
        spec = self.specs.get(node)
        return self.transport.host_of(spec) if spec is not None else None

    def status(self, job_id: str) -> Optional[dict]:
        run = self._runs.get(job_id)
        return run.coord.status() if run else None

    def accept_report(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        return self.book.accept_http(job_id, authorization, body)

    def poll(self, now: float) -> list[Event]:
        events: list[Event] = []
        with self._lock:
            events, self._events = self._events, []
            t = time.time()
            due = [node for when, node in self._rejoin if when <= t]
            self._rejoin = [(w, n) for w, n in self._rejoin if w > t]
            events += [Event(now, EventKind.NODE_JOIN, node=n, detail="offered again after a lost worker")
                       for n in due]
            for run in list(self._runs.values()):
                if run.ended:
                    continue
                st = run.coord.status()
                if st["finished"]:
                    run.ended = True
                    events.append(Event(now, EventKind.JOB_DONE, job=run.job.id))
                elif st["failed"]:
                    run.ended = True
                    events.append(Event(now, EventKind.JOB_FAILED, job=run.job.id,
                                        detail=self._why_failed(run, st["error"])))
            if not self._checking and time.monotonic() - self._last_check >= self.alive_every_s and \
                    any(r.handles for r in self._runs.values()):
                self._checking = True
                self._pool.submit(self._check_alive)
        return events

    def close(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            run.coord.close(wait=False)
            for n in list(run.handles):
                self._retire(run, n, self.stop_grace_s, wait_exit_s=2.0)
        self._pool.shutdown(wait=True)
        self.transport.close()

    # ---- mechanism ------------------------------------------------------------------------
    def _run(self, job: Job) -> _Run:
        run = self._runs.get(job.id)
        if run is None:
            if not job.command or not job.global_batch:
                raise ValueError(f"job {job.id} has no command or global batch to run on workers")
            token = secrets.token_urlsafe(24)
            url = f"{self.report_base}/{job.id}/report" if self.report_base else None
            ckpt = self.logdir / job.id / "checkpoint"
            extra = {k: os.environ[k] for k in self.worker_env if k in os.environ}
            extra.update({ENV_CHECKPOINT_DIR: str(ckpt), "OMP_NUM_THREADS": "1"})
            if self.pythonpath:
                extra["PYTHONPATH"] = self.pythonpath
            coord = JobCoordinator(job.id, job.global_batch, int(job.total_samples),
                                   host=self.coordinator_host, bind_host=self.coordinator_bind,
                                   report_url=url, token=token,
                                   pg_timeout_s=self.pg_timeout_s, extra_env=extra)
            self.book.register(job.id, coord.token)
            run = self._runs[job.id] = _Run(job, coord)
        return run

    def _start(self, run: _Run, node: str) -> None:
        spec = self.specs.get(node)
        if spec is None:
            raise ValueError(f"node {node} is not in the inventory")
        env = run.coord.worker_env(node)
        run.incarnation[node] = int(env.get("HARVEST_INCARNATION", "0"))
        log_path = str(self.logdir / run.job.id / f"{node}-{env.get('HARVEST_INCARNATION', '0')}.log")
        argv = list(run.job.command)
        run.leaving.discard(node)

        def start() -> None:
            try:
                handle = self.transport.start(spec, argv, env, self.workdir, log_path)
            except (StartError, ValueError) as e:
                self._post(Event(time.time(), EventKind.JOB_FAILED, job=run.job.id,
                                 detail=f"cannot start the command on {node}: {e}"))
                return
            except TransportError as e:
                if not self.transport.taken_back(node):    # else the source's leave covers it
                    self._lost(run, node, f"cannot reach {node}: {e.message}")
                return
            with self._lock:
                if run.ended or node not in run.target:
                    late = True
                else:
                    late = False
                    run.handles[node] = handle
            if late:
                self._stop_handle(handle, self.stop_grace_s)
        self._pool.submit(start)

    def _retire(self, run: _Run, node: str, grace_s: float, wait_exit_s: float, lost: bool = False) -> None:
        """Get the worker on `node` out: give it `wait_exit_s` to exit on its own (after a
        dismiss), then SIGTERM, SIGKILL after `grace_s`; always reaps it. A lost node is
        reported to the coordinator at once (before a new worker may start on it: the
        coordinator knows workers by node name)."""
        handle = run.handles.pop(node, None)
        run.leaving.add(node)
        inc = run.incarnation.get(node)
        if lost:
            run.coord.node_lost(node, incarnation=inc)
        if handle is None:
            return

        def retire() -> None:
            deadline = time.monotonic() + wait_exit_s
            try:
                while time.monotonic() < deadline and self.transport.alive(handle):
                    time.sleep(0.05)
            except TransportError:
                pass
            result = self._stop_handle(handle, grace_s)
            with self._lock:
                newer = node in run.handles or node in run.target
            if result == "kill" and not lost and not newer:
                run.coord.node_lost(node, incarnation=inc)   # it did not leave by itself
        self._pool.submit(retire)

    def _stop_handle(self, handle: Handle, grace_s: float) -> str:
        try:
            return self.transport.stop(handle, grace_s)
        except TransportError as e:
            log.warning("could not stop the worker on %s: %s", handle.node.name, e)
            return "lost"

    def _check_alive(self) -> None:
        try:
            with self._lock:
                watched = [(run, n, h) for run in self._runs.values() if not run.ended
                           for n, h in run.handles.items()]
            alive = self.transport.alive_many([h for _, _, h in watched])
            for run, node, handle in watched:
                ok = alive.get(handle)
                if ok or self.transport.taken_back(node, handle):
                    continue          # alive, or gone with a node its owner took back (a leave)
                with self._lock:
                    if run.handles.get(node) is not handle:
                        continue          # retired meanwhile: not a crash
                    run.handles.pop(node, None)
                tail = self._tail(handle)
                why = "unreachable" if ok is None else "worker exited"
                self._lost(run, node, f"{why} on {node}" + (f": {tail[-1]}" if tail else ""), tail)
                self._pool.submit(self._stop_handle, handle, 0.5)
        finally:
            self._last_check = time.monotonic()
            self._checking = False

    def _lost(self, run: _Run, node: str, detail: str, tail: Optional[list[str]] = None) -> None:
        run.coord.node_lost(node, incarnation=run.incarnation.get(node))
        with self._lock:
            run.crashes += 1
            run.last_tail = tail or run.last_tail
            self._events.append(Event(time.time(), EventKind.NODE_LEAVE, node=node, job=run.job.id,
                                      detail=detail))
            self._rejoin.append((time.time() + self.rejoin_after_s, node))
            if run.crashes >= self.max_crashes and not run.ended:
                run.ended = True
                self._events.append(Event(time.time(), EventKind.JOB_FAILED, job=run.job.id,
                                          detail=self._why_failed(run, f"{run.crashes} workers lost")))

    def _why_failed(self, run: _Run, error: str) -> str:
        tail = " | ".join(run.last_tail[-10:])
        return f"{error}" + (f"; last log lines: {tail}" if tail else "")

    def _tail(self, handle: Handle) -> list[str]:
        try:
            return self.transport.tail(handle, 20)
        except (TransportError, OSError):
            return []

    def _post(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
