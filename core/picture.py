"""The picture a controller publishes (`Controller.snapshot`): nodes, jobs with their why-line
facts, KPIs and settings, built under the controller's lock for readers that hold none."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .job_book import ENDED_STATES
from .snapshot import BUSY, HELD, IDLE, Snapshot

if TYPE_CHECKING:
    from .controller import Controller


def picture(ctl: "Controller", status: str, seq: int, source_status: Optional[dict] = None,
             node_info: Optional[dict[str, str]] = None) -> Snapshot:
    """The picture Controller.snapshot publishes (called with the controller's lock held)."""
    now = ctl.clock.now()
    names = tuple(ctl.node_names or ctl.idle)
    idle, owner, since = ctl.idle, ctl.owner, ctl.since
    state = tuple(HELD if n in owner else IDLE if n in idle else BUSY for n in names)
    job_of = tuple(owner.get(n) for n in names)
    when = tuple(since.get(n) for n in names)
    rescaling = frozenset(j for j, t in ctl.rescaling_until.items() if t > now)
    slots = ctl.slots
    advisor = ctl.advisor
    probing = frozenset(advisor.probing()) if advisor is not None else frozenset()
    jobs = []
    rate_total = 0.0
    quota = ctl.quota
    held_by = ctl._held_by_owner() if quota.on else {}
    for job in (*ctl.jobs.live.values(), *ctl.jobs.recent()):     # older ended jobs: the store's (paged)
        running = job.id in ctl.running
        rate = ctl.dispatcher.rate(job) if running else 0.0
        done = ctl.dispatcher.progress(job, now) if running else job.samples_done
        rate_total += rate
        eta = now + (job.total_samples - done) / rate if rate > 0 else None
        held = ctl.held.get(job.id, ())
        jobs.append({"id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value,
                     "nodes": len(held), "slots": slots.common(held), "ranks": slots.total(held),
                     "min_nodes": job.min_nodes,
                     "max_nodes": job.max_nodes, "priority": job.priority,
                     "samples_per_second": rate, "samples_done": done,
                     "total_samples": job.total_samples, "progress": done / job.total_samples,
                     "eta": eta, "submit_time": job.submit_time, "start_time": job.start_time,
                     "end_time": job.end_time,
                     "confidence": (advisor.confidence(job.id) or ("given" if job.given_curve else "prior"))
                     if advisor is not None else "given",     # never profiled: nothing measured shaped its curve
                     **quota.lines(job.owner, job.state.finished, held_by)})
    for job in ctl.submitted.values():
        jobs.append({"id": job.id, "name": job.name, "owner": job.owner, "state": "queued",
                     "nodes": 0, "slots": slots.same, "ranks": 0, "min_nodes": job.min_nodes, "max_nodes": job.max_nodes,
                     "priority": job.priority, "samples_per_second": 0.0, "samples_done": job.samples_done,
                     "total_samples": job.total_samples, "progress": job.samples_done / job.total_samples, "eta": None,
                     "submit_time": job.submit_time, "start_time": None, "end_time": None,
                     "confidence": ("given" if job.given_curve else "prior") if advisor is not None
                     else "given", **quota.lines(job.owner, job.state.finished, held_by)})
    c = ctl.counters
    kpis = {"idle": len(idle), "harvested": len(owner), "gpus": slots.total(names),
            "idle_gpus": slots.total(idle), "harvested_gpus": slots.total(owner),
            "harvest_pct": 100.0 * c.used_node_s / c.offered_node_s if c.offered_node_s else 0.0,
            "offered_node_s": c.offered_node_s, "used_node_s": c.used_node_s,
            "samples_per_second": rate_total, "running": len(ctl.running),
            "queued": ctl.n_queued + len(ctl.submitted),
            **{s.value: ctl.jobs.count(s) for s in ENDED_STATES},
            "solves": c.solves, "preemptions": c.preemptions, "rescales": c.rescales,
            "events": c.events, "events_by_kind": dict(c.by_kind)}
    cfg = ctl.config
    config = {"policy": cfg.policy, "solver": cfg.solver, "objective": cfg.objective,
              "tfwd": cfg.tfwd, "max_jobs": cfg.max_jobs, "visitor_slots": cfg.visitor_slots,
              "dispatcher": ctl.dispatcher.name,
              "jpa": advisor is not None, "runs_workers": ctl.dispatcher.takes_reports,
              "horizon": ctl.horizon.to_dict(), "reclaim_order": ctl.reclaim_order.to_dict()}
    if advisor is not None:
        kpis.update(probes=c.probes, tries=c.tries, samples=c.samples)
    info = tuple(node_info.get(n, "") for n in names) if node_info else ()
    return Snapshot(now, seq, status, names, state, job_of, tuple(jobs), kpis, when, rescaling,
                    config, dict(source_status or {}), info, probing, ctl.solve_times.histogram(),
                    slots.row(names), tuple(quota.standing(
                        (j.owner for j in (*ctl.jobs.live.values(), *ctl.submitted.values())), held_by, now)),
                    ctl.fair.factors((ctl.jobs[j].owner for j in ctl.running), quota.book.shares, now)
                    if ctl.fair is not None else {})
