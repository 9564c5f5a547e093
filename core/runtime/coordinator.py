"""Controller side of the elastic runtime: one JobCoordinator per running job.

The coordinator serves the job's TCPStore and drives its workers (core.runtime.elastic) through
generations; see core/runtime/protocol.py for the keys. Every public method is non-blocking: it
records an intention under a lock and wakes a daemon thread, which does all store I/O (polling
worker events every 2 ms while a regroup is in flight, 20 ms otherwise).

Regroup sequence (what `regroup(nodes)` sets in motion):
  1. wait, while the current generation keeps training, until every named node has a warmed-up
     worker (`ready()`), or `ready_timeout_s` passed (late nodes are then left out);
  2. send `stop` to the members of the current generation; they agree on the stop step with the
     per-step all_reduce, destroy their process group and report `stopped`;
  3. when every member has reported (or is lost), send `run` (generation G+1, rank = position in
     `nodes`) to each node; the ranks rendezvous on PrefixStore("gen<G+1>"), take the state of the
     most advanced rank, wrap the model in DDP and train;
  4. rank 0's `first_step` event closes the measurement: `decision_s` = regroup() call to first
     step, `switch_s` = stop sent to first step (the training pause).
A failed generation (a peer died, `node_lost()`, a stale heartbeat) is stopped the same way and
regrouped on its surviving members, unless a regroup() is pending, which then wins.

The coordinator never kills processes: the dispatcher starts them with `worker_env(node)`, stops
them with `dismiss(node)` (clean exit), SIGTERM (clean, worker-initiated leave) or SIGKILL followed
by `node_lost(node)`, and reaps them. Every `worker_env(node)` call is a new *incarnation* of the
node's worker (HARVEST_INCARNATION); pass it to `node_lost`/`dismiss` when the call can arrive after
a newer worker was started on the same node. A worker whose heartbeat stops for
`heartbeat_timeout_s` (hung, partitioned) is treated as lost and appears in `status()["lost"]`.

The job's TCPStore listens on every interface of the controller, without authentication: keep the
port inside the cluster network. The per-job token protects the HTTP progress reports only.
"""
from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from . import protocol as P

__all__ = ["JobCoordinator"]

log = logging.getLogger("harvest.coordinator")

