"""Why idle nodes sit unused while jobs wait: the running-job limit (`--max-jobs`), said in words
on the Cluster page, so that a full queue beside an idle machine does not look like a fault."""
from __future__ import annotations

from core.admission import free_slots
from core.snapshot import Snapshot


def _nodes(n: int) -> str:
    return f"{n:,} idle node" + ("" if n == 1 else "s")


def held_back(snap: Snapshot) -> str:
    """`1,208 idle nodes unused while 577 jobs wait: at most 10 jobs run at once (--max-jobs 10).
    A higher --max-jobs would start more.`, or "" unless that is so now: nodes idle and unused,
    and queued jobs that could start on them but for a running slot (with the demo lane,
    registered jobs have `visitor_slots` more)."""
    k = snap.kpis or {}
    unused = k.get("idle", 0) - k.get("harvested", 0)
    max_jobs = snap.config.get("max_jobs")
    if unused <= 0 or not max_jobs:
        return ""
    lane = snap.config.get("visitor_slots", 0) or 0
    running = [j for j in snap.jobs if j["state"] == "running"]
    in_lane = sum(1 for j in running if j.get("owner")) if lane else 0
    free_set = free_slots(max_jobs, lane, len(running), in_lane, lane=False)
    free_lane = free_slots(max_jobs, lane, len(running), in_lane, lane=True)
    blocked = [j for j in snap.jobs if j["state"] == "queued" and j.get("min_nodes", 1) <= unused
               and (free_lane if lane and j.get("owner") else free_set) <= 0]
    if not blocked:
        return ""
    lane_full = lane and any(j.get("owner") for j in blocked)
    waiting = len(blocked)
    jobs = "1 job waits" if waiting == 1 else f"{waiting:,} jobs wait"
    runs = "1 job runs" if max_jobs == 1 else f"{max_jobs:,} jobs run"
    limit = f"at most {runs} at once (--max-jobs {max_jobs})" + (
        f", {lane} more for registered jobs (--visitor-slots {lane})" if lane_full else "")
    return f"{_nodes(unused)} unused while {jobs}: {limit}. A higher --max-jobs would start more."
