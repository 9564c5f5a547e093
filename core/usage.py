"""Usage accounting: node-seconds, GPU-seconds and samples per job, owner and account, from what
the store says happened. Pure: plain records in, totals out (no clock, no I/O), so a replay of a
known run and the live server compute the same figures from the same history.

A node counts for a job from the allocation row that added it to the row that removed it (a
shrink, a reclaim, the job's end); a node still held counts up to `until`, the moment the store
was last saved, so nothing unsaved is counted and a restart continues the same figures."""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

BY = ("owner", "job", "account")
#: a nice step for the stacked series, the smallest giving at most SERIES_POINTS buckets
STEPS_S = (60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400)
SERIES_POINTS = 120


@dataclass(frozen=True)
class Change:
    """One allocations row: a job's node set changed at `time`."""
    time: float
    job: str
    added: tuple[str, ...]
    removed: tuple[str, ...]


@dataclass(frozen=True)
class Progress:
    """One throughput row: a job had processed `samples_done` samples at `time` (net of what its
    rescales lost)."""
    time: float
    job: str
    samples_done: float
    rate: float = 0.0      # samples/s from then on, as far as the controller knew


@dataclass(frozen=True)
class JobRecord:
    """What a report says of a job besides its usage (from the jobs table)."""
    id: str
    name: str
    owner: str
    samples_done: float
    end_time: Optional[float] = None


@dataclass(frozen=True)
class Hold:
    """A node held by a job from `start` to `end` (None: still held)."""
    job: str
    node: str
    start: float
    end: Optional[float]


@dataclass
class Totals:
    node_seconds: float = 0.0
    gpu_seconds: float = 0.0
    samples: float = 0.0

    def add(self, other: "Totals") -> None:
        self.node_seconds += other.node_seconds
        self.gpu_seconds += other.gpu_seconds
        self.samples += other.samples


@dataclass
class UsageRow:
    """One line of a report: a job, an owner or an account, with what it used."""
    key: str
    owner: str = ""
    account: str = ""
    name: str = ""
    jobs: int = 0
    totals: Totals = field(default_factory=Totals)
    share: Optional[float] = None     # of the idle node-seconds in the window; None when none were idle

    def to_dict(self, by: str) -> dict:
        row: dict = {by: self.key}
        if by == "job":
            row.update(name=self.name, owner=self.owner, account=self.account or None)
        elif by == "owner":
            row["account"] = self.account or None
        row.update(jobs=self.jobs, node_seconds=self.totals.node_seconds, gpu_seconds=self.totals.gpu_seconds,
                   node_hours=self.totals.node_seconds / 3600.0, samples=self.totals.samples,
                   idle_share=self.share)
        return row


@dataclass
class UsageReport:
    start: float
    end: float
    by: str
    rows: list[UsageRow]
    total: Totals
    jobs: int
    idle_node_seconds: float
    series: dict = field(default_factory=dict)   # {"step", "times", "nodes": {key: [mean nodes per bucket]}}

    def to_dict(self) -> dict:
        idle = self.idle_node_seconds
        return {"from": self.start, "to": self.end, "by": self.by,
                "rows": [r.to_dict(self.by) for r in self.rows],
                "total": {"jobs": self.jobs, "node_seconds": self.total.node_seconds,
                          "gpu_seconds": self.total.gpu_seconds, "node_hours": self.total.node_seconds / 3600.0,
                          "samples": self.total.samples, "idle_node_seconds": idle,
                          "idle_share": self.total.node_seconds / idle if idle > 0 else None}}


def holds(changes: Iterable[Change]) -> list[Hold]:
    """Every (job, node, start, end) in the history, in the order the changes were made. A node
    added to a job while another job still holds it (a row lost to a crash) ends the other's hold
    there: a node is held by one job at a time."""
    out: list[Hold] = []
    open_: dict[str, tuple[str, float]] = {}       # node -> (job, since)
    for c in changes:
        for n in c.removed:
            held = open_.get(n)
            if held is not None and held[0] == c.job:
                out.append(Hold(c.job, n, held[1], c.time))
                del open_[n]
        for n in c.added:
            held = open_.get(n)
            if held is not None:
                out.append(Hold(held[0], n, held[1], c.time))
            open_[n] = (c.job, c.time)
    out.extend(Hold(job, n, since, None) for n, (job, since) in open_.items())
    return out


def overlap(a: float, b: Optional[float], start: float, end: float) -> float:
    """Seconds of [a, b) (b None: open) within [start, end)."""
    return max(0.0, min(end if b is None else b, end) - max(a, start))


def samples_at(points: Sequence[tuple[float, float, float]], close: Optional[tuple[float, float]],
               t: float) -> float:
    """A job's samples done at `t` from its recorded (time, samples_done, samples/s) points: each
    point's rate carries it to the next (exact for simulated workers, whose rescale losses are
    charged at the change; an estimate between reports for real ones). After the last point it
    stops at `close`, (time, samples_done) of the jobs table: the job's end, or the last save."""
    if not points:
        return 0.0
    if t <= points[0][0]:
        return points[0][1]
    i = bisect_right([p[0] for p in points], t) - 1
    t0, s0, rate = points[i]
    value = s0 + (rate or 0.0) * (t - t0)
    if i < len(points) - 1 or close is None:
        return value
    return close[1] if t >= close[0] else min(value, max(close[1], s0))


