"""The usage counters /metrics serves (node-seconds, GPU-seconds and samples per owner since the
run began), kept up to date from what is new in the store rather than recomputed over its whole
history: a read costs O(rows since the last + what is live), where a full report
(core/usage.py) costs O(history), 1.9 s at 200,000 allocation changes.

The figures are the full report's over the whole history as of the store's last save (the same
holds, the same closing rule; tests/test_metrics_cost.py recounts): a node counts for a job from
the row that added it to the row that removed it, a hold still open up to the last save; a
job's samples are its samples done at the last save less those at its first progress point.
GPU-seconds take a node's slots when its hold closes (the report looks them up when it is made).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from .store import read_only
from .usage import Totals

#: job ids per `select ... where id in (...)`
CHUNK = 500


@dataclass(frozen=True)
class JobRow:
    """What the tally needs of a jobs row."""
    owner: str
    ended: bool
    samples_done: float


class UsageTally:
    """Pure: rows in (`apply`), per-owner totals out (`totals`). Memory is O(owners + live holds
    and jobs): an ended job with no node left is folded into its owner's totals and forgotten."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[str, float]] = {}     # node -> (job, since)
        self._held: dict[str, int] = {}                   # job -> nodes it holds
        self._done: dict[str, Totals] = {}                # owner -> closed holds and ended jobs' samples
        self._jobs: dict[str, JobRow] = {}              # jobs holding nodes or not ended, as last read
        self._first: dict[str, float] = {}                # such a job's samples at its first progress point
        self.until: Optional[float] = None

    def watched(self) -> set[str]:
        """The jobs whose rows a read must look at again (not ended, or still holding nodes)."""
        return set(self._jobs)

    def apply(self, jobs: dict[str, JobRow], changes: Iterable[tuple[float, str, list, list]],
              firsts: Iterable[tuple[str, float]], until: Optional[float],
              slots: Callable[[str], int] = lambda _n: 1) -> None:
        """One read: the rows of every job it names or watches (`jobs`), the allocation changes
        and (job, samples) progress points since the last read, in the order made."""
        for jid, state in jobs.items():
            self._jobs[jid] = state
        for t, jid, added, removed in changes:
            self._change(t, jid, added, removed, slots)
        for jid, samples in firsts:
            self._first.setdefault(jid, samples)
        if until is not None:
            self.until = until
        for jid in [j for j, s in self._jobs.items() if s.ended and not self._held.get(j)]:
            state = self._jobs.pop(jid)
            first = self._first.pop(jid, None)
            if first is not None:
                self._owner_totals(state.owner).samples += state.samples_done - first

    def _owner_totals(self, owner: str) -> Totals:
        return self._done.setdefault(owner, Totals())

    def _owner(self, jid: str) -> str:
        state = self._jobs.get(jid)
        return state.owner if state is not None else ""

    def _close(self, node: str, end: float, slots: Callable[[str], int]) -> None:
        jid, since = self._open.pop(node)
        secs = max(0.0, end - since)
        t = self._owner_totals(self._owner(jid))
        t.node_seconds += secs
        t.gpu_seconds += secs * slots(node)
        left = self._held.get(jid, 0) - 1
        if left > 0:
            self._held[jid] = left
        else:
            self._held.pop(jid, None)

    def _change(self, t: float, jid: str, added: list, removed: list, slots: Callable[[str], int]) -> None:
        """core.usage.holds, one change at a time: a node added while another job holds it ends
        that hold there."""
        for n in removed:
            held = self._open.get(n)
            if held is not None and held[0] == jid:
                self._close(n, t, slots)
        for n in added:
            if n in self._open:
                self._close(n, t, slots)
            self._open[n] = (jid, t)
            self._held[jid] = self._held.get(jid, 0) + 1
            self._jobs.setdefault(jid, JobRow("", False, 0.0))

    def totals(self, slots: Callable[[str], int] = lambda _n: 1) -> dict[str, Totals]:
        """Per owner, as of the last read: closed holds and ended jobs, plus what is live now."""
        out = {o: Totals(t.node_seconds, t.gpu_seconds, t.samples) for o, t in self._done.items()}
        until = self.until
        for node, (jid, since) in self._open.items():
            secs = max(0.0, (until if until is not None else since) - since)
            t = out.setdefault(self._owner(jid), Totals())
            t.node_seconds += secs
            t.gpu_seconds += secs * slots(node)
        for jid, first in self._first.items():
            state = self._jobs.get(jid)
            if state is not None:
                out.setdefault(state.owner, Totals()).samples += state.samples_done - first
        return {o: t for o, t in out.items() if t.node_seconds > 0 or t.samples}


