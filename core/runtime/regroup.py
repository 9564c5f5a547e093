"""The regroup rules of one elastic job, apart from any I/O: what the coordinator decides.

`RegroupMachine` holds the plain state of a job (workers, generations, the pending regroup, the
committed step); messages go in (calls from the dispatcher, worker events, heartbeat readings,
time passing) and store writes come out as `Send` commands that `JobCoordinator` executes. It has
no thread, no socket and no clock: every message carries the time (`Instant`). Like
torch.distributed.elastic's rendezvous state machine, this keeps the rules testable without
processes (tests/test_regroup.py).

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

Every new worker on a node is a new *incarnation* of it: events, losses and dismissals that name
an older incarnation are ignored, so late news about a replaced process never hits its successor.
A worker whose heartbeat has not changed for `heartbeat_timeout_s` (hung, partitioned) is lost.

After a harvester restart a new machine starts empty and adopts the workers that `rejoin` (they
trained on while the store was away, see core/runtime/background.py): the generation they still
run becomes the current one, so training goes on without a regroup.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import protocol as P
from .ranks import nodes_of

LOSS_POINTS = 200      # the loss history kept per job: thinned to every other point past twice this

__all__ = ["Instant", "Send", "Generation", "Worker", "Pending", "RegroupState", "RegroupMachine"]

log = logging.getLogger("harvest.coordinator")

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


@dataclass(frozen=True)
class Instant:
    """A moment as both clocks read it: wall time for reports, monotonic time for durations."""

    wall: float
    mono: float


@dataclass(frozen=True)
class Send:
    """Command out: write `msg` to the command stream of worker (`node`, `inc`). A best-effort
    send goes to a worker already given up on (it may be alive after all): failing is fine."""

    node: str
    inc: int
    msg: dict
    best_effort: bool = False

    @property
    def op(self) -> str:
        return self.msg["op"]


@dataclass
class Worker:
    node: str
    inc: int
    state: str = W_STARTING
    pid: Optional[int] = None
    host: Optional[str] = None
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
    prev_size: int = 0                           # ranks of the previous generation
    prev_nodes: int = 0                          # nodes of the previous generation
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
class Pending:
    """The next generation as decided so far (nodes still change until it starts)."""

    gen: int
    nodes: list[str]
    reason: str
    since: Instant


class RegroupState:
    """The plain state of one job's membership and what can be read from it; `RegroupMachine`
    changes it. Not thread-safe: the coordinator holds its lock around every call."""

    def __init__(self, global_batch: int, total_samples: int, *, ready_timeout_s: float = 300.0,
                 heartbeat_timeout_s: float = 15.0, max_failed_generations: int = 3,
                 job_id: str = "") -> None:
        self.job_id = job_id
        self.global_batch = int(global_batch)
        self.total_samples = int(total_samples)
        self.total_steps = P.total_steps(self.total_samples, self.global_batch)
        self.ready_timeout_s = float(ready_timeout_s)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.max_failed_generations = int(max_failed_generations)
        self.workers: dict[str, Worker] = {}
        self.incarnations: dict[str, int] = {}
        self.gens: list[Generation] = []
        self.current: Optional[Generation] = None
        self.last_gen = 0
        self.phase = PH_IDLE
        self.pending: Optional[Pending] = None
        self.committed = 0
        self.max_committed = 0
        self.lost_steps = 0
        self.progress: dict = {}
        self.losses: list[tuple[int, float]] = []     # (step, loss) as rank 0 reported them
        self.size_since: Optional[float] = None
        self.failures_in_row = 0
        self.error = ""
        self.last_stop: Optional[Instant] = None     # when stop was sent to the current group
        self.closing = False
        self._out: list[Send] = []            # commands decided, not yet handed out

    def ready_nodes(self) -> set[str]:
        return {n for n, w in self.workers.items() if w.state == W_READY}

    def busy(self) -> bool:
        """A regroup is in flight (the coordinator then polls faster)."""
        cur = self.current
        return (self.pending is not None or self.phase == PH_STOPPING or
                (cur is not None and self.phase == PH_RUNNING and cur.first_step_at is None))

    def quiet(self) -> bool:
        """No worker left that could still read a command."""
        return all(w.state == W_GONE or not w.connected for w in self.workers.values())

    def generations(self) -> list[dict]:
        return [g.public() for g in self.gens]

    def status(self) -> dict:
        cur, pend = self.current, self.pending
        running = self.phase in (PH_RUNNING, PH_STOPPING) and cur is not None
        prog = self.progress if running and self.progress.get("gen") == (cur.gen if cur else None) else {}
        return {
            "phase": self.phase,
            "generation": cur.gen if cur else 0,
            "world_size": len(cur.members) if running and cur else 0,
            "nodes": len(nodes_of(cur.members)) if running and cur else 0,
            "members": list(cur.members) if running and cur else [],
            "pending": list(pend.nodes) if pend else None,
            "pending_generation": pend.gen if pend else None,
            "regrouping": pend is not None or self.phase == PH_STOPPING or
                          (running and cur is not None and cur.first_step_at is None),
            "committed_step": self.committed,
            "total_steps": self.total_steps,
            "samples_done": P.samples_after(self.committed, self.total_samples, self.global_batch),
            "total_samples": self.total_samples,
            "global_batch": self.global_batch,
            "lost_samples": self.lost_steps * self.global_batch,
            "step_time_s": prog.get("step_time_s"),
            "samples_per_second": prog.get("samples_per_second"),
            "loss": prog.get("loss"),
            "losses": [list(p) for p in self.losses],
            "metrics": {k: v for k, v in (prog.get("metrics") or {}).items() if k != "rank_samples"},
            "size_since": self.size_since,
            "last_rescale": cur.public() if cur else None,
            "finished": self.phase == PH_FINISHED,
            "failed": self.phase == PH_FAILED,
            "error": self.error,
            "ready": sorted(self.ready_nodes()),
            "lost": sorted(n for n, w in self.workers.items() if w.lost),
            "workers": {n: w.state for n, w in self.workers.items()},
        }

    def heartbeat_keys(self) -> list[tuple[str, int]]:
        """(node, incarnation) of every worker whose heartbeat is watched."""
        return [(w.node, w.inc) for w in self.workers.values() if w.connected and w.state != W_GONE]

    def _gen(self, number: Any) -> Optional[Generation]:
        for g in reversed(self.gens):
            if g.gen == number:
                return g
        return None

    def _target_nodes(self) -> list[str]:
        if self.pending is not None:
            return list(self.pending.nodes)
        if self.current is not None and self.phase in (PH_RUNNING, PH_STOPPING):
            return list(self.current.members)
        return []

    def _left(self, g: Generation, node: str) -> bool:
        """The worker that was `node`'s member of `g` is gone (or was replaced)."""
        w = self.workers.get(node)
        return w is None or w.inc != g.incarnations.get(node) or w.state == W_GONE


