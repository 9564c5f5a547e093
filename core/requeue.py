"""A job that failed for reasons of its nodes only goes back to the queue instead (issue 56).

Pure policy on the JOB_FAILED event's named failure (core/failures.py), the controller acts on
the verdict (`Controller._end`): a failure that is the nodes' (they stopped answering, went
silent, were killed from outside: core/dispatchers/blame.py `node_caused`) or the job's store
process that kept ending under it (`store_down`: the harvester's side, not the script's) says
nothing against the job. It is requeued, keeping its samples and its checkpoint folder (the
next start resumes from it), at most `MAX_REQUEUES` times; after that such a failure fails it
as any other. Everything else (the script's own error, a command not found, out of memory, no
progress) fails it at once, as before.
"""
from __future__ import annotations

from typing import Optional

from . import failures
from .dispatchers.blame import node_caused
from .failures import Failure
from .model import Event, EventKind

#: a job is sent back to the queue for its nodes' failures at most this many times, then fails
MAX_REQUEUES = 3


def nodes_only(failure: Optional[dict]) -> bool:
    """The named failure (a JOB_FAILED event's) is its nodes' or the harvester's, none of the job's."""
    f = Failure.from_dict(failure)
    return f is not None and (f.kind == failures.STORE_DOWN or node_caused(f))


def second_chance(ev: Event, requeues: int) -> Optional[Event]:
    """For a running job's JOB_FAILED: the JOB_REQUEUE that replaces it (what the job's events
    say instead), or None when the job fails (its own fault, or requeued `MAX_REQUEUES` times)."""
    if ev.kind is not EventKind.JOB_FAILED or not nodes_only(ev.failure) or requeues >= MAX_REQUEUES:
        return None
    f = Failure.from_dict(ev.failure)
    assert f is not None
    return Event(ev.time, EventKind.JOB_REQUEUE, node=ev.node, job=ev.job, failure=ev.failure, detail=(
        f"back to the queue, not failed: its nodes failed it, not itself ({requeues + 1} of {MAX_REQUEUES}); "
        f"it keeps its samples and resumes from its checkpoint: {f.line()}"))
