"""Controller side of the elastic runtime: one JobCoordinator per running job.

The coordinator has the job's TCPStore served by a process of its own (core/runtime/storehost.py:
bounded descriptors, memory and connections per peer; what is not the job's is deleted) and
drives its workers (core.runtime.elastic) through generations; see core/runtime/protocol.py for the keys. It only executes: the rules (when to stop,
whom to run, what a loss or a dismissal means) are `RegroupMachine`'s (core/runtime/regroup.py,
with the regroup sequence). Every public method is non-blocking: it hands a message to the
machine under a lock and wakes a daemon thread, which does the store I/O (polling worker events
every 2 ms while a regroup is in flight, 20 ms otherwise) and writes the commands that come out.

The coordinator never kills processes: the dispatcher starts them with `worker_env(node)`, stops
them with `dismiss(node)` (clean exit), SIGTERM (clean, worker-initiated leave) or SIGKILL followed
by `node_lost(node)`, and reaps them. Every `worker_env(node)` call is a new *incarnation* of the
node's worker (HARVEST_INCARNATION); pass it to `node_lost`/`dismiss` when the call can arrive after
a newer worker was started on the same node. A worker whose heartbeat stops for
`heartbeat_timeout_s` (hung, partitioned) is treated as lost and appears in `status()["lost"]`.

Store security: every key lives under a namespace derived from a per-job secret and every value
carries an HMAC under it (core/runtime/signing.py); the workers get the secret in their private
environment (HARVEST_STORE_SECRET). A non-member's writes read as absent, but TCPStore has no
authentication: anyone who reaches the port can read values, list keys and delete or overwrite
them (denial of service), which the store process bounds: at worst it ends and the job's store
is down (`status()["store_down"]`), never the harvester. The store listens on every interface
unless `bind_host` names one address; keep the port inside the cluster network. The per-job
token protects the HTTP progress reports only.
"""
from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
import weakref
from datetime import timedelta
from typing import Optional, Sequence

import torch.distributed as dist

from . import protocol as P
from .regroup import W_GONE, Instant, RegroupMachine, Send
from .signing import SignedStore, signed
from .storehost import StoreHost, StoreLimits

__all__ = ["JobCoordinator"]

log = logging.getLogger("harvest.coordinator")

