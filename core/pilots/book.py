"""The harvester's account of its pilots: which job holds which node, which pilots are
pending, surplus or failing, and what each node should be told. Pure bookkeeping and policy
under one lock, no scheduler command and no thread (core/pilots/source.py runs those), so every
rule here is the same whichever scheduler (Slurm, PBS), hub or clock drives it."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Collection, Mapping, Optional

from ..model import LEFT_LOST, LEFT_PREEMPTED, Event, EventKind
from . import script
from .backoff import SHORT_LIFE_S, PilotBackoff
from .link import PilotLink
from .base import BatchJob, BatchNode
from .script import Pilot
from .settings import PilotSettings

log = logging.getLogger(__name__)
#: a node whose pilot the scheduler just signalled is the main job's: between the pilot's end and the main
#: job's start (up to a second or two on a busy slurmctld) sinfo shows it idle, and a pilot sent
#: then only waits behind the main job to be cancelled: two RPCs and a scheduler pass for nothing.
#: It gets no pilot until a later sinfo shows it taken, or for this long if it never is.
RECLAIM_HOLD_S = 5.0
#: pilots known to be over (cancelled by us, or ended in squeue) kept after squeue stops listing
#: them as live: one on a node whose slurmd is gone is killed only when slurmd is back, maybe
#: hours later, and its redial or goodbye must not count as a new pilot or a main job's taking
OVER_KEEP = 4096


class PilotBook:
    def __init__(self, settings: PilotSettings, names: list[str], title: str = "Slurm",
                 log_of: Optional[Callable[[str], str]] = None) -> None:
        """`title`: the scheduler's name; `log_of`: a pilot's log file from its job id."""
        self.settings = s = settings
        self.title = title
        self.log_of = log_of or (lambda job: script.log_path(s, job))
        self.names = names                            # watched nodes, in the scheduler's order
        self.watched = set(names)
        self.pilots: dict[str, Pilot] = {}            # job id -> a pilot of ours not known to be over
        self.held: dict[str, str] = {}                # node -> the pilot whose hello made it a join
        self.events: list[Event] = []
        self._described: dict[str, tuple[tuple, str]] = {}   # node -> (what `describe` read, its words)
        self.demand = 0                               # nodes the jobs could use (`want`)
        self.in_use: frozenset[str] = frozenset()     # nodes the jobs hold
        self.adopted: list[str] = []                  # nodes of pilots an earlier run left running
        self.backoff = PilotBackoff(s.backoff_s, s.backoff_cap_s, s.submit_per_minute)
        self.lock = threading.Lock()
        self._surplus_since: Optional[float] = None   # monotonic: more pilots than demand since
        self._cancelled: set[str] = set()             # pilots we cancelled: their end is no failure
        self._over: dict[str, None] = {}              # pilots over (OVER_KEEP newest) that may still talk
        self._reclaimed: dict[str, float] = {}        # node -> monotonic: the scheduler signalled its pilot

    # ---- what the jobs want, what happened ----------------------------------------------------
    def want(self, nodes: int, in_use: Collection[str]) -> None:
        with self.lock:
            self.demand, self.in_use = max(0, int(nodes)), frozenset(in_use)

    def take_events(self) -> list[Event]:
        with self.lock:
            out, self.events = self.events, []
        return out

    def counts(self) -> tuple[int, int, int, int]:
        """(nodes held, of those used by jobs, pilots pending, nodes wanted)."""
        with self.lock:
            return (len(self.held), len(self.in_use & set(self.held)),
                    sum(1 for p in self.pilots.values() if not p.running), min(self.demand, self.settings.max_pilots))

    def cancelling(self, jobs: Collection[str]) -> None:
        """These pilots are being cancelled by us: their end is neither a failure nor a preemption."""
        with self.lock:
            self._cancelled |= set(jobs)

    def was_cancelled(self, job: str) -> bool:
        """Whether the harvester cancelled this pilot, or Slurm had ended its job already (its
        signal was ours or Slurm's cleanup, not a main job's)."""
        with self.lock:
            return job in self._cancelled or job in self._over

    # ---- pilots talking -----------------------------------------------------------------------
    def hello(self, link: PilotLink) -> str:
        """A pilot connected: 'join' (its node is harvested now), 'adopted' (a pilot of the
        earlier run redialed) or 'stray' (not wanted there: cancel it)."""
        with self.lock:
            p = self.pilots.get(link.job)
            if p is None:                      # its hello came before sbatch returned its id
                p = self.pilots[link.job] = Pilot(link.job, link.node, time.monotonic())
            adopted = p.adopted and p.node == link.node and self.held.get(link.node) == link.job
            p.node, p.running, p.adopted, p.hello_at = link.node, True, False, time.monotonic()
            if not adopted and (link.node not in self.watched or link.node in self.held
                                or link.job in self._cancelled or link.job in self._over):
                self.pilots.pop(link.job, None)
                return "stray"
            if adopted:
                return "adopted"
            self.held[link.node] = link.job
            self.events.append(Event(time.time(), EventKind.NODE_JOIN, node=link.node,
                                     detail=f"pilot {link.job} holds it"))
            return "join"

    def leave(self, link: PilotLink, why: str) -> bool:
        """A pilot's connection ended; whether its node stopped being harvested."""
        with self.lock:
            p = self.pilots.get(link.job)
            if p is not None and p.node == link.node:
                del self.pilots[link.job]
                self._judge(p, None, "" if link.leaving else "lost its connection")
            if link.leaving and link.job not in self._cancelled and link.job not in self._over:
                self._reclaimed[link.node] = time.monotonic()
            return self._release(link.node, link.job, why, LEFT_PREEMPTED if link.leaving else LEFT_LOST)

    def _judge(self, p: Pilot, job: Optional[BatchJob], how: str) -> None:
        """A pilot is over (under the lock): a failure against its node if it never connected,
        or ended unasked soon after it did; a clean bill if it held the node a while."""
        if p.job in self._cancelled or p.releasing or p.adopted:
            return
        now = time.monotonic()
        if p.running and now - (p.hello_at or now) > SHORT_LIFE_S:
            self.backoff.succeeded(p.node)
            return
        if job is not None and job.not_its_fault or p.running and (job is not None and not job.failed
                                                                            or job is None and not how):
            return                             # preempted, cancelled, timed out or told to leave
        if not how:
            how = "ended before it connected" if not p.running else "ended soon after it connected"
            how += f": {job.state}{f' ({job.reason})' if job.reason else ''}" if job is not None else ": gone from squeue"
        f = self.backoff.failed(p.node, script.why_failed(self.settings, p, how, self.log_of(p.job)), now)
        log.warning("%s; no pilot on %s for %.0f s (%d failure(s) in a row)", f.reason, p.node,
                    f.until - now, f.failures)

    def _release(self, node: str, job: str, why: str, cause: str = LEFT_PREEMPTED) -> bool:
        if self.held.get(node) != job:
            return False
        del self.held[node]
        self.events.append(Event(time.time(), EventKind.NODE_LEAVE, node=node, detail=why, cause=cause))
        return True

    # ---- what squeue says ---------------------------------------------------------------------
    def check(self, jobs: Mapping[str, BatchJob], known: set[str], slurm: Mapping[str, BatchNode]
              ) -> tuple[list[str], list[str], bool]:
        """The backstop, after a squeue: (pilots to cancel, pilots Slurm says are over, whether
        a node stopped being harvested). `known`: pilots submitted before squeue was asked."""
        cancel, dropped, left = [], [], False
        now = time.monotonic()
        with self.lock:
            for jid, p in list(self.pilots.items()):
                j = jobs.get(jid)
                if (j is None and jid in known) or (j is not None and (j.ended or j.suspended)):
                    del self.pilots[jid]
                    self._judge(p, j, "")
                    left |= self._release(p.node, jid, f"pilot {jid} {j.state.lower() if j else 'is gone'} (squeue)",
                                          LEFT_LOST if j is not None and j.failed else LEFT_PREEMPTED)
                    dropped.append(jid)
                elif j is not None and not p.running:
                    node = slurm.get(p.node)
                    taken = not j.running and (node is None or not node.free)
                    if taken or now - p.submitted > self.settings.pending_timeout_s:
                        cancel.append(jid)
                        del self.pilots[jid]
                        if j.running and not p.adopted:
                            self._judge(p, None, f"ran {now - p.submitted:.0f} s without connecting to "
                                                 f"the hub at {self.settings.dial_host}")
                        self._cancelled.add(jid)
                        if p.adopted:
                            left |= self._release(p.node, jid, f"pilot {jid} of the earlier run did not redial")
            live = {jid for jid, j in jobs.items() if not j.ended} | set(cancel)
            self._remember_over([*dropped, *(jid for jid in self._cancelled if jid not in live)])
            self._cancelled &= live
        return cancel, dropped, left

    def cancelled_alive(self, jobs: Mapping[str, BatchJob]) -> list[str]:
        """Pilots we cancelled that the scheduler still has (ending, or requeued under our delete)."""
        with self.lock:
            return [jid for jid in self._cancelled if jid in jobs and not jobs[jid].ended]

    def _remember_over(self, jobs: Collection[str]) -> None:
        for jid in jobs:
            self._over.pop(jid, None)
            self._over[jid] = None
        for jid in list(self._over)[:max(0, len(self._over) - OVER_KEEP)]:
            del self._over[jid]

    def unreachable(self, slurm: Mapping[str, BatchNode]) -> list[str]:
        """After a sinfo: the pilots on held nodes that Slurm says are down or not responding,
        to cancel. The node leaves now, `lost` (its own fault, not its job's nor its pilot's: no
        backoff): its pilot and workers may well run on (slurmd gone, the host up), but Slurm
        kills the pilot once SlurmdTimeout is up, and a dead host's pilot would not answer. Its
        connection is kept, so that its workers are stopped through it. The node is free again
        only when Slurm says it is idle (it responds, ReturnToService or staff resume it) and a
        new pilot holds it."""
        out = []
        with self.lock:
            for node, job in list(self.held.items()):
                n = slurm.get(node)
                if n is None or not n.unreachable:
                    continue
                self.pilots.pop(job, None)
                self._cancelled.add(job)
                self._release(node, job, f"{self.title} says {node} is {n.label}: pilot {job} is cancelled", LEFT_LOST)
                out.append(job)
        return out

    def trim(self) -> tuple[list[Pilot], list[Pilot]]:
        """The pilots beyond what the jobs could use, to cancel: (pending ones, at once, newest
        first; held ones no job uses, once the surplus has lasted `release_grace_s`: demand
        often returns within minutes, and a pilot goes back through Slurm's queue)."""
        now = time.monotonic()
        with self.lock:
            active = [p for p in self.pilots.values() if not p.releasing]
            surplus = len(active) - min(self.settings.max_pilots, self.demand)
            if surplus <= 0:
                self._surplus_since = None
                return [], []
            pending = [p for p in reversed(active) if not p.running and not p.adopted][:surplus]
            for p in pending:
                del self.pilots[p.job]
                self._cancelled.add(p.job)
            surplus -= len(pending)
            held: list[Pilot] = []
            if surplus <= 0:
                self._surplus_since = None
            elif self._surplus_since is None:
                self._surplus_since = now
            elif now - self._surplus_since >= self.settings.release_grace_s:
                order = {n: i for i, n in enumerate(self.names)}
                held = sorted((p for p in active if p.running and p.node not in self.in_use),
                              key=lambda p: -order.get(p.node, 0))[:surplus]
                for p in held:
                    p.releasing = True
                self._surplus_since = None
        return pending, held

    # ---- new pilots ---------------------------------------------------------------------------
    def free_nodes(self, slurm: Mapping[str, BatchNode], read_at: float = float("inf")) -> list[str]:
        """Watched nodes Slurm has idle, with no pilot of ours, not just reclaimed by a main job
        and not waiting after failed pilots, in machine order. `read_at`: when `slurm` was asked
        (monotonic): only a read after a reclaim can show the main job on the node."""
        now = time.monotonic()
        with self.lock:
            self._reclaimed = {n: t for n, t in self._reclaimed.items() if now - t < RECLAIM_HOLD_S
                               and not (read_at > t and n in slurm and slurm[n].runs_a_job)}
            taken = {p.node for p in self.pilots.values()} | set(self.held) | set(self._reclaimed)
            return [n for n in self.names if n not in taken and n in slurm and slurm[n].free
                    and not self.backoff.waiting(n, now)]

    def room(self) -> int:
        """How many pilots to submit now: within max_pilots, demand, the batch and, while any
        node's pilots are failing, the rate. The rate guards slurmctld against pilots that fail
        as fast as they are sent; healthy ones are paced by the batch alone, so a cold start on
        more nodes than the rate fills them all in one go (128 nodes under the default 120 a
        minute: the last 8 came a minute late, when growing onto them no longer paid)."""
        s = self.settings
        with self.lock:
            rate = self.backoff.room(time.monotonic()) if self.backoff.failing() else s.submit_batch
            return max(0, min(self._unpaced(), s.submit_batch, rate))

    def unpaced(self) -> int:
        """How many pilots would go now but for the batch and the rate: within max_pilots and demand."""
        with self.lock:
            return self._unpaced()

    def _unpaced(self) -> int:
        active = sum(1 for p in self.pilots.values() if not p.releasing)
        return max(0, min(self.settings.max_pilots - len(self.pilots), self.demand - active))

    def submitted(self, job: Optional[str], node: str, burst: int = 0) -> None:
        """sbatch was run for `node` (`job`: its id, None if it failed) in `burst` (JoinHold):
        it counts for the rate."""
        with self.lock:
            self.backoff.submitted(time.monotonic())
            if job is not None:
                self.pilots.setdefault(job, Pilot(job, node, time.monotonic())).burst = burst

    def burst_of(self, node: str) -> Optional[int]:
        """The burst of the pilot that holds `node` (None if none does, or it was adopted)."""
        with self.lock:
            p = self.pilots.get(self.held.get(node, ""))
            return p.burst if p is not None and p.burst else None

    def adopt(self, jobs: list[BatchJob], restarted: bool) -> list[str]:
        """An earlier run's live pilots: after a restart those running on a watched node keep
        it and are waited for; the others are returned, to cancel."""
        now, cancel = time.monotonic(), []
        with self.lock:
            for j in jobs:
                if self.held.get(j.node) == j.id:
                    continue          # it redialed before the leftovers were read: it holds its node already
                if restarted and j.running and j.node in self.watched and j.node not in self.held:
                    self.pilots[j.id] = Pilot(j.id, j.node, now, adopted=True)
                    self.held[j.node] = j.id
                    self.adopted.append(j.node)
                else:
                    cancel.append(j.id)
        return cancel

    def closing(self) -> list[str]:
        """The harvester stops: every pilot is cancelled (none of their ends is a failure)."""
        with self.lock:
            self._cancelled |= set(self.pilots)
            return list(self.pilots)

    def clear(self, node: str) -> bool:
        """Staff cleared a failing node; KeyError if it is not watched."""
        if node not in self.watched:
            raise KeyError(node)
        with self.lock:
            return self.backoff.clear(node)

    def describe(self, slurm: Mapping[str, BatchNode], would: Collection[str]) -> dict[str, str]:
        """Each watched node in words: the scheduler's state, our pilot there, its failures."""
        now, out = time.monotonic(), {}
        with self.lock:
            pilot_on = {p.node: p for p in self.pilots.values()}
            failing = self.backoff.failing()
        memo = self._described
        for name in self.names:
            n, p, f = slurm.get(name), pilot_on.get(name), failing.get(name)
            key = (n.label if n else None, name in would,
                   (p.job, p.releasing, p.running, p.adopted) if p is not None else None)
            if f is None and (seen := memo.get(name)) is not None and seen[0] == key:
                out[name] = seen[1]            # most nodes read as they did a second ago
                continue
            text = f"{self.title}: {n.label if n else 'unknown'}"
            if p is not None:
                text += f", pilot {p.job}" + (" releasing" if p.releasing else "" if p.running else
                                              " of the earlier run, redialing" if p.adopted else " pending")
            elif name in would:
                text += ", would harvest (dry run)"
            if f is not None:
                wait = f"next pilot in {f.until - now:.0f} s" if f.until > now else "may get a pilot again"
                text += f", {f.failures} failed pilot(s) in a row ({wait}): {f.reason}"
            out[name] = text
            memo[name] = (key, text)
        return out

    def failing_note(self) -> str:
        """For the source's badge: how many nodes are failing and the latest reason."""
        with self.lock:
            failing = self.backoff.failing()
        if not failing:
            return ""
        last = max(failing.values(), key=lambda f: f.until)
        return f"; pilots failing on {len(failing)} node(s), skipped for now: {last.reason}"
