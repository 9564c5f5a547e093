"""Admission rules that cannot be jammed, as pure functions on plain numbers: who may register
a job (it fits the machine; its owner is within quota) and who gets a running slot (a job that
could start on the idle nodes now), so the controller and the service only apply them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from .model import Curve

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


def runs_as(has_command: bool, unix: str, site_maps: bool, staff: bool, trusted: bool) -> tuple[str, Optional[str]]:
    """The Unix account a job's command runs as ('': the harvester's own), or why it is refused.
    A command runs as its owner where the site has a launcher (`site_maps`) and the owner a Unix
    name; otherwise it would run with the harvester's rights, which only staff, or everyone on a
    site that says it trusts its users (`trusted`), may use."""
    if not has_command:
        return "", None
    if site_maps and unix:
        return unix, None
    if staff or trusted:
        return "", None
    if site_maps:
        return "", ("command: your login is not mapped to a Unix account on this site, so your command cannot "
                    "run as you; ask staff to map it (the users file's unix field)")
    return "", ("command: this site runs commands only for staff: it maps no login to a Unix account, and a "
                "command would run with the harvester's own rights; ask staff to run it, or to map logins to "
                "Unix accounts")


def progresses(curve: Curve, lo: int, hi: int) -> bool:
    """The curve gives some throughput at a size from `lo` to `hi` nodes (it is piecewise linear,
    so its largest value there is at an end or at one of its points)."""
    sizes = [lo, hi, *(n for n in curve.nodes if lo <= n <= hi)]
    return any(curve(n) > 0 for n in sizes)


def can_start(min_nodes: int, idle: int) -> bool:
    """A job can use the idle nodes now (the allocator may still give it none)."""
    return min_nodes <= idle


@dataclass(frozen=True)
class Slot:
    """A running job as admission sees it."""
    job: str
    min_nodes: int
    held: int
    blocked: bool = False     # its owner is over a period quota (core.quotas): it may not run now


def stuck(running: Iterable[Slot], idle: int) -> list[str]:
    """Running jobs that hold no node and could not start on the idle nodes (or whose owner is
    over a period quota): their slots are better given to queued jobs that can start."""
    return [s.job for s in running if s.held == 0 and (s.blocked or not can_start(s.min_nodes, idle))]


def free_slots(max_jobs: int, visitor_slots: int, running: int, running_in_lane: int, lane: bool) -> int:
    """Running slots a queued job may still take: the job set's `max_jobs`, and for a registered
    job while the demo lane is on (`lane`) also the `visitor_slots` kept for such jobs alone,
    of which `running_in_lane` of the `running` jobs use some."""
    if lane:
        return max_jobs + visitor_slots - running
    return max_jobs - (running - min(running_in_lane, visitor_slots))
