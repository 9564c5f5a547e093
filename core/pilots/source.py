"""Idle nodes of a real batch cluster (Slurm, PBS), held with preemptible pilot jobs. What is
said here of Slurm holds for every scheduler; each one's commands are its provider's
(core/pilots/base.py: core/slurm/provider.py, core/pbs/provider.py).

The harvester never uses a node behind Slurm's back: it submits one pilot job per idle node it
wants to a low-priority partition that Slurm preempts (GraceTime=0), and a node counts as
harvested only while a pilot runs there and is connected (core/pilots/pilot_job.py); the
training job's worker runs inside that pilot. When a main job needs the node, Slurm sends the
pilot SIGTERM and the pilot's first act is to tell the hub, so the leave reaches the controller
within milliseconds (`wake`), ahead of anything else; squeue is only the backstop for a pilot
that died without a word.

A background thread reads sinfo/squeue every `poll_s` (never the live loop's thread; the
formats are those of every Slurm from 22.05 on, core/slurm/parse.py): it finds free nodes
(state `idle` with no flag like completing or planned), submits pilots to them (each
pinned with -w, --exclusive), cancels pilots that wait too long or whose node was taken
meanwhile, and notices pilots that vanished. A held node that Slurm says is down or not
responding (its slurmd is gone) leaves at once, `lost`, and its pilot is cancelled: Slurm owns
node health, and the node comes back only when Slurm has it idle and a new pilot holds it.
Pilots count as the harvester's usage in Slurm's
accounting, so it holds only as many as the jobs could use (`want`, the sum of their max nodes):
surplus pending pilots are cancelled at once, held ones no job uses after `release_grace_s`. When Slurm cannot be asked the source is `stale`:
it keeps every node its pilots hold (they run on slurmd, which does not need slurmctld) and
submits nothing until slurmctld answers again.

Restarts: the hub's port, token and certificate are kept beside the store (core/pilots/identity.py).
A pilot that loses the hub keeps its node and redials for `orphan_timeout_s`; a harvester that
finds that file adopts the running pilots squeue shows (their nodes count as held at once, and
a pilot that does not redial within `pending_timeout_s` is cancelled) instead of cancelling them.
A clean stop cancels every pilot and removes the file.

Joins wait while a pilot of their burst is still starting or about to be sent (core/pilots/joins.py):
a cold start or a burst then reaches the controller as one decision instead of a grow per pilot,
each a regroup that the last nodes no longer repay; a node freed alone joins once its own pilot
is in. Leaves never wait.

GPU nodes: a node runs one rank per GPU of its GRES (`slots_of`), and its pilot asks for all of
them (--gres=gpu:N) so that Slurm binds them to the pilot (CUDA_VISIBLE_DEVICES and the like in
its environment, which its workers inherit).

Pilots that fail (end before they connect, soon after, or run without connecting) count
against their node: it waits longer after each failure and no more than a set number of pilots
go to Slurm per minute (core/pilots/backoff.py); the reason, from Slurm and the pilot's log, is
on the badge, the node and in the log until a pilot holds the node well or staff clear it.
"""
from __future__ import annotations

import getpass
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Collection, Optional

from ..model import Event
from ..sources.base import SOURCE_DRY_RUN, SOURCE_OK, SOURCE_STALE, LiveNodeSource, SourceStatus
from . import identity, script
from .base import BadJobId, BatchNode, Scheduler, SchedulerUnavailable
from .book import PilotBook
from .canceller import Canceller
from .hub import PilotHub
from .joins import JOIN_CAP_TIMEOUTS, JoinHold
from .link import PilotLink
from .settings import PilotSettings
from .stats import PilotStats

__all__ = ["PilotSource"]
log = logging.getLogger(__name__)
#: squeue is the backstop for pilots that ended without a word (a pilot's own end closes its
#: connection at once): read at every poll while a pilot of ours is pending or starting, else
#: this often. sinfo is read at every poll: it finds the nodes to harvest.
SQUEUE_BACKSTOP_S = 5.0