class UsageFeed:
    """Reads what is new in the store into a UsageTally, through a read-only connection of its
    own, each read in one transaction (every table as of the same save). A store started over
    (a new replay) is noticed by its row ids going back, and counted again from its start."""

    def __init__(self, path: str | Path, slots: Callable[[str], int] = lambda _n: 1) -> None:
        self.path = Path(path)
        self.slots = slots
        self.tally = UsageTally()
        self.reads = 0
        self._last = (0, 0)            # allocations id, throughput id read up to
        self._conn: Optional[sqlite3.Connection] = None
        self.lock = threading.Lock()

    def totals(self) -> dict[str, Totals]:
        """Per-owner usage since the run began, as of the store's last save."""
        with self.lock:
            self._catch_up()
            return self.tally.totals(self.slots)

    def _catch_up(self) -> None:
        try:
            if self._conn is None:
                self._conn = read_only(self.path, check_same_thread=False, isolation_level=None)
            conn = self._conn
            conn.execute("BEGIN")
            try:
                self._read(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.OperationalError:
            return          # the store is being created or reset: the last figures stand
        self.reads += 1

    def _read(self, conn: sqlite3.Connection) -> None:
        top = conn.execute("select coalesce(max(id), 0) from allocations").fetchone()[0]
        if top < self._last[0]:
            self.tally, self._last = UsageTally(), (0, 0)
        changes = conn.execute("select id, time, job, added, removed from allocations where id > ? order by id",
                               (self._last[0],)).fetchall()
        progress = conn.execute("select id, job, samples_done from throughput where id > ? and samples_done "
                                "is not null order by id", (self._last[1],)).fetchall()
        clock = conn.execute("select value from meta where key = 'clock'").fetchone()
        wanted = self.tally.watched() | {r[2] for r in changes} | {r[1] for r in progress}
        jobs = _job_rows(conn, sorted(wanted))
        self.tally.apply(jobs, ((t, j, _names(a), _names(r)) for _, t, j, a, r in changes),
                         ((j, s) for _, j, s in progress), _clock(clock), self.slots)
        self._last = (changes[-1][0] if changes else self._last[0], progress[-1][0] if progress else self._last[1])

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _job_rows(conn: sqlite3.Connection, ids: list[str]) -> dict[str, JobRow]:
    out: dict[str, JobRow] = {}
    for k in range(0, len(ids), CHUNK):
        part = ids[k:k + CHUNK]
        rows = conn.execute(f"select id, coalesce(owner, ''), state, coalesce(samples_done, 0) from jobs "
                            f"where id in ({','.join('?' * len(part))})", part)
        for jid, owner, state, done in rows:
            out[jid] = JobRow(owner, state in ("done", "failed", "cancelled"), float(done))
    return out


def _names(text: Optional[str]) -> list:
    """A JSON list of node names, as the allocations table keeps them ('[]' most often)."""
    return json.loads(text) if text and text != "[]" else []


def _clock(row: Optional[tuple]) -> Optional[float]:
    try:
        return float(json.loads(row[0])) if row else None
    except (ValueError, TypeError):
        return None