_live: "weakref.WeakSet[JobCoordinator]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A coordinator thread still inside a store call when the interpreter finalises would
    abort the controller process: close what the caller left open."""
    for coord in list(_live):
        coord.close(grace_s=0.5)


def _now() -> Instant:
    return Instant(time.time(), time.monotonic())


class JobCoordinator:
    """Controller-side coordinator of one elastic job (see the module docstring)."""

    def __init__(self, job_id: str, global_batch: int, total_samples: int, host: str = "127.0.0.1",
                 port: int = 0, pg_timeout_s: float = 10.0, *, report_url: Optional[str] = None,
                 token: Optional[str] = None, ready_timeout_s: float = 300.0,
                 heartbeat_timeout_s: float = 15.0, checksums: bool = True,
                 max_failed_generations: int = 3, checkpoint_dir: Optional[str] = None,
                 extra_env: Optional[dict[str, str]] = None,
                 bind_host: Optional[str] = None, secret: Optional[str] = None,
                 orphan_s: float = 0.0, store_limits: StoreLimits = StoreLimits()) -> None:
        """`port`, `secret` and `token` of an earlier coordinator of the job (the harvester
        restarted) make this one the store its workers redial; `orphan_s`: how long a worker
        trains on and redials when the store goes away (HARVEST_ORPHAN_S); `store_limits`: what
        the job's store process may hold (core/runtime/storehost.py)."""
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
        self._machine = RegroupMachine(self.global_batch, self.total_samples,
                                       ready_timeout_s=self.ready_timeout_s,
                                       heartbeat_timeout_s=self.heartbeat_timeout_s,
                                       max_failed_generations=self.max_failed_generations,
                                       job_id=job_id)
        self.secret = secret or secrets.token_hex(16)     # workers get it in their environment only
        self.orphan_s = float(orphan_s)
        self.bind_host = bind_host
        timeout = timedelta(seconds=max(30.0, 3 * self.pg_timeout_s))
        self._host = StoreHost.start(host, port, bind_host, self.secret, timeout.total_seconds(), store_limits)
        dial = host if bind_host in (None, "0.0.0.0", "::", "") else bind_host
        try:
            self._server: Optional[dist.TCPStore] = dist.TCPStore(dial, self._host.port, None, False, timeout=timeout)
        except Exception:
            self._host.stop()
            raise
        self.address: tuple[str, int] = (host, int(self._host.port))
        self.store_down: Optional[str] = None     # why the job's store process ended under it
        self._store: Optional[SignedStore] = signed(self._server, self.secret,
                                                    timeout.total_seconds())
        self._store.set(P.META, P.encode({"job": job_id, "global_batch": self.global_batch,
                                          "total_samples": self.total_samples,
                                          "total_steps": self.total_steps,
                                          "pg_timeout_s": self.pg_timeout_s}))
        self._store.set(P.PROGRESS, "{}")
        self._hb_seen: dict[tuple[str, int], int] = {}   # highest genuine heartbeat per worker
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._cmd_next: dict[tuple[str, int], int] = {}    # (node, incarnation) -> next command
        self._ev_next = 1
        self._gap_since: Optional[float] = None
        self._last_gap_check = 0.0
        self._last_progress_read = 0.0
        self._last_hb_check = 0.0
        self._closing = False
        self._close_deadline = 0.0
        self._closed = False
        self._forged = 0
        self._thread = threading.Thread(target=self._run, name=f"coord-{job_id}", daemon=True)
        self._thread.start()
        _live.add(self)

    # ------------------------------------------------------------------ public API
    def worker_env(self, node: str) -> dict[str, str]:
        """Environment for a new worker process on `node` (each call is a new incarnation: the
        previous process on that node, if any, is forgotten)."""
        with self._lock:
            inc, cmds = self._machine.worker_started(node, _now())
            self._execute(cmds)
        host, port = self.address
        env = {P.ENV_STORE: f"{host}:{port}", P.ENV_JOB: self.job_id, P.ENV_NODE: node,
               P.ENV_INCARNATION: str(inc), P.ENV_TOKEN: self.token, P.ENV_SECRET: self.secret,
               P.ENV_GLOBAL_BATCH: str(self.global_batch),
               P.ENV_TOTAL_SAMPLES: str(self.total_samples),
               P.ENV_PG_TIMEOUT: str(self.pg_timeout_s),
               P.ENV_CHECKSUMS: "1" if self.checksums else "0"}
        if self.orphan_s > 0:
            env[P.ENV_ORPHAN] = f"{self.orphan_s:g}"
        if self.report_url:
            env[P.ENV_REPORT_URL] = self.report_url
        if host.startswith("127.") or host in ("localhost", "::1"):
            env["GLOO_SOCKET_IFNAME"] = "lo"      # gloo would pick the hostname's interface
        env.update(self.extra_env)
        return env

    def ready(self) -> set[str]:
        """Nodes whose worker is warmed up and waiting for an assignment (not in a running group)."""
        with self._lock:
            return self._machine.ready_nodes()

    def regroup(self, nodes: list[str]) -> int:
        """Run the job on exactly `nodes` from the next generation on (ranks in this order; put the
        survivors first). Returns at once with the number that generation will have; a regroup()
        before that one started replaces it (same number). Nodes whose worker is gone are left out.
        An empty list pauses the job (0 nodes; the workers stay, waiting)."""
        with self._lock:
            gen = self._machine.regroup(nodes, _now())
        self._wake.set()
        return gen

    def dismiss(self, node: str, incarnation: Optional[int] = None) -> None:
        """The worker on `node` leaves (after the group regrouped without it) and exits 0.
        `incarnation` (HARVEST_INCARNATION of its env): act only if that worker is still the
        node's current one, never on a newer worker started there since."""
        with self._lock:
            self._machine.dismiss(node, incarnation, _now())
        self._wake.set()

    def node_lost(self, node: str, incarnation: Optional[int] = None) -> None:
        """The dispatcher saw the worker on `node` die (or cannot reach it): regroup without it.
        Pass `incarnation` (HARVEST_INCARNATION of the env it started with) whenever the call may
        come after a new worker was started on the node: without it the newest one is meant."""
        self.workers_lost([(node, incarnation)])

    def workers_lost(self, workers: list[tuple[str, Optional[int]]]) -> None:
        """`node_lost` for several workers at once (every rank of a node that went): one
        decision, so the next generation is formed without all of them, never with a part."""
        with self._lock:
            now = _now()
            for node, incarnation in workers:
                self._execute(self._machine.node_lost(node, incarnation, now))
        self._wake.set()

    def heard_within(self, keys: Sequence[str], seconds: float) -> bool:
        """Whether a heartbeat of any of these workers arrived in the last `seconds`: a second
        channel to the node, so that one slow liveness check does not make it lost."""
        t = time.monotonic()
        with self._lock:
            return any(w is not None and w.connected and t - w.hb_seen < seconds
                       for w in (self._machine.workers.get(k) for k in keys))

    def silent_workers(self) -> list[tuple[str, int]]:
        """(key, incarnation) of the workers lost because their heartbeat stopped (hung,
        stopped, cut off): their processes may still exist, and the dispatcher takes them out."""
        with self._lock:
            return [(w.node, w.inc) for w in self._machine.workers.values()
                    if w.lost and w.exit_reason == "heartbeat"]

    def rejoined(self) -> dict[str, tuple[int, Optional[int]]]:
        """Workers known and not gone, key -> (incarnation, pid): after a restart, those that
        rejoined (their processes are adopted by the dispatcher)."""
        with self._lock:
            return {k: (w.inc, w.pid) for k, w in self._machine.workers.items()
                    if w.connected and w.state != W_GONE}

    def status(self) -> dict:
        """The machine's status, plus `forged_reads`: values read from the store whose tag was
        not the job's (written by a non-member), each time one was read."""
        with self._lock:
            store = self._store
            return {"job": self.job_id, "store": "%s:%d" % self.address,
                    "forged_reads": self._forged if store is None else store.rejected,
                    "store_host": self._host.snapshot(), "store_down": self.store_down,
                    **self._machine.status()}

    def generations(self) -> list[dict]:
        """Every generation so far, oldest first (timestamps, members, per-rank checksums)."""
        with self._lock:
            return self._machine.generations()

    def close(self, grace_s: float = 2.0, wait: bool = True) -> None:
        """Tell every worker to exit (a running group stops at a step boundary; its rank 0
        checkpoints), give them up to `grace_s` to say so, then stop serving the store.
        With wait=False this returns at once and the coordinator's thread finishes the job."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._close_deadline = time.monotonic() + grace_s
                self._machine.close()
        self._wake.set()
        if wait:
            self._thread.join(max(0.0, self._close_deadline - time.monotonic()) + 2.0)
            self._release()

    def _release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._forged = self._store.rejected if self._store is not None else self._forged
            store, server, self._store, self._server = self._store, self._server, None, None
        del store, server
        self._host.stop()

    # ------------------------------------------------------------------ executing commands
    def _execute(self, cmds: list[Send]) -> None:
        """Write the machine's commands to the workers' command streams, in order (under the lock)."""
        for c in cmds:
            if self._store is None:
                return                   # released: nobody reads commands any more
            key = (c.node, c.inc)
            k = self._cmd_next.get(key, 0)
            try:
                self._store.set(P.cmd_key(c.node, c.inc, k), P.encode(c.msg))
            except Exception:  # noqa: BLE001 - a worker given up on: best effort only
                if not c.best_effort:
                    raise
                continue
            self._cmd_next[key] = k + 1

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            try:
                with self._lock:
                    if self._closed:
                        return
                    self._poll_events()
                    self._poll_progress_and_heartbeats()
                    self._execute(self._machine.tick(_now()))
                    busy = self._machine.busy()
                    if self._closing and (time.monotonic() >= self._close_deadline or
                                          self._machine.quiet()):
                        self._release()
                        return
            except Exception:  # noqa: BLE001 - keep coordinating; the store may be gone at close
                if self._closing or self._closed:
                    self._release()
                    return
                if not self._host.alive():
                    self.store_down = self._host.failure()
                    log.warning("job %s: its store process ended: %s", self.job_id, self.store_down)
                    self._release()
                    return
                log.exception("job %s: coordinator loop", self.job_id)
                busy = False
            self._wake.wait(0.002 if busy or self._closing else 0.02)
            self._wake.clear()

    def _poll_events(self) -> None:
        store = self._store
        assert store is not None
        while True:
            key = P.event_key(self._ev_next)
            raw = store.read(key)           # None: absent, or forged (the worker's set follows)
            if raw is not None:
                store.delete_key(key)
                self._ev_next += 1
                self._gap_since = None
                try:
                    msg = P.decode(raw)
                    if msg.get("ev") == P.EV_REJOIN:      # its command stream goes on where it is
                        key = (str(msg["node"]), int(msg["inc"]))
                        self._cmd_next[key] = max(self._cmd_next.get(key, 0), int(msg["k"]))
                    cmds = self._machine.worker_event(msg, _now())
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("job %s: bad worker event %r: %s", self.job_id, raw[:200], e)
                    continue
                self._execute(cmds)
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
        store = self._store
        assert store is not None
        now = time.monotonic()
        if now - self._last_progress_read >= P.PROGRESS_S / 2:
            self._last_progress_read = now
            raw = store.read(P.PROGRESS)
            if raw is not None:
                self._machine.progress_read(P.decode(raw))
        if now - self._last_hb_check >= P.HEARTBEAT_S:
            self._last_hb_check = now
            keys = self._machine.heartbeat_keys()
            if not keys:
                return
            readings = {k: self._heartbeat(store, *k) for k in keys}
            self._execute(self._machine.heartbeats(readings, _now()))

    def _heartbeat(self, store: SignedStore, node: str, inc: int) -> Optional[bytes]:
        """The worker's heartbeat counter if genuine and higher than any seen before, else None
        (no news: neither a forged value nor a replayed older one keeps a worker alive)."""
        raw = store.read(P.heartbeat_key(node, inc))
        try:
            beats = int(raw) if raw is not None else -1
        except ValueError:
            return None
        if beats <= self._hb_seen.get((node, inc), -1):
            return None
        self._hb_seen[(node, inc)] = beats
        return raw