class RegroupMachine(RegroupState):
    """The rules (see the module docstring): messages in, `Send` commands out. Methods that can
    emit commands return them, in the order they must be written."""

    # ------------------------------------------------------------------ messages from the dispatcher
    def worker_started(self, node: str, now: Instant) -> tuple[int, list[Send]]:
        """A new worker process gets an env for `node`: its incarnation (the previous one, if
        any, is given up on and told to exit)."""
        inc = self.incarnations.get(node, 0) + 1
        self.incarnations[node] = inc
        old = self.workers.get(node)
        if old is not None and old.state != W_GONE:
            self._mark_gone(old, "replaced", now)
        self.workers[node] = Worker(node, inc, started=now.mono)
        return inc, self._take()

    def regroup(self, nodes: list[str], now: Instant) -> int:
        """Ask for a generation on exactly `nodes`; the number it will have (emits nothing: the
        next `tick` acts on it)."""
        nodes = list(nodes)
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate nodes in {nodes}")
        unknown = [n for n in nodes if n not in self.workers]
        if unknown:
            raise ValueError(f"no worker was started on {unknown} (call worker_env first)")
        if self.phase in (PH_FINISHED, PH_FAILED):
            return self.last_gen
        nodes = [n for n in nodes if self.workers[n].state != W_GONE]
        cur = self.current
        if cur is not None and self.phase == PH_RUNNING and not cur.failed and nodes == cur.members:
            self.pending = None               # back to what runs: nothing to change
            return cur.gen
        self._set_pending(nodes, "regroup", now)
        assert self.pending is not None
        return self.pending.gen

    def dismiss(self, node: str, incarnation: Optional[int], now: Instant) -> None:
        """The worker leaves for good: regroup without it (its exit is sent once it is out)."""
        w = self.workers.get(node)
        if w is None or w.state == W_GONE or incarnation not in (None, w.inc):
            return
        w.dismissed = True
        target = self._target_nodes()
        if node in target:
            self._set_pending([n for n in target if n != node], "dismiss", now)

    def node_lost(self, node: str, incarnation: Optional[int], now: Instant) -> list[Send]:
        """The worker died or cannot be reached: its generation (if any) fails and regroups."""
        w = self.workers.get(node)
        if w is None or w.state == W_GONE or incarnation not in (None, w.inc):
            return []
        w.lost = True
        self._mark_gone(w, "lost", now)
        return self._take()

    def close(self) -> None:
        """From now on every worker is told to exit (a running group is stopped first)."""
        self.closing = True

    # ------------------------------------------------------------------ messages from the workers
    def worker_event(self, msg: dict, now: Instant) -> list[Send]:
        """One event a worker wrote (protocol.py); KeyError/ValueError/TypeError if malformed."""
        if msg.get("ev") == P.EV_REJOIN:
            self._on_rejoin(msg, now)
            return self._take()
        w = self.workers.get(msg.get("node", ""))
        if w is None or msg.get("inc") != w.inc:
            return []                         # an older process on that node
        w.pid = msg.get("pid", w.pid)
        handler = {P.EV_HELLO: self._on_hello, P.EV_READY: self._on_ready,
                   P.EV_SYNCED: self._on_synced, P.EV_FIRST_STEP: self._on_first_step,
                   P.EV_STOPPED: self._on_stopped, P.EV_EXIT: self._on_exit}.get(msg.get("ev"))
        if handler is not None:
            handler(w, msg, now)
        return self._take()

    def heartbeats(self, values: dict[tuple[str, int], Optional[bytes]], now: Instant) -> list[Send]:
        """Heartbeat values read at `now` (None: no genuine new value): a worker whose value has
        not changed for heartbeat_timeout_s is lost."""
        for (node, inc), v in values.items():
            w = self.workers.get(node)
            if w is None or w.inc != inc or not w.connected or w.state == W_GONE:
                continue
            if v is not None and v != w.hb_value:
                w.hb_value, w.hb_seen = v, now.mono
            elif now.mono - w.hb_seen > self.heartbeat_timeout_s:
                log.warning("job %s: worker on %s silent for %.0f s: lost", self.job_id, node,
                            now.mono - w.hb_seen)
                w.lost = True
                self._mark_gone(w, "heartbeat", now)
        return self._take()

    def progress_read(self, prog: dict) -> None:
        """Rank 0's latest progress record (only the running generation's counts; P.clean_progress)."""
        cur, prog = self.current, P.clean_progress(prog)
        if prog and cur is not None and prog.get("gen") == cur.gen:
            self.progress = prog
            self._keep_loss(int(prog.get("step", 0)), prog.get("loss"))
            if self.phase == PH_RUNNING and int(prog.get("step", 0)) > self.committed:
                self._set_committed(int(prog["step"]))

    def _keep_loss(self, step: int, loss: Any) -> None:
        """A bounded history of the loss, so a user sees the job learn (the job page, the API)."""
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return
        if self.losses and step <= self.losses[-1][0]:
            return
        self.losses.append((step, float(loss)))
        if len(self.losses) > 2 * LOSS_POINTS:
            self.losses = self.losses[::-2][::-1]         # every other point, the newest kept

    def tick(self, now: Instant) -> list[Send]:
        """Time passes: act on what is pending (stop, start the next generation, send exits)."""
        cur = self.current
        if self.phase in (PH_FINISHED, PH_FAILED) or self.closing:
            self._send_exits(all_workers=True)
            return self._take()
        if self.phase == PH_RUNNING and cur is not None and self.pending is not None:
            pend = self.pending
            waiting = [n for n in pend.nodes if self.workers[n].state in (W_STARTING, W_WARMING)]
            if waiting and now.mono - pend.since.mono > self.ready_timeout_s:
                log.warning("job %s: %s not ready after %.0f s, regrouping without them",
                            self.job_id, waiting, self.ready_timeout_s)
                pend.nodes = [n for n in pend.nodes if n not in waiting]
                waiting = []
            if not waiting or cur.failed:
                self._stop_current(now)
        if self.phase == PH_STOPPING and cur is not None:
            if all(m in cur.stopped or self._left(cur, m) for m in cur.members):
                self._end_current(now)
        if self.phase == PH_IDLE:
            self._start_next(now)
        self._send_exits(all_workers=False)
        return self._take()

    # ------------------------------------------------------------------ worker events
    def _on_rejoin(self, msg: dict, now: Instant) -> None:
        """A worker of an earlier coordinator (the harvester restarted) is back, with where it
        stands: it is adopted as it is. Workers still in a generation make it the running one
        again (it trained on meanwhile), so nothing stops; one whose generation failed meanwhile
        is ready, and a running generation it belonged to is stopped and regrouped."""
        node, inc = str(msg["node"]), int(msg["inc"])
        gen, step, running = int(msg["gen"]), int(msg["step"]), bool(msg["running"])
        members = [str(m) for m in msg.get("members") or []]
        old = self.workers.get(node)
        if old is not None and old.inc > inc:
            self._out.append(Send(node, inc, {"op": P.OP_EXIT}, best_effort=True))   # replaced since
            return
        self.incarnations[node] = max(self.incarnations.get(node, 0), inc)
        w = self.workers[node] = Worker(node, inc, W_READY, pid=msg.get("pid"), step=step,
                                        connected=True, hb_seen=now.mono, started=now.mono)
        self.last_gen = max(self.last_gen, gen)
        self._set_committed(max(self.committed, step))
        cur = self.current
        if running and node in members and (cur is None or cur.gen < gen):
            cur = self.current = Generation(gen, members, "resumed", requested_at=now.wall,
                                            published_at=now.wall, synced_at=now.wall,
                                            first_step_at=now.wall, start_step=step, _req_mono=now.mono)
            self.gens.append(cur)
            self.phase, self.size_since, self.pending = PH_RUNNING, now.wall, None
        if cur is None or cur.gen != gen or node not in cur.members or self.phase not in (PH_RUNNING, PH_STOPPING):
            if running:                      # an older generation than the one adopted: stop it
                self._send(w, {"op": P.OP_STOP, "gen": gen})
            return
        cur.incarnations[node] = inc
        if running:
            w.state = W_RUNNING
        else:                                # its group failed while nobody was listening
            cur.stopped[node] = {"step": step, "reason": P.STOP_FAILED, "checksum": None,
                                 "error": "the group failed while the coordinator was away"}
            cur.failed = True
            if self.phase == PH_RUNNING:
                self._stop_current(now)

    def _on_hello(self, w: Worker, msg: dict, now: Instant) -> None:
        w.connected, w.host, w.hb_seen = True, msg.get("host"), now.mono
        if w.state == W_STARTING:
            w.state = W_WARMING

    def _on_ready(self, w: Worker, msg: dict, now: Instant) -> None:
        w.step = int(msg.get("step", 0))
        if w.state in (W_STARTING, W_WARMING):
            w.state = W_READY

    def _on_synced(self, w: Worker, msg: dict, now: Instant) -> None:
        g = self._gen(msg["gen"])
        if g is None:
            return
        g.synced[w.node] = {"rank": msg["rank"], "step": msg["step"], "src": msg.get("src"),
                            "restored": bool(msg.get("restored")), "checksum": msg.get("checksum"),
                            "place": msg.get("place")}
        if len(g.synced) == len(g.members) and g.synced_at is None:
            g.synced_at = now.wall
        if g is self.current:
            g.start_step = int(msg["step"])
            self._set_committed(int(msg["step"]))

    def _on_first_step(self, w: Worker, msg: dict, now: Instant) -> None:
        g = self._gen(msg["gen"])
        if g is None or g.first_step_at is not None:
            return
        g.first_step_at = now.wall
        g.decision_s = now.mono - g._req_mono
        g.switch_s = now.mono - g._switch_mono if g._switch_mono is not None else None
        if g is self.current:
            self.size_since = now.wall
            self.failures_in_row = 0
            self._set_committed(max(self.committed, int(msg["step"])))

    def _on_stopped(self, w: Worker, msg: dict, now: Instant) -> None:
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
        if g is self.current and self.phase == PH_RUNNING:
            if reason == P.STOP_FAILED:
                g.failed = True
            self._stop_current(now)

    def _on_exit(self, w: Worker, msg: dict, now: Instant) -> None:
        w.exit_reason = w.exit_reason if w.exit_reason == "leaving" else msg.get("reason", "exit")
        self._mark_gone(w, msg.get("reason", "exit"), now, exited=True)

    # ------------------------------------------------------------------ rules
    def _take(self) -> list[Send]:
        out, self._out = self._out, []
        return out

    def _send(self, w: Worker, msg: dict, best_effort: bool = False) -> None:
        self._out.append(Send(w.node, w.inc, msg, best_effort))

    def _set_pending(self, nodes: list[str], reason: str, since: Instant) -> None:
        """`since`: when the need arose."""
        if self.pending is None:
            self.pending = Pending(self.last_gen + 1, nodes, reason, since)
        else:
            self.pending.nodes = nodes
            if reason == "regroup":       # the caller's decision time wins over automatic ones
                self.pending.reason = reason

    def _mark_gone(self, w: Worker, why: str, now: Instant, exited: bool = False) -> None:
        if w.state != W_GONE and not exited and not w.exit_sent:
            self._send(w, {"op": P.OP_EXIT}, best_effort=True)   # in case it is alive after all
            w.exit_sent = True
        w.state = W_GONE
        w.exit_reason = w.exit_reason or why
        if self.pending is not None and w.node in self.pending.nodes:
            self.pending.nodes.remove(w.node)
        cur = self.current
        if cur is not None and self.phase in (PH_RUNNING, PH_STOPPING) \
                and cur.incarnations.get(w.node) == w.inc and w.node not in cur.stopped:
            cur.failed = True
            if self.pending is None:
                self._set_pending([n for n in cur.members if n != w.node and
                                   not self._left(cur, n)], "node_lost", now)

    def _set_committed(self, step: int) -> None:
        if step < self.committed:
            self.lost_steps += self.committed - step
        self.committed = step
        self.max_committed = max(self.max_committed, step)

    def _stop_current(self, now: Instant) -> None:
        cur = self.current
        assert cur is not None
        self.phase = PH_STOPPING
        if self.last_stop is None:
            self.last_stop = now
        for m in cur.members:
            if not self._left(cur, m) and m not in cur.stopped:
                self._send(self.workers[m], {"op": P.OP_STOP, "gen": cur.gen})

    def _end_current(self, now: Instant) -> None:
        cur = self.current
        assert cur is not None
        cur.ended_at = now.wall
        reasons = {s["reason"] for s in cur.stopped.values()}
        steps = [s["step"] for s in cur.stopped.values()]
        if steps:
            cur.end_step = max(steps)
            self._set_committed(max(self.committed, cur.end_step))
        if P.STOP_FAILED in reasons:
            cur.failed = True
        self.phase = PH_IDLE
        self.size_since = None
        if P.STOP_FINISHED in reasons:
            self.phase = PH_FINISHED
            self._set_committed(self.total_steps)
            self.pending = None
            return
        if cur.failed and cur.first_step_at is None:
            self.failures_in_row += 1
            if self.failures_in_row >= self.max_failed_generations:
                self.phase = PH_FAILED
                errors = [s.get("error") for s in cur.stopped.values() if s.get("error")]
                self.error = (f"{self.failures_in_row} generations in a row failed before "
                              f"their first step: {errors[:1]}")
                self.pending = None
                return
        if self.pending is None:
            survivors = [m for m in cur.members if not self._left(cur, m)
                         and self.workers[m].state == W_READY]
            if survivors != cur.members or cur.failed:
                # the group stopped on its own (a rank left or failed): the decision is the
                # moment the coordinator saw it stop
                self._set_pending(survivors, "failure" if cur.failed else "leave",
                                  self.last_stop or now)

    def _start_next(self, now: Instant) -> None:
        pend = self.pending
        if pend is None:
            return
        nodes = [n for n in pend.nodes if self.workers[n].state != W_GONE]
        waiting = [n for n in nodes if self.workers[n].state in (W_STARTING, W_WARMING)]
        if waiting and now.mono - pend.since.mono <= self.ready_timeout_s:
            return                        # nothing is running: just wait for the warm-up
        nodes = [n for n in nodes if self.workers[n].state == W_READY]
        self.pending = None
        prev = self.current
        switch, self.last_stop = self.last_stop, None
        if not nodes:                     # paused at 0 nodes
            return
        requested = pend.since
        if switch is not None and switch.mono < requested.mono:
            requested = switch            # the group stopped (a peer died) before anyone asked
        g = Generation(pend.gen, nodes, pend.reason,
                       prev_size=len(prev.members) if prev is not None and switch else 0,
                       prev_nodes=len(nodes_of(prev.members)) if prev is not None and switch else 0,
                       requested_at=requested.wall, _req_mono=requested.mono)
        sw = switch or now
        g.switch_at, g._switch_mono = sw.wall, sw.mono
        g.published_at = now.wall
        self.gens.append(g)
        self.current = g
        self.last_gen = g.gen
        self.phase = PH_RUNNING
        for rank, n in enumerate(nodes):
            w = self.workers[n]
            w.state = W_RUNNING
            g.incarnations[n] = w.inc
            self._send(w, {"op": P.OP_RUN, "gen": g.gen, "rank": rank, "world": len(nodes),
                           "members": nodes})

    def _send_exits(self, all_workers: bool) -> None:
        cur = self.current
        busy = set(cur.members) if cur is not None and self.phase in (PH_RUNNING, PH_STOPPING) else set()
        target = set(self.pending.nodes) if self.pending else set()
        for w in self.workers.values():
            if w.state == W_GONE or w.exit_sent:
                continue
            if all_workers or (w.dismissed and w.node not in busy and w.node not in target):
                if w.state == W_RUNNING and cur is not None and self.phase == PH_RUNNING:
                    self._send(w, {"op": P.OP_STOP, "gen": cur.gen})
                self._send(w, {"op": P.OP_EXIT})
                w.exit_sent = True