def progress_points(progress: Iterable[Progress]) -> dict[str, list[tuple[float, float, float]]]:
    """Per job, its recorded progress points in the order recorded."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for p in progress:
        out.setdefault(p.job, []).append((p.time, p.samples_done, p.rate))
    return out


def idle_node_seconds(timeline: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Idle node-seconds in [start, end) from the timeline's (time, idle) points, each count
    standing until the next point (the last one until `end`)."""
    total = 0.0
    for k, (t, idle) in enumerate(timeline):
        nxt = timeline[k + 1][0] if k + 1 < len(timeline) else end
        total += idle * overlap(t, nxt, start, end)
    return total


def series_step(span: float) -> float:
    for s in STEPS_S:
        if span / s <= SERIES_POINTS:
            return float(s)
    return float(math.ceil(span / SERIES_POINTS / 86400.0) * 86400)


def report(changes: Iterable[Change], progress: Iterable[Progress], jobs: Iterable[JobRecord],
           timeline: Sequence[tuple[float, int]], start: Optional[float], end: Optional[float],
           until: float, by: str = "owner", accounts: Mapping[str, str] | None = None,
           slots: Callable[[str], int] = lambda _node: 1, series: bool = False) -> UsageReport:
    """Usage within [start, end) (None: from the first record; to `until`), grouped `by` owner,
    job or account (an owner's account from `accounts`, looked up now). `until`: the moment the
    history was last saved, which no window reaches beyond."""
    if by not in BY:
        raise ValueError(f"by: give one of {', '.join(BY)}, not {by!r}")
    accounts = accounts or {}
    changes = list(changes)
    records = {j.id: j for j in jobs}
    first = min([c.time for c in changes[:1]] + [t for t, _ in timeline[:1]], default=until)
    lo = first if start is None else start
    hi = until if end is None else min(end, until)
    hi = max(hi, lo)
    per_job: dict[str, Totals] = {}
    hs = holds(changes)
    index: dict[str, int] = {}
    job_of = np.fromiter((index.setdefault(h.job, len(index)) for h in hs), dtype=np.int64, count=len(hs))
    starts, ends = _spans(hs, until)
    secs = np.clip(np.minimum(ends, hi) - np.maximum(starts, lo), 0.0, None)
    gpus = secs * np.fromiter((slots(h.node) for h in hs), dtype=float, count=len(hs))
    node_s = np.bincount(job_of, weights=secs, minlength=len(index))
    gpu_s = np.bincount(job_of, weights=gpus, minlength=len(index))
    for jid, k in index.items():
        if node_s[k] > 0:
            per_job[jid] = Totals(float(node_s[k]), float(gpu_s[k]))
    for jid, pts in progress_points(progress).items():
        rec = records.get(jid)
        close = None if rec is None else (rec.end_time if rec.end_time is not None else until, rec.samples_done)
        done = samples_at(pts, close, hi) - samples_at(pts, close, lo)
        if done:
            per_job.setdefault(jid, Totals()).samples += done
    idle = idle_node_seconds(timeline, lo, hi)
    rows: dict[str, UsageRow] = {}
    total = Totals()
    for jid, t in per_job.items():
        rec = records.get(jid) or JobRecord(jid, "", "", 0.0)
        account = accounts.get(rec.owner, "")
        key = {"owner": rec.owner, "job": jid, "account": account}[by]
        row = rows.get(key)
        if row is None:
            row = rows[key] = UsageRow(key, owner=rec.owner if by != "account" else "",
                                       account=account, name=rec.name if by == "job" else "")
        row.jobs += 1
        row.totals.add(t)
        total.add(t)
    for row in rows.values():
        row.share = row.totals.node_seconds / idle if idle > 0 else None
    ordered = sorted(rows.values(), key=lambda r: (-r.totals.node_seconds, r.key))
    out = UsageReport(lo, hi, by, ordered, total, len(per_job), idle)
    if series:
        out.series = _series(hs, records, accounts, by, lo, hi, until)
    return out


def _spans(hs: Sequence[Hold], until: float) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the holds as arrays, a hold still open ending at `until`."""
    starts = np.fromiter((h.start for h in hs), dtype=float, count=len(hs))
    ends = np.fromiter((until if h.end is None else h.end for h in hs), dtype=float, count=len(hs))
    return starts, ends


def _series(hs: Sequence[Hold], records: Mapping[str, JobRecord], accounts: Mapping[str, str], by: str,
            lo: float, hi: float, until: float) -> dict:
    """Mean nodes held per group in each step of [lo, hi): what a stacked chart draws. Per group,
    the node-seconds held before each step's edge, differenced (vectorised: a long run has
    hundreds of thousands of holds)."""
    step = series_step(hi - lo) if hi > lo else 60.0
    base = math.floor(lo / step) * step
    n = max(1, math.ceil((hi - base) / step))
    edges = np.clip(base + step * np.arange(n + 1), lo, hi)
    groups: dict[str, list[int]] = {}
    for k, h in enumerate(hs):
        rec = records.get(h.job)
        owner = rec.owner if rec else ""
        groups.setdefault({"owner": owner, "job": h.job, "account": accounts.get(owner, "")}[by], []).append(k)
    starts, ends = _spans(hs, until)
    nodes: dict[str, list[float]] = {}
    for key, members in groups.items():
        a, b = starts[members], ends[members]
        before = np.array([np.clip(np.minimum(b, x) - a, 0.0, None).sum() for x in edges])
        held = np.diff(before) / step
        if held.any():
            nodes[key] = held.tolist()
    return {"step": step, "times": [base + k * step for k in range(n)], "nodes": nodes}
