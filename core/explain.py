"""Why a job holds the nodes it holds, in plain words, from the same objective the allocator
maximises (throughput over T_fwd minus the samples lost in a rescale pause)."""
from __future__ import annotations

import time
from typing import Optional

from .failures import Failure
from .model import Job, JobState


def _rate(job: Job, n: int) -> float:
    return job.curve(n) if n >= job.min_nodes else 0.0


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


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
            return (f"queued: needs {job.min_nodes} idle node{'s' if job.min_nodes != 1 else ''} to start, "
                    f"{idle} {'is' if idle == 1 else 'are'} idle{pos}")
        return (f"queued: {running} job{'s' if running != 1 else ''} already running "
                f"(at most {max_jobs} at once){pos}")
    if state.finished:
        failure = Failure.from_dict(job.failure) if state is JobState.FAILED else None
        if failure is not None:
            return f"failed at {_when(job.end_time)}: {failure.line()}"
        return f"{state.value} at {_when(job.end_time)}: holds no nodes"
    free = max(0, idle - used)
    if quota:
        return f"waiting: {quota}" if nodes == 0 else f"holds {_nodes(nodes)}, giving them back: {quota}"
    trying = profiling(profile, nodes) if profile and nodes > 0 else None
    if nodes >= job.max_nodes and not trying:
        return f"holds {_nodes(nodes)}: its maximum"
    if node_cap:
        return f"waiting: {node_cap}" if nodes == 0 else f"holds {_nodes(nodes)}: {node_cap}"
    if trying:             # what the profiler tries now, as the chart's probes say (not the allocator's reckoning)
        return f"holds {_nodes(nodes)}: {trying}"
    if nodes >= cap:
        return (f"holds {_nodes(nodes)}: the most the evidence supports until it is measured at more "
                f"(cap {cap}, twice the largest size measured or as far as the fit is sure)")
    if nodes == 0:
        if idle == 0:
            return "waiting: no node is idle"
        if free < job.min_nodes:
            return (f"waiting: needs at least {_nodes(job.min_nodes)} and "
                    f"only {free} of the {_nodes(idle)} idle {'is' if free == 1 else 'are'} free; "
                    f"the others are worth more to the running jobs")
        return f"waiting: starting on {_nodes(job.min_nodes)} is worth less than the rescale cost"
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
                if profile:              # the page draws the fit and the measured points: say which is which
                    fit = profile.get("fit") or {}
                    peak, ns = fit.get("peak"), fit.get("nodes") or []
                    note = (f" (the fit peaks at {_nodes(peak)}, below what {_nodes(nodes)} measured)"
                            if isinstance(peak, int) and peak > nodes and peak in ns
                            and fit["mean"][ns.index(peak)] <= s_now and _source(profile, nodes) == "measured"
                            else "")
                    return (f"holds {_nodes(nodes)}: {_nodes(best_m)} would be no faster: "
                            f"{_source(profile, best_m)} {_rate(job, best_m):,.0f} samples/s there, "
                            f"against {s_now:,.0f} {_source(profile, nodes, here=True)}{note}")
                return (f"holds {_nodes(nodes)}: the curve in use is no faster at {_nodes(best_m)} "
                        f"({_rate(job, best_m):,.0f} against {s_now:,.0f} samples/s now)")
            lost = up * s_now
            if learned:
                return (f"holds {_nodes(nodes)}: growing to {best_m} pays off if the new allocation stands "
                        f"{lost / extra:,.0f} s (+{extra:,.0f} samples/s against {lost:,.0f} samples lost in "
                        f"its {up:.3g} s rescale pause); allocations have stood {tfwd:,.0f} s (median)")
            return (f"holds {_nodes(nodes)}: growing to {best_m} adds {extra:,.0f} samples/s, "
                    f"{tfwd * extra:,.0f} samples over T_fwd = {tfwd:g} s, less than the "
                    f"{lost:,.0f} samples lost in its {up:.3g} s rescale pause")
        return (f"holds {_nodes(nodes)}: {_nodes(free)} {'is' if free == 1 else 'are'} free, but the {policy} "
                f"policy did not give it more")
    in_use = "the one idle node is in use" if idle == 1 else f"all {idle} idle nodes are in use"
    extra = _rate(job, nodes + 1) - s_now
    if extra <= 0:
        return f"holds {_nodes(nodes)}: {in_use}, and one more would not speed it up"
    return (f"holds {_nodes(nodes)}: {in_use}; node {nodes + 1} would add "
            f"{extra:,.0f} samples/s, less than that node gives another job")


def _source(profile: dict, n: int, here: bool = False) -> str:
    """Where the rate at `n` the allocator uses comes from: measured there, or the fit's."""
    measured = any(m.get("nodes") == n for m in profile.get("measured") or ())
    if here:
        return f"measured at {_nodes(n)} now" if measured else f"expected at {_nodes(n)} now (the fit's)"
    return "measured" if measured else "the fit expects"


def profiling(profile: dict, nodes: int) -> Optional[str]:
    """What the profiler is trying while the job holds `nodes`, and why, in the words of the
    chart on the same page (its probes, the fit): a size the job runs at with no sample there
    yet, or the size the profiler has asked for next. None when it tries nothing now."""
    probes = profile.get("probes") or []

    def reason(size: int) -> tuple[str, str]:
        """The kind of the last probe entry at `size` (core/jpa/probes.py) and its reckoning."""
        entry = next((p for p in reversed(probes) if p.get("nodes") == size), None)
        if entry is None:
            return "try", ""
        head, sep, rest = str(entry.get("why") or "").partition(": ")
        rest = rest if sep else head
        if rest.startswith("profiling (") and rest.endswith(")"):     # "profiling (1 of 3 sizes measured)"
            rest = rest[len("profiling ("):-1]
        return str(entry.get("kind") or "probe"), rest

    def said(why: str) -> str:
        return f"(profiling: {why})" if why else "(profiling)"

    if profile.get("probing") and profile.get("size") == nodes:
        kind, why = reason(nodes)
        if kind == "probe":
            return f"trying {_nodes(nodes)} to measure its throughput there {said(why)}"
        if kind == "climb":
            return f"trying {_nodes(nodes)}, measured before it grows further {said(why)}"
        fit = profile.get("fit") or {}
        ns, mean = fit.get("nodes") or [], fit.get("mean") or []
        expects = f"; the fit expects {mean[ns.index(nodes)]:,.0f} samples/s there" if nodes in ns else ""
        return f"measuring its throughput at {_nodes(nodes)}, a size not measured yet{expects}"
    want = profile.get("probe")
    if isinstance(want, int) and want > 0 and want != nodes:
        kind, why = reason(want)
        verb = {"back": "going back to", "climb": "growing to"}.get(kind, "trying")
        aim = "" if kind == "back" else " to measure its throughput there"
        return f"{verb} {_nodes(want)} next{aim} {said(why)}"
    return None
