"""An immutable picture of the controller that readers (the dashboard, the API, /metrics) can
hold without locks: the controller builds one (`Controller.snapshot`) after each tick and the
runner swaps the reference."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .counters import SOLVE_BUCKETS_S, SolveHistogram
from .model import JobState

if TYPE_CHECKING:
    from .controller import Controller

BUSY, IDLE, HELD = 0, 1, 2   # node codes in Snapshot.state
__all__ = ["BUSY", "HELD", "IDLE", "SOLVE_BUCKETS_S", "Snapshot", "build_snapshot", "empty_snapshot"]


@dataclass(frozen=True)
class Snapshot:
    time: float
    seq: int
    status: str                                  # running | paused | finished | stopped | loading
    nodes: tuple[str, ...]                       # machine order, the same in every snapshot
    state: tuple[int, ...]                       # BUSY / IDLE / HELD per node
    job_of: tuple[Optional[str], ...]            # holder per node
    jobs: tuple[dict, ...] = ()
    kpis: dict = field(default_factory=dict)
    since: tuple[Optional[float], ...] = ()      # when each node last changed state or holder
    rescaling: frozenset = frozenset()           # jobs inside a rescale pause right now
    config: dict = field(default_factory=dict)   # tfwd, max_jobs, policy, ... of the controller
    source_status: dict = field(default_factory=dict)  # live: SourceStatus.to_dict() (ok | stale | dry-run)
    node_info: tuple[str, ...] = ()              # live: what the source says of each node (Slurm's state)
    probing: frozenset = frozenset()             # jobs at a size they have no sample at yet (JPA)
    solve_times: SolveHistogram = SolveHistogram()  # every solve so far, bucketed (for /metrics)

    def job(self, job_id: str) -> Optional[dict]:
        for j in self.jobs:
            if j["id"] == job_id:
                return j
        return None


def empty_snapshot(status: str = "loading", seq: int = 0) -> Snapshot:
    return Snapshot(0.0, seq, status, (), (), ())


def build_snapshot(ctl: "Controller", status: str, seq: int, source_status: Optional[dict] = None,
                   node_info: Optional[dict[str, str]] = None) -> Snapshot:
    """Called by Controller.snapshot with its lock held."""
    now = ctl.clock.now()
    names = tuple(ctl.node_names or ctl.idle)
    idle, owner, since = ctl.idle, ctl.owner, ctl.since
    state = tuple(HELD if n in owner else IDLE if n in idle else BUSY for n in names)
    job_of = tuple(owner.get(n) for n in names)
    when = tuple(since.get(n) for n in names)
    rescaling = frozenset(j for j, t in ctl.rescaling_until.items() if t > now)
    advisor = ctl.advisor
    probing = frozenset(advisor.probing()) if advisor is not None else frozenset()
    jobs = []
    rate_total = 0.0
    for job in ctl.jobs.values():
        running = job.id in ctl.running
        rate = ctl.dispatcher.rate(job) if running else 0.0
        done = ctl.dispatcher.progress(job, now) if running else job.samples_done
        rate_total += rate
        eta = now + (job.total_samples - done) / rate if rate > 0 else None
        jobs.append({"id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value,
                     "nodes": len(ctl.held.get(job.id, ())), "min_nodes": job.min_nodes,
                     "max_nodes": job.max_nodes, "priority": job.priority,
                     "samples_per_second": rate, "samples_done": done,
                     "total_samples": job.total_samples, "progress": done / job.total_samples,
                     "eta": eta, "submit_time": job.submit_time, "start_time": job.start_time,
                     "end_time": job.end_time,
                     "confidence": advisor.confidence(job.id) if advisor is not None else "given"})
    for job in ctl.submitted.values():
        jobs.append({"id": job.id, "name": job.name, "owner": job.owner, "state": "queued",
                     "nodes": 0, "min_nodes": job.min_nodes, "max_nodes": job.max_nodes,
                     "priority": job.priority, "samples_per_second": 0.0, "samples_done": 0.0,
                     "total_samples": job.total_samples, "progress": 0.0, "eta": None,
                     "submit_time": job.submit_time, "start_time": None, "end_time": None,
                     "confidence": ("given" if job.given_curve else "prior") if advisor is not None
                     else "given"})
    c = ctl.counters
    kpis = {"idle": len(idle), "harvested": len(owner),
            "harvest_pct": 100.0 * c.used_node_s / c.offered_node_s if c.offered_node_s else 0.0,
            "samples_per_second": rate_total, "running": len(ctl.running),
            "queued": ctl.n_queued + len(ctl.submitted),
            "done": sum(1 for j in ctl.jobs.values() if j.state is JobState.DONE),
            "solves": c.solves, "preemptions": c.preemptions, "rescales": c.rescales,
            "events": c.events, "events_by_kind": dict(c.by_kind)}
    cfg = ctl.config
    config = {"policy": cfg.policy, "solver": cfg.solver, "objective": cfg.objective,
              "tfwd": cfg.tfwd, "max_jobs": cfg.max_jobs, "dispatcher": ctl.dispatcher.name,
              "jpa": advisor is not None}
    if advisor is not None:
        kpis.update(probes=c.probes, tries=c.tries, samples=c.samples)
    info = tuple(node_info.get(n, "") for n in names) if node_info else ()
    return Snapshot(now, seq, status, names, state, job_of, tuple(jobs), kpis, when, rescaling,
                    config, dict(source_status or {}), info, probing, ctl.solve_times.histogram())
