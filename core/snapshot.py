"""An immutable picture of the controller that readers (the dashboard, the API) can hold
without locks: the runner builds a new one after each tick and swaps the reference."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .controller import Controller
from .model import JobState

BUSY, IDLE, HELD = 0, 1, 2   # node codes in Snapshot.state


@dataclass(frozen=True)
class Snapshot:
    time: float
    seq: int
    status: str                                  # running | paused | finished | stopped
    nodes: tuple[str, ...]                       # machine order, the same in every snapshot
    state: tuple[int, ...]                       # BUSY / IDLE / HELD per node
    job_of: tuple[Optional[str], ...]            # holder per node
    jobs: tuple[dict, ...] = ()
    kpis: dict = field(default_factory=dict)


def build_snapshot(ctl: Controller, status: str, seq: int) -> Snapshot:
    with ctl.lock:
        now = ctl.clock.now()
        names = tuple(ctl.node_names or ctl.idle)
        idle, owner = ctl.idle, ctl.owner
        state = tuple(HELD if n in owner else IDLE if n in idle else BUSY for n in names)
        job_of = tuple(owner.get(n) for n in names)
        jobs = []
        rate_total = 0.0
        for job in ctl.jobs.values():
            running = job.id in ctl.running
            rate = ctl.dispatcher.rate(job) if running else 0.0
            done = ctl.dispatcher.progress(job, now) if running else job.samples_done
            rate_total += rate
            jobs.append({"id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value,
                         "nodes": len(ctl.held.get(job.id, ())), "samples_per_second": rate,
                         "samples_done": done, "total_samples": job.total_samples,
                         "progress": done / job.total_samples, "submit_time": job.submit_time,
                         "end_time": job.end_time})
        c = ctl.counters
        kpis = {"idle": len(idle), "harvested": len(owner),
                "harvest_pct": 100.0 * c.used_node_s / c.offered_node_s if c.offered_node_s else 0.0,
                "samples_per_second": rate_total, "running": len(ctl.running), "queued": ctl.n_queued,
                "done": sum(1 for j in ctl.jobs.values() if j.state is JobState.DONE),
                "solves": c.solves, "preemptions": c.preemptions, "rescales": c.rescales}
        return Snapshot(now, seq, status, names, state, job_of, tuple(jobs), kpis)
