"""Who holds a running slot, applied to the controller's state at each step: queued jobs that
can start take free slots in queue order; a running job that holds no node and cannot start
(or whose owner is over quota) gives its slot back when a queued job could use it; and a job
whose throughput is 0 at every size it may have never holds one (the rules: core/admission.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .admission import Slot, can_start, progresses, stuck
from .model import Job, JobState
from .store import job_row

if TYPE_CHECKING:
    from .controller import Controller

#: why a job with no throughput goes back to the queue (its requeue event says so)
NO_THROUGHPUT = "its throughput is 0 at every size it may have: it would hold a running slot on no node"


def useless(job: Job) -> bool:
    """The allocator would give the job no node at any size (its curve, as the allocator
    believes it, is 0 from its minimum to its maximum)."""
    return not progresses(job.curve, job.min_nodes, job.max_nodes)


def startable(ctl: "Controller", job: Job, idle: int) -> bool:
    """Enough idle nodes for the job's minimum, its owner within their period quotas, and some
    throughput at a size it may have."""
    return can_start(job.min_nodes, idle) and ctl.quota.may_run(job.owner) and not useless(job)


def admit(ctl: "Controller", now: float) -> bool:
    """Give free running slots, in queue order, to queued jobs that can start on the idle
    nodes now; others keep their place. With every slot taken, jobs that hold no node and
    cannot start give theirs back to the queue when a queued job could start. True when a
    job changed state."""
    idle = len(ctl.idle)
    live = ctl.jobs.live
    idling = [j for j in ctl.running if useless(live[j])]
    for jid in idling:          # running on no node for ever otherwise: back to the queue, in its place
        ctl._requeue(jid, now, why=NO_THROUGHPUT)
    changed = bool(idling)
    can = [j for j in ctl.queue.queued(live, ordered=False) if startable(ctl, j, idle)]
    if not can:
        return changed     # nobody can start: leave the queue alone (a cheap scan, no reshuffle)
    running = [live[j] for j in ctl.running]
    free = {lane: ctl.queue.free_slots(lane, running) for lane in (False, True)}
    if not any(free[ctl.queue.in_lane(j)] > 0 for j in can):
        waiting = stuck((Slot(j, live[j].min_nodes, len(ctl.held.get(j, ())),
                              not ctl.quota.may_run(live[j].owner)) for j in ctl.running), idle)
        for jid in waiting:
            ctl._requeue(jid, now)
        changed |= bool(waiting)
    for job in ctl.queue.admit(live, [live[j] for j in ctl.running], lambda j: startable(ctl, j, idle)):
        job.state = JobState.RUNNING
        job.start_time = job.start_time if job.start_time is not None else now
        ctl.running[job.id] = None
        ctl.held.setdefault(job.id, [])
        ctl._batch.jobs[job.id] = job_row(job)
        changed = True
    return changed
