"""A worker's line to its coordinator: the store connections and the threads behind the loop.

Kept apart from `elastic` so the training loop only reads flags and records progress: a watcher
thread turns the worker's command stream into `stop_gens` / `leave_asked` / queued `run` commands,
a beat thread keeps the heartbeat (and rank 0's progress key) fresh, and an optional reporter
POSTs progress to HARVEST_REPORT_URL. See core/runtime/protocol.py for the keys; every connection
reads and writes them through the job's SignedStore (core/runtime/signing.py).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.request
from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch.distributed as dist

from . import protocol as P
from .signing import SignedStore, signed

if TYPE_CHECKING:
    from .elastic import ElasticJob

__all__ = ["Progress", "CoordinatorLink"]

log = logging.getLogger("harvest.elastic")


class Progress:
    """What rank 0 publishes: commit times of the last steps, the last loss and metrics. Written
    by the main thread, read by the link's threads; `seq` changes with every committed step."""

    def __init__(self) -> None:
        self.commits: deque[float] = deque(maxlen=21)
        self.loss: Optional[float] = None
        self.metrics: dict[str, float] = {}
        self.seq = 0

    def record(self, samples: Optional[int], loss: Optional[float],
               metrics: dict[str, float]) -> None:
        if samples is not None:
            self.metrics["rank_samples"] = float(samples)
        if loss is not None:
            self.loss = float(loss)
        for k, v in metrics.items():
            self.metrics[k] = float(v)

    def commit(self) -> None:
        self.commits.append(time.monotonic())
        self.seq += 1

    def snapshot(self, job: "ElasticJob") -> dict:
        commits = list(self.commits)
        step_time = (commits[-1] - commits[0]) / (len(commits) - 1) if len(commits) > 1 else None
        batch = P.batch_of_step(max(0, job.step - 1), job.total_samples, job.global_batch)
        return {"job": job.job_id, "node": job.node, "gen": job.generation, "rank": job.rank,
                "world": job.world_size, "step": job.step, "total_steps": job.total_steps,
                "samples_done": job.samples_done, "total_samples": job.total_samples,
                "step_time_s": step_time,
                "samples_per_second": batch / step_time if step_time else None,
                "loss": self.loss, "metrics": dict(self.metrics), "t": time.time()}


