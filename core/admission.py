"""Admission rules that cannot be jammed, as pure functions on plain numbers: who may register
a job (it fits the machine; its owner is within quota) and who gets a running slot (a job that
could start on the idle nodes now), so the controller and the service only apply them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

#: queued plus running jobs one user may have (staff are exempt); 0: no limit
DEFAULT_USER_MAX_JOBS = 20


def too_big(min_nodes: int, capacity: int) -> Optional[str]:
    """Why a job can never run here (`capacity`: the most nodes the source can ever offer)."""
    if min_nodes > capacity:
        return (f"min_nodes: {min_nodes} is more than the {capacity} node(s) this harvester can ever offer; "
                f"give at most {capacity}")
    return None


def over_quota(active: int, limit: int, staff: bool) -> Optional[str]:
    """Why a user with `active` queued or running jobs may not register another."""
    if staff or limit <= 0 or active < limit:
        return None
    return f"job: you have {active} queued or running job(s), the most one user may have ({limit}); " \
           "wait for one to end or cancel one"


def can_start(min_nodes: int, idle: int) -> bool:
    """A job can use the idle nodes now (the allocator may still give it none)."""
    return min_nodes <= idle


@dataclass(frozen=True)
class Slot:
    """A running job as admission sees it."""
    job: str
    min_nodes: int
    held: int


def stuck(running: Iterable[Slot], idle: int) -> list[str]:
    """Running jobs that hold no node and could not start on the idle nodes: their slots are
    better given to queued jobs that can start."""
    return [s.job for s in running if s.held == 0 and not can_start(s.min_nodes, idle)]
