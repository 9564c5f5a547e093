"""Why a job holds the nodes it holds, in plain words, from the same objective the allocator
maximises (throughput over T_fwd minus the samples lost in a rescale pause)."""
from __future__ import annotations

import time
from typing import Optional

from .failures import Failure
from .model import Job, JobState


def _rate(job: Job, n: int) -> float:
    return job.curve(n) if n >= job.min_nodes else 0.0


def _when(t: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t is not None else "?"


def horizon_of(config: dict, job_id: str) -> tuple[float, bool]:
    """The seconds the allocator amortised this job's rescale over, and whether they were learned
    (`tfwd auto`: the horizon of the snapshot's last decision) or the fixed T_fwd."""
    h = config.get("horizon") or {}
    tfwd = config.get("tfwd", 10.0)
    if h.get("learned"):
        return float((h.get("jobs") or {}).get(job_id, h["tfwd"])), True
    return float(h.get("tfwd", 10.0)) if isinstance(tfwd, str) else float(tfwd), False


def why(job: Job, nodes: int, idle: int, used: int, running: int, max_jobs: int, tfwd: float,
        policy: str = "milp", queue_position: Optional[int] = None,
        profile: Optional[dict] = None, learned: bool = False, quota: Optional[str] = None,
        node_cap: Optional[str] = None) -> str:
    """`profile`: what the profiler learned (its cap and rescale costs are what the allocator
    used), or None when the job's own curve and costs are taken as given. `learned`: `tfwd` is
    the horizon learned from how long allocations stood before they changed (their median).
    `quota`: why its owner may have no nodes now (a period quota used up, core.quotas);
    `node_cap`: that its owner's (or account's) jobs hold all their node cap allows."""
    state = job.state
    up = profile["scale_up_seconds"] if profile else job.scale_up_seconds
    cap = min(job.max_nodes, profile["cap"]) if profile else job.max_nodes
    if state is JobState.QUEUED:
        pos = f", number {queue_position} in the queue" if queue_position else ""
        if quota:
            return f"queued: {quota}{pos}"
        if job.min_nodes > idle:
            return f"queued: needs {job.min_nodes} idle nodes to start, {idle} are idle{pos}"
        return f"queued: {running} jobs already running (at most {max_jobs} at once){pos}"
    if state.finished:
        failure = Failure.from_dict(job.failure) if state is JobState.FAILED else None
        if failure is not None:
            return f"failed at {_when(job.end_time)}: {failure.line()}"
        return f"{state.value} at {_when(job.end_time)}: holds no nodes"
    free = max(0, idle - used)
    if quota:
        return f"waiting: {quota}" if nodes == 0 else f"holds {nodes} nodes, giving them back: {quota}"
    if nodes >= job.max_nodes:
        return f"holds {nodes} nodes: its maximum"
    if node_cap:
        return f"waiting: {node_cap}" if nodes == 0 else f"holds {nodes} nodes: {node_cap}"
    if nodes >= cap:
        return (f"holds {nodes} nodes: the most the evidence supports until it is measured at more "
                f"(cap {cap}, twice the largest size measured or as far as the fit is sure)")
    if nodes == 0:
        if idle == 0:
            return "waiting: no node is idle"
        if free < job.min_nodes:
            return (f"waiting: needs at least {job.min_nodes} node{'s' if job.min_nodes != 1 else ''} and "
                    f"only {free} of the {idle} idle "
                    f"nodes are free; the others are worth more to the running jobs")
        return f"waiting: starting on {job.min_nodes} nodes is worth less than the rescale cost"
    s_now = _rate(job, nodes)
    if free > 0:
        top = min(cap, nodes + free)
        best_m, best_gain = nodes + 1, float("-inf")
        for m in range(nodes + 1, top + 1):
            gain = tfwd * (_rate(job, m) - s_now) - up * s_now
            if gain > best_gain:
                best_m, best_gain = m, gain
        if best_gain <= 0:
            extra = _rate(job, best_m) - s_now
            if extra <= 0:
                return (f"holds {nodes} nodes: the curve in use is no faster at {best_m} "
                        f"({_rate(job, best_m):,.0f} against {s_now:,.0f} samples/s now)")
            lost = up * s_now
            if learned:
                return (f"holds {nodes} nodes: growing to {best_m} pays off if the new allocation stands "
                        f"{lost / extra:,.0f} s (+{extra:,.0f} samples/s against {lost:,.0f} samples lost in "
                        f"its {up:.3g} s rescale pause); allocations have stood {tfwd:,.0f} s (median)")
            return (f"holds {nodes} nodes: growing to {best_m} adds {extra:,.0f} samples/s, "
                    f"{tfwd * extra:,.0f} samples over T_fwd = {tfwd:g} s, less than the "
                    f"{lost:,.0f} samples lost in its {up:.3g} s rescale pause")
        return (f"holds {nodes} nodes: {free} nodes are free, but the {policy} policy did not "
                f"give it more")
    extra = _rate(job, nodes + 1) - s_now
    if extra <= 0:
        return f"holds {nodes} nodes: all {idle} idle nodes are in use, and one more would not speed it up"
    return (f"holds {nodes} nodes: all {idle} idle nodes are in use; node {nodes + 1} would add "
            f"{extra:,.0f} samples/s, less than that node gives another job")
