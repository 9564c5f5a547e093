"""The event loop: node and job events in, a fresh allocation out, every change recorded.

One `step` handles one batch of events that arrived together: leaves first (the job gets off
the node before anything else happens), then finished jobs, cancellations, joins and new jobs;
then queued jobs are admitted up to `max_jobs` and the allocator re-divides the idle nodes.
Time always comes from the clock, so replay and live runs share this code.
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import asdict, replace
from typing import Callable, Optional, Sequence


from .allocator import Plan, allocate
from .controller_config import ControllerConfig
from .advice import PROBE_BONUS, Advice
from .clock import Clock
from .counters import Counters, SolveTimes, StepResult
from .demand import node_demand
from .fairshare import FairShare
from .dispatchers.base import Dispatcher
from .horizon import FALLBACK_S, REPLAN_GROWTH, Horizon, HorizonLearner, learn_step
from .job_book import JobBook
from .job_queue import JobQueue
from .jpa import JPA, Probe
from .model import EVENT_PRIORITY, LEFT_LOST, LEFT_PREEMPTED, LOGGED_ONLY, Allocation, Event, EventKind, Job, JobState, Node, NodeState
from .objective import Problem
from .policies import make_policy
from .quotas import Quotas
from .reclaim_order import ReclaimOrder
from .requeue import MAX_REQUEUES, second_chance
from .slots import Slots
from .slotting import admit
from .picture import picture
from .snapshot import Snapshot
from .store import Batch, Store, job_row
from .store_writer import StoreWriter
from .timeline import Timeline

log = logging.getLogger(__name__)


class Controller:  # one step reads and writes the same node and job state; the queue, timeline, store writes, quotas, horizon and advice are their own modules
    def __init__(self, dispatcher: Dispatcher, clock: Clock, config: Optional[ControllerConfig] = None,
                 store: Optional[Store] = None, node_names: Sequence[str] = (),
                 timeline_every: float = 60.0, advisor: Optional[JPA] = None,
                 slots: Optional[Slots] = None) -> None:
        self.config = config or ControllerConfig()
        self.slots = slots or Slots()             # ranks (GPUs) per node: counted, never allocated
        self.advisor = advisor                    # JPA: learns curves and costs (None: trust them)
        self.advice = Advice(advisor)
        self.fair = FairShare.wanted(self.config)   # use against share, for a fairshare objective or queue
        self.policy = make_policy(self.config.policy, self.config.solver)
        self.dispatcher = dispatcher
        self.clock = clock
        self.store = store
        self.node_names = list(node_names)
        self.idle: dict[str, float] = {}          # node -> idle since (offered by the source)
        self.owner: dict[str, str] = {}           # node -> job holding it
        self.held: dict[str, list[str]] = {}      # job -> nodes, in the order it got them
        self.jobs = JobBook(store)                 # live jobs (what a step walks), recent ended ones, the store
        self.running: dict[str, None] = {}        # admission order = allocator order
        self.queue = JobQueue(self.config, self.fair and self.fair.ranker(lambda: self.quota.book.shares, clock))
        self.counters = Counters()
        self.solve_times = SolveTimes()
        self.last_plan: Optional[Plan] = None
        self.last_allocation = Allocation(clock.now(), {})
        self.since: dict[str, float] = {}         # node -> when it last joined, left or changed holder
        self.rescaling_until: dict[str, float] = {}  # job -> end of its current rescale pause
        self.timeline = Timeline(timeline_every)
        self.accounted_until: Optional[float] = None    # node-seconds are counted up to here
        self._inbox: list[Event] = []
        self.submitted: dict[str, Job] = {}       # registered, not yet taken in by a step
        self.lock = threading.RLock()
        self._batch = Batch()
        self.writer = StoreWriter(store) if store is not None else None   # failed writes kept, retried
        self.frozen = False    # paused harvester: leaves are still honoured, nothing is re-divided
        #: `tfwd auto`: the survival of idle fragments, fed by every leave (None: T_fwd is fixed)
        self.horizon_learner = HorizonLearner() if self.config.learns_horizon else None
        self.reclaim_order = ReclaimOrder()        # which end of a cohort the main scheduler takes first
        self.quota = Quotas()    # node caps and period quotas (core.quotas); its `source` gives the limits
        self.horizon: Horizon = Horizon(float(self.config.tfwd) if not self.config.learns_horizon
                                        else FALLBACK_S, 0, 0, math.nan, math.nan, False)
        self._planned_tfwd = self.horizon.tfwd     # the horizon the last plan was made with
        #: `tfwd auto`: when a step is due even without an event, to see whether the horizon has
        #: outgrown the last plan's (a replay or live loop wakes the controller then); None: never
        self.replan_at: Optional[float] = None
        #: replay references only (core.clairvoyant), (idle nodes, now) -> seconds: each node's true
        #: remaining idle time, for placement's expectation; the moment the trace takes each back,
        #: for the moment each became idle (its groups: nodes that go back together, not freed together)
        self.clairvoyant: Optional[Callable[[Sequence[str], float], dict[str, float]]] = None
        self.clairvoyant_groups: Optional[Callable[[Sequence[str], float], dict[str, float]]] = None

    # ---- inputs ---------------------------------------------------------------------------
    def start(self, idle: Sequence[str]) -> None:
        """Record the machine and the nodes idle when the controller starts."""
        now = self.clock.now()
        with self.lock:
            self.accounted_until = now
            for n in self.node_names:
                self._batch.node(n, False, now)
            for n in idle:
                self.idle[n] = now
                self.since[n] = now
                self._batch.node(n, True, now)
            self._batch.meta["config"] = asdict(self.config)

    def submit(self, job: Job, durable: bool = False, detail: str = "") -> None:
        """Register a job; it is queued and considered at the next step. `durable` writes it to
        the store before returning, so a job a person registered survives a crash right after;
        `detail`: what its submit event says (a resubmitted job: where it continues from)."""
        with self.lock:
            if job.id in self.jobs or job.id in self.submitted:
                raise ValueError(f"job id {job.id} already exists")
            if durable and self.store is not None:
                self.store.write(Batch(jobs={job.id: job_row(job)}))   # StoreWriteError: not registered
            self.submitted[job.id] = job
            self._inbox.append(Event(self.clock.now(), EventKind.JOB_SUBMIT, job=job.id, detail=detail))

    def cancel(self, job_id: str, durable: bool = False) -> None:
        with self.lock:
            job = self.jobs.get(job_id) or self.submitted.get(job_id)
            if job is None:
                raise KeyError(job_id)
            now = self.clock.now()
            if durable and self.store is not None and not job.state.finished:
                row = job_row(job)
                row.update(state=JobState.CANCELLED.value, end_time=now)
                self.store.write(Batch(jobs={job_id: row}))   # StoreWriteError: not cancelled
            self._inbox.append(Event(now, EventKind.JOB_CANCEL, job=job_id))

    def replan_due(self, now: float) -> bool:
        """A quiet machine is looked at again once a horizon has passed since the last step: the
        horizon learned from how long allocations stand grows while nothing happens, and a job
        that a short one kept waiting should not wait for the next event (hours on a calm machine)."""
        return self.replan_at is not None and now >= self.replan_at

    @property
    def pending(self) -> bool:
        """Commands or events wait for the next step."""
        return bool(self._inbox)

    def job(self, job_id: str) -> Optional[Job]:
        with self.lock:
            return self.jobs.get(job_id) or self.submitted.get(job_id)

    def node_demand(self) -> tuple[int, list[str]]:
        """(nodes the jobs could use, nodes they hold now), for a source that holds nodes at a
        cost (core/demand.py)."""
        with self.lock:
            queued = self.queue.queued(self.jobs.live)
            running = [self.jobs.live[j] for j in self.running if self.quota.may_run(self.jobs.live[j].owner)]
            waiting = [j for j in (*queued, *self.submitted.values()) if self.quota.may_run(j.owner)]
            slots = self.queue.free_slots(any(self.queue.in_lane(j) for j in waiting), self._running_jobs())
            caps = self.quota.caps([(j.id, j.owner) for j in (*running, *waiting)])
            return node_demand(running, waiting, slots, caps), list(self.owner)

    def active_jobs_of(self, owner: str) -> int:
        """Queued (or just registered) and running jobs of one owner."""
        with self.lock:
            return sum(1 for j in (*self.submitted.values(), *self.jobs.live.values()) if j.owner == owner)

    def record(self, event: Event) -> None:
        """Put an event in the log that needs no handling (the harvester's own life)."""
        with self.lock:
            self._log(event)

    def post(self, event: Event) -> None:
        with self.lock:
            self._inbox.append(event)

    # ---- the step -------------------------------------------------------------------------
    def step(self, events: Sequence[Event] = (), force: bool = False) -> Optional[StepResult]:
        with self.lock:
            now = self.clock.now()
            batch = sorted([*self._inbox, *events], key=lambda e: EVENT_PRIORITY[e.kind])
            self._inbox.clear()
            samples = self.dispatcher.samples(now) if self.advice.on else []
            if not batch and not samples and not force and not self.replan_due(now):
                return None
            self._account(now)
            self.counters.steps += 1
            self.counters.events += len(batch)
            changed = force
            lost: dict[str, list[tuple[str, str]]] = {}     # job -> (node, why it left)
            gone: dict[str, float] = {}
            by_kind = self.counters.by_kind
            for ev in batch:
                ev = self._second_chance(ev)     # a failure of its nodes only: a requeue (core/requeue.py)
                self._log(ev)
                by_kind[ev.kind.value] = by_kind.get(ev.kind.value, 0) + 1
                kind = ev.kind
                if kind is EventKind.NODE_LEAVE:
                    changed |= self._leave(ev, lost, gone)
                elif kind in (EventKind.JOB_DONE, EventKind.JOB_FAILED, EventKind.JOB_CANCEL) or (
                        kind is EventKind.JOB_REQUEUE and ev.failure):
                    if lost:
                        self._vacate(lost, now)
                        lost = {}
                    changed |= self._end(ev, now)
                elif kind is EventKind.NODE_JOIN:
                    if lost:
                        self._vacate(lost, now)
                        lost = {}
                    if ev.node not in self.idle:
                        self.idle[ev.node] = now
                        self.since[ev.node] = now
                        self._batch.node(ev.node, True, now)
                        changed = True
                elif kind is EventKind.JOB_SUBMIT:
                    changed |= self._register(ev.job, now)
                elif kind not in LOGGED_ONLY:
                    changed = True
            if lost:
                self._vacate(lost, now)
            if gone:
                self.reclaim_order.taken(gone, self.idle)
            measured = self.advice.learn(samples, self._batch, self.counters)
            changed |= self.advice.take_news()
            expect = self._learn_horizon(now)
            changed |= self.horizon.tfwd >= REPLAN_GROWTH * self._planned_tfwd
            probes = self.advice.probes(now, self._remaining(now), measured, len(self.idle) - len(self.owner),
                                        self.horizon.tfwd)
            changed |= bool(probes)
            changed |= self.quota.review((j.owner for j in (*self.jobs.live.values(), *self.submitted.values())), now)
            changed |= admit(self, now)
            result = StepResult(now, len(batch), len(self.idle), len(self.owner), len(self.running),
                                self.n_queued, 0.0)
            if changed and self.running and not self.frozen:
                self._solve(now, result, probes, expect)
                if self.quota.blocked and admit(self, now):   # an owner over quota gave back nodes, then its slot
                    self._solve(now, result, probes, expect)
                self._planned_tfwd = self.horizon.tfwd
            self.replan_at = now + self.horizon.tfwd if self.horizon_learner is not None and self.running else None
            wake = self.quota.wake_at(self._held_by_owner(), now) if self.quota.on else None
            if wake is not None and (self.replan_at is None or wake < self.replan_at):
                self.replan_at = wake     # a period quota runs out, or rolls over, with no event
            result.used = len(self.owner)
            result.samples_per_second = sum(self.dispatcher.rate(self.jobs[j]) for j in self.running)
            self.last_allocation = Allocation(now, {j: list(self.held.get(j, [])) for j in self.running},
                                              dict(result.changes))
            if self._timeline_due(now):
                self._timeline_point(now, result.samples_per_second)
            return result

    def _timeline_due(self, now: float) -> bool:
        return self.timeline.due(now, self._counts())

    def _counts(self) -> tuple:
        return len(self.idle), len(self.owner), len(self.running), self.n_queued

    def _learn_horizon(self, now: float) -> Optional[dict[str, float]]:
        """`tfwd auto`: this step's horizon, and the idle nodes' expected idle time (core/horizon.py)."""
        horizon, expected = learn_step(self.horizon_learner, self.idle, self.running, now, self.clairvoyant)
        self.horizon = horizon or self.horizon
        return expected

    def _remaining(self, now: float) -> dict[str, float]:
        """Samples each running job has still to process (what a probe's gain is spread over)."""
        if not self.advice.on:
            return {}
        return {jid: max(0.0, self.jobs[jid].total_samples - self.dispatcher.progress(self.jobs[jid], now))
                for jid in self.running}

    def _timeline_point(self, now: float, rate: Optional[float] = None) -> None:
        if rate is None:
            rate = sum(self.dispatcher.rate(self.jobs[j]) for j in self.running)
        self.timeline.point(self._batch, now, self._counts(), rate)

    def _log(self, ev: Event) -> None:
        self._batch.event(ev)

    def _account(self, now: float) -> None:
        if self.accounted_until is not None and now > self.accounted_until:
            dt = now - self.accounted_until
            self.counters.offered_node_s += len(self.idle) * dt
            self.counters.used_node_s += len(self.owner) * dt
            held = [(self.jobs[j].owner, len(self.held.get(j, ()))) for j in self.running]
            by_owner = Quotas.held(held)         # named owners only; the fair share also counts ""
            self.counters.count_owners(by_owner, dt)
            if self.quota.source is not None:    # quotas may be set (a users file): count every owner's use
                self.quota.count(by_owner, self.accounted_until, now)
            if self.fair is not None:
                self.fair.count(held, self.accounted_until, now)
        self.accounted_until = now if self.accounted_until is None else max(self.accounted_until, now)

    def _held_by_owner(self) -> dict[str, int]:
        return Quotas.held((self.jobs[j].owner, len(self.held.get(j, ()))) for j in self.running)

    def _leave(self, ev: Event, lost: dict[str, list[tuple[str, str]]], gone: dict[str, float]) -> bool:
        """A node leaves. Only the owner's or the scheduler's taking feeds the horizon and the
        reclaim order: a node lost to a fault of its own says nothing about when nodes go back."""
        node = ev.node
        if node is None or node not in self.idle:
            return False
        cause = ev.cause or LEFT_PREEMPTED
        if cause != LEFT_LOST:
            gone[node] = self.idle[node]
            if self.horizon_learner is not None:
                self.horizon_learner.ended(self.clock.now() - self.idle[node])
        else:
            log.info("node %s lost%s: %s", node, f" under job {ev.job}" if ev.job else "", ev.detail or "no reason given")
        del self.idle[node]
        self.since[node] = self.clock.now()
        self._batch.node(node, False, self.clock.now())
        job = self.owner.pop(node, None)
        if job is not None:
            lost.setdefault(job, []).append((node, cause))
        return True

    def _vacate(self, lost: dict[str, list[tuple[str, str]]], now: float) -> None:
        """Get every job off the nodes that left, before anything is re-planned; each change
        is recorded with why its nodes left (lost, reclaimed, preempted)."""
        for jid, left in lost.items():
            job = self.jobs[jid]
            nodes = [n for n, _ in left]
            before = self.held.get(jid, [])
            gone = set(nodes)
            after = [n for n in before if n not in gone]
            self.held[jid] = after
            self.dispatcher.vacate(job, nodes, now)
            self.advice.ran(jid, len(after), now)
            self.counters.preemptions += sum(1 for _, cause in left if cause != LEFT_LOST)
            if after:
                self.rescaling_until[jid] = max(self.rescaling_until.get(jid, now), now + job.scale_down_seconds)
            for cause in dict.fromkeys(c for _, c in left):
                out = {n for n, c in left if c == cause}
                was = [n for n in before if n not in gone or n in out]
                self._record_change(job, was, [n for n in was if n not in out], now, cause)

    def _release(self, job: Job) -> list[str]:
        nodes = self.held.pop(job.id, [])
        for n in nodes:
            self.owner.pop(n, None)
            if n in self.idle:
                self._batch.node(n, True, self.idle[n])
        return nodes

    def _second_chance(self, ev: Event) -> Event:
        """A running job's JOB_FAILED, or the JOB_REQUEUE that replaces it when its nodes failed
        it, not itself (core/requeue.py)."""
        job = self.jobs.live.get(ev.job) if ev.kind is EventKind.JOB_FAILED and ev.job else None
        if job is None or job.id not in self.running:
            return ev
        return second_chance(ev, job.requeues) or ev

    def _end(self, ev: Event, now: float) -> bool:
        job = self.jobs.live.get(ev.job) or self.submitted.get(ev.job)     # an ended job is no longer live
        if job is None or job.state.finished:
            return False
        if ev.kind is EventKind.JOB_REQUEUE:       # its nodes failed it: queued again, not ended
            if job.id not in self.running:
                return False
            job.requeues += 1
            log.info("job %s back to the queue (%d of %d): %s", job.id, job.requeues, MAX_REQUEUES,
                     (ev.failure or {}).get("message") or ev.detail)
            self._requeue(job.id, now, ev.detail)
            return True
        self.submitted.pop(job.id, None)          # cancelled before a step took it in
        self.queue.discard(job.id)
        state = {EventKind.JOB_DONE: JobState.DONE, EventKind.JOB_FAILED: JobState.FAILED,
                 EventKind.JOB_CANCEL: JobState.CANCELLED}[ev.kind]
        before = list(self.held.get(job.id, []))
        was_running = job.id in self.running
        if was_running:
            self.dispatcher.stop(job, now)
        job.samples_done = job.total_samples if state is JobState.DONE else job.samples_done
        if state is JobState.FAILED:
            job.failure = ev.failure or {"kind": "other", "message": ev.detail, "node": ev.node, "hint": "",
                                         "tail": []}
            log.info("job %s failed (%s)%s: %s", job.id, job.failure.get("kind"),
                     f" on {ev.node}" if ev.node else "", job.failure.get("message") or ev.detail)
        job.state = state
        job.end_time = now
        self.jobs.end(job)
        self._release(job)
        self.running.pop(job.id, None)
        self.rescaling_until.pop(job.id, None)
        self.advice.ran(job.id, 0, now)
        if before:
            self._record_change(job, before, [], now, state.value)
        if state is JobState.DONE:
            self.counters.jobs_finished += 1
        self._batch.jobs[job.id] = job_row(job)
        return True

    def _register(self, jid: Optional[str], now: float) -> bool:
        job = self.submitted.pop(jid, None) if jid else None
        if job is None:
            return False
        job.state = JobState.QUEUED
        self.jobs.add(job)
        self.advice.register(job)
        self.counters.jobs_submitted += 1
        self.queue.push(job)
        self._batch.jobs[job.id] = job_row(job)
        return True

    def enqueue(self, job: Job) -> None:
        """Queue a job taken up again from the store (restore)."""
        self.queue.push(job)

    @property
    def n_queued(self) -> int:
        """Jobs taken in and queued now, counted from their states."""
        return self.jobs.count(JobState.QUEUED)

    def _running_jobs(self) -> list[Job]:
        return [self.jobs.live[j] for j in self.running]

    def _requeue(self, jid: str, now: float, logged: str = "", why: str = "") -> None:
        """A running job goes back to the queue, where it keeps its place (its progress is kept;
        it starts again when enough nodes are idle): one that holds no node and cannot start, or
        one its nodes failed (`logged`: the JOB_REQUEUE already in its events, core/requeue.py);
        `why`: the reason its event gives, where it is not its quota or its minimum."""
        job = self.jobs[jid]
        self.dispatcher.stop(job, now)
        self.running.pop(jid, None)
        before = self._release(job)
        self.rescaling_until.pop(jid, None)
        self.advice.ran(jid, 0, now)
        job.state = JobState.QUEUED
        if not job.samples_done:
            job.start_time = None
        self.queue.push(job)
        if before:
            self._record_change(job, before, [], now, "requeued")
        self._batch.jobs[jid] = job_row(job)
        if logged:
            return
        why = why or self.quota.reason(job.owner) or f"needs {job.min_nodes} node(s), {len(self.idle)} idle"
        log.info("job %s back to the queue: %s", jid, why)
        self._log(Event(now, EventKind.JOB_REQUEUE, job=jid, detail=f"back to the queue: {why}"))

    def _solve(self, now: float, result: StepResult, probes: Optional[dict[str, Probe]] = None,
               expect: Optional[dict[str, float]] = None) -> None:
        jobs = [self.jobs[j] for j in self.running]
        reqs = [self.advice.request(j, self.held.get(j.id, ())) for j in jobs]
        if self.config.learns_horizon:   # samples/s net of amortised pauses, the fallback's too: one unit a run
            reqs = [replace(r, horizon=self.horizon.jobs.get(r.id, self.horizon.tfwd)) for r in reqs]
        reqs = [replace(r, paused_s=self.rescaling_until[r.id] - now) if self.rescaling_until.get(r.id, now) > now
                else r for r in reqs]
        if self.config.objective == "fairshare":
            reqs = self.fair.weigh(reqs, [j.owner for j in jobs], self.quota.book.shares, now)
        forced = Advice.force(reqs, probes or {}, len(self.idle) - len(self.owner))
        lane = [i for i, (j, r) in enumerate(zip(jobs, reqs)) if not r.bonus and self.queue.in_lane(j)]
        for i in lane:      # the demo lane: a visitor's job holds at least its minimum wherever it can
            reqs[i] = replace(reqs[i], bonus=PROBE_BONUS)
        h = self.horizon
        since = self.idle if self.clairvoyant_groups is None else self.clairvoyant_groups(list(self.idle), now)
        problem = Problem(list(self.idle), reqs, h.tfwd, self.config.objective, expect, since,
                          self.reclaim_order.direction, self.quota.caps([(j.id, j.owner) for j in jobs]))
        plan = allocate(problem, self.policy, time_limit=self.config.time_limit)
        if forced or lane:          # the objective reported is the throughput one, without the bonuses
            plan.objective -= PROBE_BONUS * (sum(1 for j, n in forced.items() if plan.sizes.get(j) == n)
                                             + sum(1 for i in lane if plan.sizes.get(reqs[i].id, 0) > 0))
        self.last_plan = plan
        self.counters.solves += 1
        self.solve_times.add(plan.solve_ms)
        result.objective, result.solve_ms, result.status = plan.objective, plan.solve_ms, plan.status
        self._batch.solver_run(now, plan, len(reqs), len(problem.nodes))
        for job in jobs:
            before = self.held.get(job.id, [])
            after = plan.assignment.get(job.id, [])
            if len(after) == len(before):
                continue  # same size, same nodes: placement trades only for a job that grows
            why = self.advice.ran(job.id, len(after), now)
            if why:
                if forced.get(job.id) == len(after):
                    self.counters.probes += 1
                else:
                    self.counters.tries += 1
                self._log(Event(now, EventKind.PROBE, job=job.id, detail=why))
            self.dispatcher.resize(job, after, now)
            self.held[job.id] = list(after)
            had, has = set(before), set(after)
            for n in had - has:
                if self.owner.get(n) == job.id:
                    del self.owner[n]
                    self.since[n] = now
                    self._batch.node(n, True, now, idle_since=self.idle[n])
            for n in (x for x in after if x not in had):
                self.owner[n] = job.id
                self.since[n] = now
                self._batch.node(n, True, now, job.id, self.idle[n])
            if before and after:
                self.counters.rescales += 1
                self.rescaling_until[job.id] = max(self.rescaling_until.get(job.id, now), now + (
                    job.scale_up_seconds if len(after) > len(before) else job.scale_down_seconds))
            result.changes[job.id] = (len(before), len(after))
            self._record_change(job, before, after, now,
                                "start" if not before else "stop" if not after else
                                "grow" if len(after) > len(before) else "shrink")

    def _record_change(self, job: Job, before: Sequence[str], after: Sequence[str], now: float,
                       reason: str) -> None:
        running = bool(after) and job.state is JobState.RUNNING
        if self.horizon_learner is not None:
            if running:     # a grow within the regroup of a start or grow ends no stand (core/horizon.py)
                self.horizon_learner.changed(job.id, now, len(after) > len(before), job.scale_up_seconds)
            else:
                self.horizon_learner.left(job.id)
        # progress also where a job drops to no nodes, so its progress line stays flat while it holds none
        self._batch.change(now, job, before, after, reason, self.dispatcher.rate(job) if running else 0.0,
                           self.dispatcher.progress(job, now) if running or before else None, self.dispatcher.name)

    # ---- persistence ----------------------------------------------------------------------
    def flush(self, extra_meta: Optional[dict] = None) -> None:
        """Write everything since the last flush, with the current state, in one transaction
        (without a store the batch is dropped, so memory stays flat)."""
        with self.lock:
            now = self.clock.now()
            self._account(now)
            for jid in self.running:
                job = self.jobs[jid]
                job.samples_done = self.dispatcher.progress(job, now)
                self._batch.jobs[jid] = job_row(job, self.held.get(jid, []), self.dispatcher.rate(job))
            self._batch.meta["clock"] = now
            if self._timeline_due(now):
                self._timeline_point(now)
            self._batch.meta["running"] = list(self.running)
            self._batch.meta["counters"] = asdict(self.counters)
            if self.horizon_learner is not None:
                self._batch.meta["horizon"] = self.horizon_learner.state()
            self._batch.meta["reclaim_order"] = self.reclaim_order.state()
            if extra_meta:
                self._batch.meta.update(extra_meta)
            batch, self._batch = self._batch, Batch()
            if self.writer is not None:
                self.writer.write(batch, now)
            if self.writer is not None and self.writer.problem is None:
                self.jobs.trim()      # the store has every ended job now: memory keeps the newest

    # ---- reading --------------------------------------------------------------------------
    @property
    def solve_ms(self) -> list[float]:
        """The last SOLVE_WINDOW solves' times in ms, oldest first (for percentiles)."""
        return self.solve_times.ms

    def snapshot(self, status: str, seq: int, source_status: Optional[dict] = None,
                 node_info: Optional[dict[str, str]] = None) -> Snapshot:
        """An immutable picture of this controller for readers that hold no lock."""
        with self.lock:
            return picture(self, status, seq, source_status, node_info)

    def nodes(self) -> list[Node]:
        """Every node of the machine with its state and holder (for the grid and the API)."""
        with self.lock:
            names = self.node_names or list(self.idle)
            return [Node(n, NodeState.IDLE if n in self.idle else NodeState.BUSY,
                         self.since.get(n), self.owner.get(n)) for n in names]

    def samples_processed(self) -> float:
        now = self.clock.now()
        return sum(self.dispatcher.progress(j, now) if j.id in self.running else j.samples_done
                   for j in self.jobs.values())