class CoordinatorLink:
    """Connections to the job's TCPStore and the watch / beat / report threads of one worker.

    `progress()` is the progress sequence number when this worker publishes progress (rank 0 of a
    running generation), else None; `snapshot()` is the progress record to publish."""

    def __init__(self, host: str, port: int, timeout: timedelta, node: str, incarnation: int, *,
                 secret: str, progress: Callable[[], Optional[int]], snapshot: Callable[[], dict],
                 report_url: Optional[str] = None, token: str = "",
                 report_every_s: float = 1.0, orphan_s: float = 0.0,
                 whereabouts: Callable[[], dict] = dict) -> None:
        """`orphan_s`: how long to train on and redial when the store goes away (the harvester
        restarting) before leaving as an orphan; `whereabouts()`: what the `rejoin` event then
        tells the new coordinator (generation, rank, members, step, running)."""
        self.node, self.incarnation = node, incarnation
        self._progress, self._snapshot = progress, snapshot
        self._report_url, self._token, self._report_every = report_url, token, report_every_s
        self._where = (host, port, secret, timeout)
        self.orphan_s = float(orphan_s)
        self._whereabouts = whereabouts
        self._ctl, self._cmds, self.pgstore = self._connect(timeout)
        self._ctl.set(P.heartbeat_key(node, incarnation), "0")
        self.away = False           # the store is gone; redialing it (orphan_s > 0)
        self.orphaned = False       # coordinator (store) vanished for good
        self.leave_asked = False    # coordinator said exit
        self.stop_gens: set[int] = set()
        self.commands: "queue.Queue[dict]" = queue.Queue()   # run commands, in order
        self._quit = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_k = 0

    def _connect(self, connect_timeout: timedelta) -> tuple[SignedStore, SignedStore, SignedStore]:
        """Three connections: events, heartbeat and progress (short operations, any thread); the
        watcher's blocking waits; the process-group rendezvous (may block up to the pg timeout)."""
        host, port, secret, timeout = self._where

        def one() -> SignedStore:
            store = dist.TCPStore(host, port, None, False, timeout=connect_timeout)
            store.set_timeout(timeout)
            return signed(store, secret, timeout.total_seconds())
        return one(), one(), one()

    @classmethod
    def from_env(cls, env: Mapping[str, str], node: str, incarnation: int, pg_timeout_s: float, *,
                 progress: Callable[[], Optional[int]], snapshot: Callable[[], dict],
                 whereabouts: Callable[[], dict] = dict) -> "CoordinatorLink":
        """Connect as the coordinator's environment (`JobCoordinator.worker_env()`) says."""
        host, port = env[P.ENV_STORE].rsplit(":", 1)
        secret = env.get(P.ENV_SECRET)
        if not secret:
            raise RuntimeError(f"{P.ENV_SECRET} is not set: this worker cannot talk to its "
                               "coordinator (start it with JobCoordinator.worker_env())")
        return cls(host, int(port), timedelta(seconds=max(30.0, 3 * pg_timeout_s)), node,
                   incarnation, secret=secret, progress=progress, snapshot=snapshot,
                   report_url=env.get(P.ENV_REPORT_URL) or None, token=env.get(P.ENV_TOKEN, ""),
                   report_every_s=float(env.get(P.ENV_REPORT_INTERVAL, "1.0")),
                   orphan_s=float(env.get(P.ENV_ORPHAN, "0") or 0), whereabouts=whereabouts)

    def start(self) -> None:
        loops = [(self._watch, "elastic-watch"), (self._beat, "elastic-beat")]
        if self._report_url:
            loops.append((self._report_loop, "elastic-report"))
        for target, name in loops:
            self._threads.append(threading.Thread(target=target, name=name, daemon=True))
            self._threads[-1].start()

    def event(self, kind: str, **fields: Any) -> None:
        """Send a worker event (protocol.py); a failure means the coordinator is gone."""
        if self.orphaned or self.away:
            return                      # a new coordinator learns what matters from `rejoin`
        msg = {"ev": kind, "node": self.node, "inc": self.incarnation, "pid": os.getpid(),
               "t": time.time(), **fields}
        try:
            n = self._ctl.add(P.EVENT_COUNTER, 1)
            self._ctl.set(P.event_key(n), P.encode(msg))
        except Exception:  # noqa: BLE001 - the coordinator is gone
            if self.orphan_s <= 0:
                self.orphaned = True    # else the watcher's wait fails too, and it redials

    def stop(self) -> None:
        """Join the helper threads before the interpreter finalises: a daemon thread coming
        back from a torch C++ call during finalisation aborts the process (pthread_exit
        unwinding through pybind11's noexcept GIL guard)."""
        self._quit.set()
        for t in self._threads[1:]:     # beat / report: they wake on the event
            t.join(0.5)
        for _ in range(5):
            if not self._threads or not self._threads[0].is_alive() or self.orphaned or self.away:
                return                  # an orphan's watcher already failed out of its wait
            try:                        # wake the watcher: its next command key, if still unset
                self._ctl.compare_set(P.cmd_key(self.node, self.incarnation, self._watch_k), "",
                                      P.encode({"op": "_quit"}))
            except Exception:  # noqa: BLE001 - store gone: the watcher's wait has failed anyway
                pass
            self._threads[0].join(0.3)

    def _watch(self) -> None:
        """Read this worker's command stream in order (blocking waits: one round trip each)."""
        k = 0
        while not self._quit.is_set():
            self._watch_k = k
            key = P.cmd_key(self.node, self.incarnation, k)
            try:
                self._cmds.wait([key], timedelta(days=7))
                raw = self._cmds.read(key)
            except Exception as e:  # noqa: BLE001
                if "timeout" in str(e).lower():
                    continue
                if self._quit.is_set() or not self._redial(k):
                    self.orphaned = True
                    return
                continue
            if raw is None:             # forged: the coordinator's own set overwrites it
                self._quit.wait(0.02)
                continue
            cmd = P.decode(raw)
            k += 1
            if self._quit.is_set():
                return
            if cmd["op"] == P.OP_STOP:
                self.stop_gens.add(int(cmd["gen"]))
            elif cmd["op"] == P.OP_EXIT:
                self.leave_asked = True
            else:
                self.commands.put(cmd)

    def _redial(self, k: int) -> bool:
        """The store went away (its harvester died or is restarting): the generation trains on
        (its collectives do not need the store) while this dials the same address again for
        `orphan_s`. Connected: the `rejoin` event tells the new coordinator where this worker
        stands and which command it reads next (`k`). False: gone for good, or orphan_s is 0."""
        if self.orphan_s <= 0:
            return False
        self.away = True
        deadline = time.monotonic() + self.orphan_s
        log.warning("worker %s: the coordinator's store went away; training on and redialing it for %g s",
                    self.node, self.orphan_s)
        while not self._quit.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("worker %s: no coordinator within %g s: leaving", self.node, self.orphan_s)
                return False
            try:
                ctl, cmds, pg = self._connect(timedelta(seconds=max(0.5, min(2.0, left))))
                ctl.set(P.heartbeat_key(self.node, self.incarnation), "0")
            except Exception:  # noqa: BLE001 - not back yet
                self._quit.wait(min(0.5, max(0.0, left)))
                continue
            self._ctl, self._cmds, self.pgstore = ctl, cmds, pg
            self.away = False
            self.event(P.EV_REJOIN, k=k, **self._whereabouts())
            log.warning("worker %s: rejoined the coordinator", self.node)
            return not self.orphaned
        return False

    def _beat(self) -> None:
        """Heartbeat every HEARTBEAT_S; rank 0 also publishes progress every PROGRESS_S."""
        beats, last_beat, last_seq = 0, 0.0, -1
        while not self._quit.wait(P.PROGRESS_S):
            try:
                now = time.monotonic()
                if now - last_beat >= P.HEARTBEAT_S:
                    beats += 1
                    last_beat = now
                    self._ctl.set(P.heartbeat_key(self.node, self.incarnation), str(beats))
                seq = self._progress()
                if seq is not None and seq != last_seq:
                    last_seq = seq
                    self._ctl.set(P.PROGRESS, P.encode(self._snapshot()))
            except Exception:  # noqa: BLE001 - the watcher notices a dead coordinator
                pass

    def _report_loop(self) -> None:
        """POST rank 0's progress to HARVEST_REPORT_URL (skipped when nothing changed)."""
        assert self._report_url is not None
        last_seq = -1
        while not self._quit.wait(self._report_every):
            seq = self._progress()
            if seq is None or seq == last_seq:
                continue
            last_seq = seq
            body = json.dumps(self._snapshot()).encode()
            req = urllib.request.Request(self._report_url, data=body, method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self._token}"})
            try:
                urllib.request.urlopen(req, timeout=2.0).close()
            except Exception as e:  # noqa: BLE001 - reporting is best effort
                log.debug("progress report failed: %s", e)
