"""Why a job holds the nodes it holds, in plain words, from the same objective the allocator
maximises (throughput over T_fwd minus the samples lost in a rescale pause)."""
from __future__ import annotations

import time
from typing import Optional

from .model import Job, JobState


def _rate(job: Job, n: int) -> float:
    return job.curve(n) if n >= job.min_nodes else 0.0


def _when(t: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t is not None else "?"


def why(job: Job, nodes: int, idle: int, used: int, running: int, max_jobs: int, tfwd: float,
        policy: str = "milp", queue_position: Optional[int] = None) -> str:
    state = job.state
    if state is JobState.QUEUED:
        pos = f", number {queue_position} in the queue" if queue_position else ""
        return f"queued: {running} jobs already running (at most {max_jobs} at once){pos}"
    if state.finished:
        return f"{state.value} at {_when(job.end_time)}: holds no nodes"
    free = max(0, idle - used)
    if nodes >= job.max_nodes:
        return f"holds {nodes} nodes: its maximum"
    if nodes == 0:
        if idle == 0:
            return "waiting: no node is idle"
        if free < job.min_nodes:
            return (f"waiting: needs at least {job.min_nodes} nodes and only {free} of the {idle} idle "
                    f"nodes are free; the others are worth more to the running jobs")
        return f"waiting: starting on {job.min_nodes} nodes is worth less than the rescale cost"
    s_now = _rate(job, nodes)
    if free > 0:
        top = min(job.max_nodes, nodes + free)
        best_m, best_gain = nodes + 1, float("-inf")
        for m in range(nodes + 1, top + 1):
            gain = tfwd * (_rate(job, m) - s_now) - job.scale_up_seconds * s_now
            if gain > best_gain:
                best_m, best_gain = m, gain
        if best_gain <= 0:
            extra = _rate(job, best_m) - s_now
            lost = job.scale_up_seconds * s_now
            return (f"holds {nodes} nodes: growing to {best_m} adds {extra:,.0f} samples/s, "
                    f"{tfwd * extra:,.0f} samples over T_fwd = {tfwd:g} s, less than the "
                    f"{lost:,.0f} samples lost in its {job.scale_up_seconds:g} s rescale pause")
        return (f"holds {nodes} nodes: {free} nodes are free, but the {policy} policy did not "
                f"give it more")
    extra = _rate(job, nodes + 1) - s_now
    return (f"holds {nodes} nodes: all {idle} idle nodes are in use; node {nodes + 1} would add "
            f"{extra:,.0f} samples/s, less than that node gives another job")
