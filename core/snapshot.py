"""An immutable picture of the controller that readers (the dashboard, the API, /metrics) can
hold without locks: the controller builds one (`Controller.snapshot`) after each tick and the
runner swaps the reference."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from .counters import SOLVE_BUCKETS_S, SolveHistogram
from .model import Job

BUSY, IDLE, HELD = 0, 1, 2   # node codes in Snapshot.state
#: a node's info line begins with this while it is held out for a fault of its own (not offered;
#: the grid and /api/cluster call it "lost" rather than "busy")
LOST_PREFIX = "lost "
__all__ = ["BUSY", "HELD", "IDLE", "LOST_PREFIX", "SOLVE_BUCKETS_S", "Snapshot", "empty_snapshot"]


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
    slots: tuple[int, ...] = ()                  # ranks (GPUs) per node; a job runs the sum over its nodes
    quotas: tuple[dict, ...] = ()                # owners with limits: held / cap, node-hours used / quota (core.quotas)
    fair_shares: dict = field(default_factory=dict)   # owner -> fair-share factor now (core.fairshare; {} when off)

    def job(self, job_id: str) -> Optional[dict]:
        for j in self.jobs:
            if j["id"] == job_id:
                return j
        return None

    def line(self, job: Job) -> dict:
        """The job's entry as this snapshot lists it; for a job it does not list (an ended one:
        the snapshot keeps the live ones and the newest ended), one made from the job as stored."""
        info = self.job(job.id)
        if info is not None:
            return info
        return self.stored({**{k: getattr(job, k) for k in STORED}, "state": job.state.value})

    def stored(self, row: Mapping) -> dict:
        """An entry like the snapshot's for a job as the store's jobs table has it (`row`: its
        columns), holding no node now."""
        same = set(self.slots)
        line = {k: row[k] for k in STORED}
        return {**line, "nodes": 0, "slots": same.pop() if len(same) == 1 else None, "ranks": 0,
                "samples_per_second": 0.0, "progress": row["samples_done"] / row["total_samples"], "eta": None,
                "confidence": None if self.config.get("jpa") else "given"}


#: what an entry of an ended job takes from the job as stored
STORED = ("id", "name", "owner", "state", "min_nodes", "max_nodes", "priority", "samples_done", "total_samples",
          "submit_time", "start_time", "end_time")


def empty_snapshot(status: str = "loading", seq: int = 0) -> Snapshot:
    return Snapshot(0.0, seq, status, (), (), ())