_live: "weakref.WeakSet[JobCoordinator]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A coordinator thread still inside a store call when the interpreter finalises would
    abort the controller process: close what the caller left open."""
    for coord in list(_live):
        coord.close(grace_s=0.5)

# worker states as the coordinator sees them
W_STARTING = "starting"    # env handed out, not connected yet
W_WARMING = "warming"      # connected (torch imported), building the model
W_READY = "ready"          # waiting for an assignment
W_RUNNING = "running"      # member of the running generation
W_EXITING = "exiting"      # finished or leaving: will exit on its own
W_GONE = "gone"            # exited, dismissed and left, or lost

# coordinator phases
PH_IDLE = "idle"           # no generation running (none yet, or 0 nodes)
PH_RUNNING = "running"
PH_STOPPING = "stopping"   # stop sent, waiting for every member's report
PH_FINISHED = "finished"
PH_FAILED = "failed"


@dataclass
class _Worker:
    node: str
    inc: int
    state: str = W_STARTING
    pid: Optional[int] = None
    host: Optional[str] = None
    cmd_next: int = 0
    step: int = 0
    dismissed: bool = False
    lost: bool = False
    exit_reason: str = ""
    hb_value: Optional[bytes] = None
    hb_seen: float = 0.0           # monotonic time the heartbeat last changed
    connected: bool = False
    started: float = 0.0
    exit_sent: bool = False


@dataclass
class Generation:
    """One process group of the job, with the timestamps of how it came to be."""

    gen: int
    members: list[str]
    reason: str                                  # regroup | node_lost | leave | failure | dismiss
    prev_size: int = 0
    requested_at: float = 0.0                    # wall time of the decision (regroup()/loss seen)
    switch_at: Optional[float] = None            # wall time the previous generation was told to stop
    published_at: Optional[float] = None         # wall time assignments were sent
    synced_at: Optional[float] = None            # every rank synced
    first_step_at: Optional[float] = None        # rank 0 committed its first step
    ended_at: Optional[float] = None
    decision_s: Optional[float] = None           # requested -> first step
    switch_s: Optional[float] = None             # stop sent (or publish) -> first step
    start_step: Optional[int] = None             # step the group resumed from
    end_step: Optional[int] = None
    synced: dict[str, dict] = field(default_factory=dict)    # node -> rank, step, checksum
    stopped: dict[str, dict] = field(default_factory=dict)   # node -> step, reason, checksum
    failed: bool = False
    incarnations: dict[str, int] = field(default_factory=dict)   # node -> worker incarnation
    _req_mono: float = 0.0
    _switch_mono: Optional[float] = None

    def public(self) -> dict:
        d = asdict(self)
        d.pop("_req_mono")
        d.pop("_switch_mono")
        return d


@dataclass
class _Pending:
    gen: int
    nodes: list[str]
    reason: str
    requested_at: float
    req_mono: float


class JobCoordinator:
    """Controller-side coordinator of one elastic job (see the module docstring)."""

    def __init__(self, job_id: str, global_batch: int, total_samples: int, host: str = "127.0.0.1",
                 port: int = 0, pg_timeout_s: float = 10.0, *, report_url: Optional[str] = None,
                 token: Optional[str] = None, ready_timeout_s: float = 300.0,
                 heartbeat_timeout_s: float = 15.0, checksums: bool = True,
                 max_failed_generations: int = 3, checkpoint_dir: Optional[str] = None,
                 extra_env: Optional[dict[str, str]] = None) -> None:
        if global_batch <= 0 or total_samples <= 0:
            raise ValueError("global_batch and total_samples must be positive")
        self.job_id = job_id
        self.global_batch = int(global_batch)
        self.total_samples = int(total_samples)
        self.total_steps = P.total_steps(self.total_samples, self.global_batch)
        self.pg_timeout_s = float(pg_timeout_s)
        self.report_url = report_url
        self.token = token or secrets.token_urlsafe(24)
        self.ready_timeout_s = float(ready_timeout_s)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.checksums = checksums
        self.max_failed_generations = int(max_failed_generations)
        self.extra_env = dict(extra_env or {})
        if checkpoint_dir:
            self.extra_env.setdefault(P.ENV_CHECKPOINT_DIR, str(checkpoint_dir))
        self._store = dist.TCPStore(host, port, None, True,
                                    timeout=timedelta(seconds=max(30.0, 3 * self.pg_timeout_s)),
                                    wait_for_workers=False)
        self.address: tuple[str, int] = (host, int(self._store.port))
        self._store.set(P.META, P.encode({"job": job_id, "global_batch": self.global_batch,
                                          "total_samples": self.total_samples,
                                          "total_steps": self.total_steps,
                                          "pg_timeout_s": self.pg_timeout_s}))
        self._store.set(P.PROGRESS, "{}")
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._workers: dict[str, _Worker] = {}
        self._incarnations: dict[str, int] = {}
        self._gens: list[Generation] = []
        self._current: Optional[Generation] = None
        self._last_gen = 0
        self._phase = PH_IDLE
        self._pending: Optional[_Pending] = None
        self._committed = 0
        self._max_committed = 0
        self._lost_steps = 0
        self._progress: dict = {}
        self._size_since: Optional[float] = None
        self._failures_in_row = 0
        self._error = ""
        self._ev_next = 1
        self._gap_since: Optional[float] = None
        self._last_gap_check = 0.0
        self._last_progress_read = 0.0
        self._last_hb_check = 0.0
        self._last_stop: Optional[tuple[float, float]] = None   # (wall, monotonic) stop sent
        self._closing = False
        self._close_deadline = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"coord-{job_id}", daemon=True)
        self._thread.start()
        _live.add(self)

    # ------------------------------------------------------------------ public API
    def worker_env(self, node: str) -> dict[str, str]:
        """Environment for a new worker process on `node` (each call is a new incarnation: the
        previous process on that node, if any, is forgotten)."""
        with self._lock:
            inc = self._incarnations.get(node, 0) + 1
            self._incarnations[node] = inc
            old = self._workers.get(node)
            if old is not None and old.state != W_GONE:
                self._mark_gone(old, "replaced")
            self._workers[node] = _Worker(node, inc, started=time.monotonic())
        host, port = self.address
        env = {P.ENV_STORE: f"{host}:{port}", P.ENV_JOB: self.job_id, P.ENV_NODE: node,
               P.ENV_INCARNATION: str(inc), P.ENV_TOKEN: self.token,
               P.ENV_GLOBAL_BATCH: str(self.global_batch),
               P.ENV_TOTAL_SAMPLES: str(self.total_samples),
               P.ENV_PG_TIMEOUT: str(self.pg_timeout_s),
               P.ENV_CHECKSUMS: "1" if self.checksums else "0"}
        if self.report_url:
            env[P.ENV_REPORT_URL] = self.report_url
        if host.startswith("127.") or host in ("localhost", "::1"):
            env["GLOO_SOCKET_IFNAME"] = "lo"      # gloo would pick the hostname's interface
        env.update(self.extra_env)
        return env

    def ready(self) -> set[str]:
        """Nodes whose worker is warmed up and waiting for an assignment (not in a running group)."""
        with self._lock:
            return {n for n, w in self._workers.items() if w.state == W_READY}

    def regroup(self, nodes: list[str]) -> int:
        """Run the job on exactly `nodes` from the next generation on (ranks in this order; put the
        survivors first). Returns at once with the number that generation will have; a regroup()
        before that one started replaces it (same number). Nodes whose worker is gone are left out.
        An empty list pauses the job (0 nodes; the workers stay, waiting)."""
        nodes = list(nodes)
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate nodes in {nodes}")
        with self._lock:
            unknown = [n for n in nodes if n not in self._workers]
            if unknown:
                raise ValueError(f"no worker was started on {unknown} (call worker_env first)")
            if self._phase in (PH_FINISHED, PH_FAILED):
                return self._last_gen
            nodes = [n for n in nodes if self._workers[n].state != W_GONE]
            cur = self._current
            if cur is not None and self._phase == PH_RUNNING and not cur.failed \
                    and nodes == cur.members:
                self._pending = None              # back to what runs: nothing to change
                return cur.gen
            self._set_pending(nodes, "regroup")
            assert self._pending is not None
            gen = self._pending.gen
        self._wake.set()
        return gen

    def dismiss(self, node: str, incarnation: Optional[int] = None) -> None:
        """The worker on `node` leaves (after the group regrouped without it) and exits 0.
        `incarnation` (HARVEST_INCARNATION of its env): act only if that worker is still the
        node's current one, never on a newer worker started there since."""
        with self._lock:
            w = self._workers.get(node)
            if w is None or w.state == W_GONE or incarnation not in (None, w.inc):
                return
            w.dismissed = True
            target = self._target_nodes()
            if node in target:
                self._set_pending([n for n in target if n != node], "dismiss")
        self._wake.set()

    def node_lost(self, node: str, incarnation: Optional[int] = None) -> None:
        """The dispatcher saw the worker on `node` die (or cannot reach it): regroup without it.
        Pass `incarnation` (HARVEST_INCARNATION of the env it started with) whenever the call may
        come after a new worker was started on the node: without it the newest one is meant."""
        with self._lock:
            w = self._workers.get(node)
            if w is None or w.state == W_GONE or incarnation not in (None, w.inc):
                return
            w.lost = True
            self._mark_gone(w, "lost")
        self._wake.set()

    def status(self) -> dict:
        with self._lock:
            cur = self._current
            running = self._phase in (PH_RUNNING, PH_STOPPING) and cur is not None
            prog = self._progress if running and self._progress.get("gen") == (cur.gen if cur else None) else {}
            return {
                "job": self.job_id,
                "store": "%s:%d" % self.address,
                "phase": self._phase,
                "generation": cur.gen if cur else 0,
                "world_size": len(cur.members) if running and cur else 0,
                "members": list(cur.members) if running and cur else [],
                "pending": list(self._pending.nodes) if self._pending else None,
                "pending_generation": self._pending.gen if self._pending else None,
                "regrouping": self._pending is not None or self._phase == PH_STOPPING or
                              (running and cur is not None and cur.first_step_at is None),
                "committed_step": self._committed,
                "total_steps": self.total_steps,
                "samples_done": P.samples_after(self._committed, self.total_samples, self.global_batch),
                "total_samples": self.total_samples,
                "global_batch": self.global_batch,
                "lost_samples": self._lost_steps * self.global_batch,
                "step_time_s": prog.get("step_time_s"),
                "samples_per_second": prog.get("samples_per_second"),
                "loss": prog.get("loss"),
                "size_since": self._size_since,
                "last_rescale": cur.public() if cur else None,
                "finished": self._phase == PH_FINISHED,
                "failed": self._phase == PH_FAILED,
                "error": self._error,
                "ready": sorted(n for n, w in self._workers.items() if w.state == W_READY),
                "lost": sorted(n for n, w in self._workers.items() if w.lost),
                "workers": {n: w.state for n, w in self._workers.items()},
            }

    def generations(self) -> list[dict]:
        """Every generation so far, oldest first (timestamps, members, per-rank checksums)."""
        with self._lock:
            return [g.public() for g in self._gens]

    def close(self, grace_s: float = 2.0, wait: bool = True) -> None:
        """Tell every worker to exit (a running group stops at a step boundary; its rank 0
        checkpoints), give them up to `grace_s` to say so, then stop serving the store.
        With wait=False this returns at once and the coordinator's thread finishes the job."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._close_deadline = time.monotonic() + grace_s
        self._wake.set()
        if wait:
            self._thread.join(max(0.0, self._close_deadline - time.monotonic()) + 2.0)
            self._release()

    def _release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            store, self._store = self._store, None
        del store          # the server thread goes with the last reference

    # ------------------------------------------------------------------ decisions (under the lock)
    def _target_nodes(self) -> list[str]:
        if self._pending is not None:
            return list(self._pending.nodes)
        if self._current is not None and self._phase in (PH_RUNNING, PH_STOPPING):
            return list(self._current.members)
        return []

    def _set_pending(self, nodes: list[str], reason: str,
                     since: Optional[tuple[float, float]] = None) -> None:
        """`since` (wall, monotonic): when the need arose, if before now."""
        wall, mono = since or (time.time(), time.monotonic())
        if self._pending is None:
            self._pending = _Pending(self._last_gen + 1, nodes, reason, wall, mono)
        else:
            self._pending.nodes = nodes
            if reason == "regroup":      # the caller's decision time wins over automatic ones
                self._pending.reason = reason

    def _mark_gone(self, w: _Worker, why: str, exited: bool = False) -> None:
        if w.state != W_GONE and not exited and not w.exit_sent and self._store is not None:
            try:                         # in case it is alive after all (hung, replaced): leave
                self._send(w.node, {"op": P.OP_EXIT}, w)
                w.exit_sent = True
            except Exception:  # noqa: BLE001
                pass
        w.state = W_GONE
        w.exit_reason = w.exit_reason or why
        if self._pending is not None and w.node in self._pending.nodes:
            self._pending.nodes.remove(w.node)
        cur = self._current
        if cur is not None and self._phase in (PH_RUNNING, PH_STOPPING) \
                and cur.incarnations.get(w.node) == w.inc and w.node not in cur.stopped:
            cur.failed = True
            if self._pending is None:
                self._set_pending([n for n in cur.members if n != w.node and
                                   not self._left(cur, n)], "node_lost")

    def _left(self, g: Generation, node: str) -> bool:
        """The worker that was `node`'s member of `g` is gone (or was replaced)."""
        w = self._workers.get(node)
        return w is None or w.inc != g.incarnations.get(node) or w.state == W_GONE

    def _send(self, node: str, cmd: dict, w: Optional[_Worker] = None) -> None:
        w = w or self._workers[node]
        self._store.set(P.cmd_key(node, w.inc, w.cmd_next), P.encode(cmd))
        w.cmd_next += 1

    def _drive(self) -> None:
        now_m = time.monotonic()
        cur = self._current
        if self._phase in (PH_FINISHED, PH_FAILED) or self._closing:
            self._send_exits(all_workers=True)
            return
        if self._phase == PH_RUNNING and cur is not None and self._pending is not None:
            pend = self._pending
            waiting = [n for n in pend.nodes if self._workers[n].state in (W_STARTING, W_WARMING)]
            if waiting and now_m - pend.req_mono > self.ready_timeout_s:
                log.warning("job %s: %s not ready after %.0f s, regrouping without them",
                            self.job_id, waiting, self.ready_timeout_s)
                pend.nodes = [n for n in pend.nodes if n not in waiting]
                waiting = []
            if not waiting or cur.failed:
                self._stop_current()
        if self._phase == PH_STOPPING and cur is not None:
            if all(m in cur.stopped or self._left(cur, m) for m in cur.members):
                self._end_current()
        if self._phase == PH_IDLE:
            self._start_next(now_m)
        self._send_exits(all_workers=False)

    def _stop_current(self) -> None:
        cur = self._current
        assert cur is not None
        self._phase = PH_STOPPING
        if self._last_stop is None:
            self._last_stop = (time.time(), time.monotonic())
        for m in cur.members:
            if not self._left(cur, m) and m not in cur.stopped:
                self._send(m, {"op": P.OP_STOP, "gen": cur.gen})

    def _end_current(self) -> None:
        cur = self._current
        assert cur is not None
        cur.ended_at = time.time()
        reasons = {s["reason"] for s in cur.stopped.values()}
        steps = [s["step"] for s in cur.stopped.values()]
        if steps:
            cur.end_step = max(steps)
            self._set_committed(max(self._committed, cur.end_step))
        if P.STOP_FAILED in reasons:
            cur.failed = True
        self._phase = PH_IDLE
        self._size_since = None
        if P.STOP_FINISHED in reasons:
            self._phase = PH_FINISHED
            self._set_committed(self.total_steps)
            self._pending = None
            return
        if cur.failed and cur.first_step_at is None:
            self._failures_in_row += 1
            if self._failures_in_row >= self.max_failed_generations:
                self._phase = PH_FAILED
                errors = [s.get("error") for s in cur.stopped.values() if s.get("error")]
                self._error = (f"{self._failures_in_row} generations in a row failed before "
                               f"their first step: {errors[:1]}")
                self._pending = None
                return
        if self._pending is None:
            survivors = [m for m in cur.members if not self._left(cur, m)
                         and self._workers[m].state == W_READY]
            if survivors != cur.members or cur.failed:
                # the group stopped on its own (a rank left or failed): the decision is the
                # moment the coordinator saw it stop
                self._set_pending(survivors, "failure" if cur.failed else "leave", self._last_stop)

    def _start_next(self, now_m: float) -> None:
        pend = self._pending
        if pend is None:
            return
        nodes = [n for n in pend.nodes if self._workers[n].state != W_GONE]
        waiting = [n for n in nodes if self._workers[n].state in (W_STARTING, W_WARMING)]
        if waiting and now_m - pend.req_mono <= self.ready_timeout_s:
            return                       # nothing is running: just wait for the warm-up
        nodes = [n for n in nodes if self._workers[n].state == W_READY]
        self._pending = None
        prev = self._current
        switch, self._last_stop = self._last_stop, None
        if not nodes:                    # paused at 0 nodes
            return
        requested = (pend.requested_at, pend.req_mono)
        if switch is not None and switch[1] < requested[1]:
            requested = switch           # the group stopped (a peer died) before anyone asked
        g = Generation(pend.gen, nodes, pend.reason,
                       prev_size=len(prev.members) if prev is not None and switch else 0,
                       requested_at=requested[0], _req_mono=requested[1])
        g.switch_at, g._switch_mono = switch or (time.time(), time.monotonic())
        g.published_at = time.time()
        self._gens.append(g)
        self._current = g
        self._last_gen = g.gen
        self._phase = PH_RUNNING
        for rank, n in enumerate(nodes):
            self._workers[n].state = W_RUNNING
            g.incarnations[n] = self._workers[n].inc
            self._send(n, {"op": P.OP_RUN, "gen": g.gen, "rank": rank, "world": len(nodes),
                           "members": nodes})

    def _send_exits(self, all_workers: bool) -> None:
        cur = self._current
        busy = set(cur.members) if cur is not None and self._phase in (PH_RUNNING, PH_STOPPING) else set()
        target = set(self._pending.nodes) if self._pending else set()
        for w in self._workers.values():
            if w.state == W_GONE or w.exit_sent:
                continue
            if all_workers or (w.dismissed and w.node not in busy and w.node not in target):
                if w.state == W_RUNNING and cur is not None and self._phase == PH_RUNNING:
                    self._send(w.node, {"op": P.OP_STOP, "gen": cur.gen})
                self._send(w.node, {"op": P.OP_EXIT})
                w.exit_sent = True

    def _set_committed(self, step: int) -> None:
        if step < self._committed:
            self._lost_steps += self._committed - step
        self._committed = step
        self._max_committed = max(self._max_committed, step)

    # ------------------------------------------------------------------ events (under the lock)
    def _handle(self, msg: dict) -> None:
        w = self._workers.get(msg.get("node", ""))
        if w is None or msg.get("inc") != w.inc:
            return                       # an older process on that node
        kind = msg.get("ev")
        w.pid = msg.get("pid", w.pid)
        if kind == P.EV_HELLO:
            w.connected, w.host, w.hb_seen = True, msg.get("host"), time.monotonic()
            if w.state == W_STARTING:
                w.state = W_WARMING
        elif kind == P.EV_READY:
            w.step = int(msg.get("step", 0))
            if w.state in (W_STARTING, W_WARMING):
                w.state = W_READY
        elif kind == P.EV_SYNCED:
            g = self._gen(msg["gen"])
            if g is None:
                return
            g.synced[w.node] = {"rank": msg["rank"], "step": msg["step"], "src": msg.get("src"),
                                "restored": bool(msg.get("restored")),
                                "checksum": msg.get("checksum")}
            if len(g.synced) == len(g.members) and g.synced_at is None:
                g.synced_at = time.time()
            if g is self._current:
                g.start_step = int(msg["step"])
                self._set_committed(int(msg["step"]))
        elif kind == P.EV_FIRST_STEP:
            g = self._gen(msg["gen"])
            if g is None or g.first_step_at is not None:
                return
            now, now_m = time.time(), time.monotonic()
            g.first_step_at = now
            g.decision_s = now_m - g._req_mono
            g.switch_s = now_m - g._switch_mono if g._switch_mono is not None else None
            if g is self._current:
                self._size_since = now
                self._failures_in_row = 0
                self._set_committed(max(self._committed, int(msg["step"])))
        elif kind == P.EV_STOPPED:
            g = self._gen(msg["gen"])
            if g is None:
                return
            reason = msg.get("reason", "")
            g.stopped[w.node] = {"step": msg["step"], "reason": reason,
                                 "checksum": msg.get("checksum"), "error": msg.get("error", "")}
            w.step = int(msg["step"])
            if w.state == W_RUNNING:
                w.state = W_READY if reason in (P.STOP_ASKED, P.STOP_FAILED) else W_EXITING
            if reason == P.STOP_LEAVING:
                w.exit_reason = "leaving"
            if g is self._current and self._phase == PH_RUNNING:
                if reason == P.STOP_FAILED:
                    g.failed = True
                self._stop_current()
        elif kind == P.EV_EXIT:
            w.exit_reason = w.exit_reason if w.exit_reason == "leaving" else msg.get("reason", "exit")
            self._mark_gone(w, msg.get("reason", "exit"), exited=True)

    def _gen(self, number: Any) -> Optional[Generation]:
        for g in reversed(self._gens):
            if g.gen == number:
                return g
        return None

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            try:
                with self._lock:
                    if self._closed:
                        return
                    self._poll_events()
                    self._poll_progress_and_heartbeats()
                    self._drive()
                    busy = (self._pending is not None or self._phase == PH_STOPPING or
                            (self._current is not None and self._phase == PH_RUNNING and
                             self._current.first_step_at is None))
                    if self._closing and (time.monotonic() >= self._close_deadline or all(
                            w.state == W_GONE or not w.connected for w in self._workers.values())):
                        self._release()
                        return
            except Exception:  # noqa: BLE001 - keep coordinating; the store may be gone at close
                if self._closing or self._closed:
                    self._release()
                    return
                log.exception("job %s: coordinator loop", self.job_id)
                busy = False
            self._wake.wait(0.002 if busy or self._closing else 0.02)
            self._wake.clear()

    def _poll_events(self) -> None:
        store = self._store
        while True:
            key = P.event_key(self._ev_next)
            if store.check([key]):
                raw = store.get(key)
                store.delete_key(key)
                self._ev_next += 1
                self._gap_since = None
                try:
                    self._handle(P.decode(raw))
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("job %s: bad worker event %r: %s", self.job_id, raw[:200], e)
                continue
            # a worker that died between `add` and `set` leaves a hole: skip it after 2 s
            now = time.monotonic()
            if now - self._last_gap_check > 0.5:
                self._last_gap_check = now
                if store.add(P.EVENT_COUNTER, 0) >= self._ev_next:
                    if self._gap_since is None:
                        self._gap_since = now
                    elif now - self._gap_since > 2.0:
                        self._ev_next += 1
                        self._gap_since = None
                        continue
            return

    def _poll_progress_and_heartbeats(self) -> None:
        now = time.monotonic()
        if now - self._last_progress_read >= P.PROGRESS_S / 2:
            self._last_progress_read = now
            prog = P.decode(self._store.get(P.PROGRESS))
            cur = self._current
            if prog and cur is not None and prog.get("gen") == cur.gen:
                self._progress = prog
                if self._phase == PH_RUNNING and int(prog.get("step", 0)) > self._committed:
                    self._set_committed(int(prog["step"]))
        if now - self._last_hb_check >= P.HEARTBEAT_S:
            self._last_hb_check = now
            live = [w for w in self._workers.values() if w.connected and w.state != W_GONE]
            if not live:
                return
            values = self._store.multi_get([P.heartbeat_key(w.node, w.inc) for w in live])
            for w, v in zip(live, values):
                if v != w.hb_value:
                    w.hb_value, w.hb_seen = v, now
                elif now - w.hb_seen > self.heartbeat_timeout_s:
                    log.warning("job %s: worker on %s silent for %.0f s: lost", self.job_id,
                                w.node, now - w.hb_seen)
                    w.lost = True
                    self._mark_gone(w, "heartbeat")