class PilotSource(LiveNodeSource):
    clears_failures = True

    def __init__(self, settings: PilotSettings, scheduler: Scheduler) -> None:
        self.settings = s = settings
        self.scheduler = scheduler
        self.name = scheduler.name
        self.title = scheduler.title
        self.version = scheduler.version()            # SchedulerUnreadable: too old, names the version
        self.user = getpass.getuser()
        nodes = scheduler.nodes()                     # SchedulerUnavailable: cannot start without it
        self._slurm: dict[str, BatchNode] = {n.name: n for n in nodes}
        self._slurm_at = time.monotonic()             # when the nodes were read for `_slurm`
        self.book = PilotBook(s, scheduler.watch(nodes), scheduler.title, scheduler.log_path)
        self._would: tuple[str, ...] = ()             # dry run: what would be harvested now
        self._status = SourceStatus(self.name, SOURCE_DRY_RUN if s.dry_run else SOURCE_OK, "", time.time())
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._wake: Optional[Callable[[], None]] = None
        self.hub: Optional[PilotHub] = None
        self.joins = JoinHold(cap_s=JOIN_CAP_TIMEOUTS * s.pending_timeout_s)
        self.stats = PilotStats()
        self._canceller = Canceller(self._send_cancel)
        self._more = False      # the last poll left free nodes it wanted for the next (the batch, the rate)
        self._burst = 0         # the burst (JoinHold) of the latest pilots sent; it goes on while `_more`
        self._again = False     # the last poll sent a whole batch of a burst: the next one goes at once
        self._recheck = False   # a pilot we deleted may still be requeued: read the pilots at the next poll
        self._squeue_at = -float("inf")   # monotonic: the last squeue read
        log.info("%s %s: watching %d node(s) of %s %s", self.title, self.version, len(self.book.names),
                 scheduler.queue_word, s.partition)
        if not s.dry_run:
            ident, restarted = identity.kept(s)
            self._token = ident.token
            self.hub = identity.open_hub(s, ident, self._on_hello, self._on_leave, self.stats)
            self._take_over_leftovers(restarted)

    # ---- LiveNodeSource ----------------------------------------------------------------------
    def address_of(self, node: str) -> Optional[str]:
        n = self._slurm.get(node)
        return n.address if n is not None and n.address else None

    def node_names(self) -> list[str]:
        return list(self.book.names)

    def capacity(self) -> int:
        """Watched nodes, but never more than the pilots it may hold at once."""
        return min(len(self.book.names), self.settings.max_pilots)

    def slots_of(self, node: str) -> int:
        """Ranks the node runs: `settings.slots` when given, else one per GPU of its GRES (as
        Slurm said at start: a GPU node's job runs one rank per GPU); 1 without GPUs."""
        if self.settings.slots:
            return self.settings.slots
        n = self._slurm.get(node)
        return max(1, n.gpus if n is not None else 0)

    def initial_idle(self) -> list[str]:
        """A node is offered once a pilot holds it; after a restart, the nodes whose pilots the
        earlier run left running (they redial, or are given back after `pending_timeout_s`)."""
        with self.book.lock:
            return [n for n in self.book.adopted if n in self.book.held]

    def start(self, wake: Optional[Callable[[], None]] = None) -> None:
        self._wake = wake
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="slurm-source", daemon=True)
            self._thread.start()

    def poll(self, now: float) -> list[Event]:
        if self._thread is None:
            self.start(self._wake)
        mono = time.monotonic()
        with self.book.lock:
            starting = {p.burst for p in self.book.pilots.values() if not p.running and not p.adopted
                        and mono - p.submitted < self.settings.pending_timeout_s}
        if self._more:
            starting.add(self._burst)
        return self.joins.pass_on(self.book.take_events(), mono, starting, self.book.burst_of)

    def want(self, nodes: int, in_use: Collection[str]) -> None:
        self.book.want(nodes, in_use)

    def status(self) -> SourceStatus:
        st = self._status
        if st.state != SOURCE_OK:
            return st
        held, used, waiting, wanted = self.book.counts()
        return SourceStatus(st.name, st.state, f"{held} node(s) held by pilots, {used} used by jobs, "
                                               f"{wanted} wanted; {waiting} pilot(s) pending in "
                                               f"{self.settings.partition}{self.book.failing_note()}",
                            st.since, held, used)

    def node_states(self) -> dict[str, str]:
        return self.book.describe(self._slurm, self._would)

    def clear(self, node: str) -> bool:
        """Staff cleared a node whose pilots failed: it gets one at the next poll. KeyError if
        the node is not watched; False if it was not failing."""
        cleared = self.book.clear(node)
        if cleared:
            log.info("node %s cleared by staff: it gets pilots again", node)
        return cleared

    def close(self) -> None:
        """Stop watching and give every node back: cancel our pilots, close their connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.command_timeout_s * 3 + 5)
        self._canceller.close(self.settings.command_timeout_s + 5)
        jobs = self.book.closing()
        try:
            self.scheduler.cancel(jobs)
            self.stats.count("cancelled", len(jobs))
        except (SchedulerUnavailable, BadJobId) as e:
            log.warning("could not cancel pilots %s (%s); a restarted harvester adopts them, or they end "
                        "after the orphan timeout", jobs, e)
        else:
            if self.settings.state_file:       # nothing left to redial: the next start is a new hub
                Path(self.settings.state_file).unlink(missing_ok=True)
        if self.hub is not None:
            self.hub.close()

    # ---- pilots talking ----------------------------------------------------------------------
    def _on_hello(self, link: PilotLink) -> None:
        verdict = self.book.hello(link)
        if verdict == "stray":
            log.warning("pilot %s on %s is not needed there; cancelling it", link.job, link.node)
            self._cancel_soon([link.job])
            return
        if verdict == "adopted":
            log.info("pilot %s on %s redialed with %d worker(s)", link.job, link.node, len(link.workers))
        self._poke()

    def _on_leave(self, link: PilotLink, why: str) -> None:
        if not link.leaving:
            self.stats.count("lost")
        elif not self.book.was_cancelled(link.job):
            self.stats.count("preempted")
        ours = self.book.was_cancelled(link.job)
        if self.book.leave(link, why):
            self._poke()
        if self._stop.is_set():
            return
        if not link.leaving or (self.scheduler.requeues_preempted and not ours):
            self._recheck = self.scheduler.requeues_preempted   # a delete can race the requeue: look again
            self._cancel_soon([link.job])   # lost contact, or requeued: make sure the node goes back

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()

    # ---- watching the scheduler ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_slurm()
            except Exception:             # never let the watcher die: the next poll tries again
                log.exception("reading %s failed", self.title)
            if self._again:                 # a burst under way: the next batch at once
                continue
            self._stop.wait(max(0.0, self.settings.poll_s - (time.monotonic() - t0)))

    def poll_slurm(self) -> None:
        """One round: read the nodes and the pilots (sinfo and squeue), then act on what changed."""
        asked = time.monotonic()
        with self.book.lock:
            known = {j for j, p in self.book.pilots.items() if p.submitted < asked}
            waiting = any(not p.running for p in self.book.pilots.values())
        read_jobs = not self.settings.dry_run and (
            waiting or self._recheck or self._status.state != SOURCE_OK or asked - self._squeue_at >= SQUEUE_BACKSTOP_S)
        try:
            nodes = self.scheduler.nodes()
            jobs = self.scheduler.jobs(self.settings.pilot_name, self.user) if read_jobs else None
        except SchedulerUnavailable as e:
            self._set_status(SOURCE_STALE, f"cannot read {self.title}: {e}")
            return
        self._slurm, self._slurm_at = {n.name: n for n in nodes}, asked
        if self.settings.dry_run:
            self._dry_run()
            return
        self._set_status(SOURCE_OK, "")
        self._check_nodes()
        if jobs is not None:
            self._squeue_at = asked
            self._check_pilots({j.id: j for j in jobs}, known)
        self._trim()
        self._submit()

    def _check_pilots(self, jobs: dict, known: set[str]) -> None:
        """The backstop: pilots that ended without a word; and pilots to cancel."""
        lingering = self.book.cancelled_alive(jobs) if self.scheduler.requeues_preempted else []
        self._recheck = bool(lingering)
        again = [jid for jid in lingering if not jobs[jid].running]
        cancel, dropped, left = self.book.check(jobs, known, self._slurm)
        cancel += again
        suspended = [jid for jid in dropped if jobs.get(jid) is not None and jobs[jid].suspended]
        if suspended:
            log.info("pilot(s) %s suspended by %s for a main job: their nodes leave, the pilots are cancelled",
                     ", ".join(suspended), self.title)
            self._cancel_quietly(suspended, suspended=True)
        if left:
            self._poke()
        for jid in dropped:           # Slurm says it is over: if it is still connected, hang up
            link = self.hub.link_of_job(jid) if self.hub is not None else None
            if link is not None:
                link.hang_up()
        if cancel:
            log.info("cancelling pilot(s) %s: their node was taken before they started, or they "
                     "did not connect within %g s", ", ".join(cancel), self.settings.pending_timeout_s)
            self._cancel_quietly(cancel)

    def _check_nodes(self) -> None:
        """Held nodes Slurm says are down or not responding leave at once (`lost`) and their
        pilots are cancelled: Slurm owns a node's health (PilotBook.unreachable)."""
        fallen = self.book.unreachable(self._slurm)
        if fallen:
            self._poke()
            log.warning("%s says the node(s) of pilot(s) %s are down or not responding: they leave their jobs "
                        "and are not used until %s has them idle again", self.title, ", ".join(fallen), self.title)
            self._cancel_quietly(fallen)

    def free_nodes(self) -> list[str]:
        return self.book.free_nodes(self._slurm, self._slurm_at)

    def _trim(self) -> None:
        pending, held = self.book.trim()
        cancel = [p.job for p in pending + held]
        if cancel:
            log.info("cancelling %d pilot(s) no job can use (%d pending, %d holding an unused node): %s",
                     len(cancel), len(pending), len(held), ", ".join(cancel))
            self._cancel_quietly(cancel)

    def _submit(self) -> None:
        """This poll's pilots, `submit_parallel` submissions at once, and the next batch of a
        burst without waiting for the next poll (thousands of idle nodes are held within a
        minute); the first the scheduler refuses ends the round. Only a whole batch sent without
        a refusal goes on at once: a rate held back by failing pilots waits for the poll."""
        s, hub = self.settings, self.hub
        assert hub is not None
        text, env = script.script(s), script.environment(s, hub.address[1], hub.fingerprint, self._token)
        free, room = self.free_nodes(), self.book.room()
        nodes = free[:room]
        if nodes and not self._more:
            self._burst += 1                  # else these go on the burst the last poll left unfinished
        burst = self._burst
        self._more = min(len(free), self.book.unpaced()) > room
        self._again = False
        refused = threading.Event()

        def one(node: str) -> None:
            if refused.is_set() or self._stop.is_set():
                return
            job = None
            try:
                job = self.scheduler.submit(node, self._slurm.get(node), text, env)
            except SchedulerUnavailable as e:
                if not refused.is_set():
                    log.warning("could not submit a pilot to %s: %s", node, e)
                refused.set()
            finally:
                self.book.submitted(job, node, burst)
                if job is not None:
                    self.stats.count("submitted")

        if len(nodes) <= 1 or s.submit_parallel == 1:
            for node in nodes:
                one(node)
        else:
            with ThreadPoolExecutor(min(s.submit_parallel, len(nodes)), thread_name_prefix="pilot-submit") as pool:
                list(pool.map(one, nodes))
        self._again = self._more and len(nodes) == s.submit_batch and not refused.is_set()

    def _dry_run(self) -> None:
        would = tuple(self.free_nodes()[:self.settings.max_pilots])
        changed, self._would = would != self._would, would
        if changed:
            log.info("dry run: would harvest %d node(s) with pilots in %s: %s", len(would),
                     self.settings.partition, ", ".join(would) or "none")
        self._set_status(SOURCE_DRY_RUN, f"would harvest {len(would)} node(s)" +
                         (f": {', '.join(would[:20])}" + (" ..." if len(would) > 20 else "") if would else ""))

    def _set_status(self, state: str, detail: str) -> None:
        old = self._status
        if old.state == state and old.detail == detail:
            return
        since = old.since if old.state == state else time.time()
        if state != old.state:
            (log.warning if state == SOURCE_STALE else log.info)(
                "%s source %s%s", self.title, state, f": {detail}" if detail else "")
        self._status = SourceStatus(self.name, state, detail, since)

    def _take_over_leftovers(self, restarted: bool) -> None:
        """Pilots an earlier run left (same name and user): after a restart those running on a
        watched node are adopted (PilotBook.adopt); every other one is cancelled."""
        try:
            jobs = [j for j in self.scheduler.jobs(self.settings.pilot_name, self.user) if not j.ended]
        except SchedulerUnavailable:
            return
        cancel = self.book.adopt(jobs, restarted)
        if self.book.adopted:
            log.info("adopting %d pilot(s) of the earlier run; they redial: %s", len(self.book.adopted),
                     ", ".join(self.book.held[n] for n in self.book.adopted))
        if cancel:
            log.info("cancelling %d pilot(s) of an earlier run that hold no node: %s", len(cancel), ", ".join(cancel))
            self._cancel_quietly(cancel)

    def _cancel_soon(self, jobs: list[str]) -> None:
        """Cancel from the hub's reader thread: marked at once, sent by the canceller's."""
        self.book.cancelling(jobs)
        self._canceller.add(jobs)

    def _cancel_quietly(self, jobs: list[str], suspended: bool = False) -> None:
        self.book.cancelling(jobs)
        self._send_cancel(jobs, suspended)

    def _send_cancel(self, jobs: list[str], suspended: bool = False) -> None:
        try:
            (self.scheduler.cancel_suspended if suspended else self.scheduler.cancel)(jobs)
        except (SchedulerUnavailable, BadJobId) as e:
            log.warning("could not cancel %s: %s", ", ".join(jobs), e)
        else:
            self.stats.count("cancelled", len(jobs))
