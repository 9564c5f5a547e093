"""A controller rebuilt from its store after a restart: jobs with their progress and nodes,
the queue, counters, solve times, what the profiler had learned (its samples replayed) and the
idle fragments the horizon learner had seen (`tfwd auto`)."""
from __future__ import annotations

from typing import Optional, Sequence

from .clock import Clock
from .controller import Controller
from .controller_config import ControllerConfig
from .counters import SOLVE_BUCKETS_S, SOLVE_WINDOW, Counters
from .dispatchers.base import Dispatcher
from .jpa import JPA
from .model import JobState, PauseSample, RateSample
from .usage import Change, holds
from .slots import Slots
from .store import Store


def restore(store: Store, dispatcher: Dispatcher, clock: Clock, config: Optional[ControllerConfig] = None,
            node_names: Sequence[str] = (), advisor: Optional[JPA] = None,
            slots: Optional[Slots] = None) -> Controller:
    """Rebuild a controller from its store (only its public attributes are set). Slots per node
    are not stored: they are a fact of the machine, given again by whoever restarts."""
    saved = store.meta("config")
    ctl = Controller(dispatcher, clock, config or (ControllerConfig(**saved) if saved else None), store,
                     node_names, advisor=advisor, slots=slots)
    now = clock.now()
    ctl.accounted_until = now
    ctl.idle = store.idle_nodes()
    rows = store.jobs()
    running = {job.id for job, _ in rows if job.state is JobState.RUNNING}
    for name, since, owner in store.node_holders():
        ctl.since[name] = since
        if owner in running and name in ctl.idle:
            ctl.owner[name] = owner
    order = {jid: i for i, jid in enumerate(store.meta("running") or [])}
    for job, nodes in rows:
        if job.state.finished:
            ctl.jobs.end(job)        # counted; memory keeps the newest (the store holds them all)
        else:
            ctl.jobs.add(job)
        if advisor is not None:
            advisor.register(job)
    if advisor is not None:
        for t, jid, kind, n, value, secs in store.samples():
            advisor.observe(RateSample(t, jid, n, value, secs or advisor.config.sample_s) if kind == "rate"
                            else PauseSample(t, jid, kind, value))
    for job, nodes in sorted(rows, key=lambda r: order.get(r[0].id, len(order))):
        if job.state is JobState.RUNNING:
            ctl.running[job.id] = None
            ctl.held[job.id] = [n for n in nodes if ctl.owner.get(n) == job.id]
            dispatcher.resume(job, ctl.held[job.id], now)
            if advisor is not None:
                advisor.ran(job.id, len(ctl.held[job.id]), now)
    for job, _ in rows:
        if job.state is JobState.QUEUED:
            ctl.enqueue(job)
    ctl.jobs.trim()
    order = store.meta("reclaim_order")
    if order:
        ctl.reclaim_order.load(order)
    learned = store.meta("horizon")
    if learned and ctl.horizon_learner is not None:
        ctl.horizon_learner.load(learned)
    if ctl.horizon_learner is not None:
        for jid in ctl.running:
            if ctl.held.get(jid):
                ctl.horizon_learner.changed(jid, now)
        if ctl.running:       # the allocations restored count as planned with the fallback: look again
            ctl.replan_at = now
    counters = store.meta("counters")
    if counters:
        ctl.counters = Counters(**counters)
    count, sum_ms, max_ms, le = store.solve_totals([b * 1000.0 for b in SOLVE_BUCKETS_S])
    ctl.solve_times.restore(store.solve_times(SOLVE_WINDOW), count, sum_ms, max_ms, le)
    ctl.timeline.at = store.last_timeline_time()
    saved_at = store.meta("clock", now)     # what was held when the store was last saved counts until then
    owner_of = {j.id: j.owner for j, _ in rows}
    used = [(owner_of.get(h.job, ""), h.start, saved_at if h.end is None else h.end)
            for h in holds(Change(t, j, tuple(a), tuple(r)) for t, j, a, r in store.owned_changes())]
    ctl.quota.seed(used)
    if ctl.fair is not None:
        ctl.fair.seed(used)
    return ctl
