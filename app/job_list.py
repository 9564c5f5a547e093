"""A page of the job list, for GET /api/jobs and the Jobs page: the jobs the snapshot lists (live
ones, with their nodes and rates now, and the newest ended) filtered and sorted in memory, merged
with the older ended jobs, which only the store holds, filtered, sorted and paged there. A page
costs O(snapshot + page) in Python; the store answers with its indexes (`History.stored_jobs`).

The merge: the page [offset, offset + limit) of the stored jobs starts at most len(listed) places
before `offset` in their own order, so that window of them, merged with the listed jobs that come
after its first row, is all the page can hold."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key
from typing import Any, Callable, Optional, Sequence

from core.snapshot import STORED, Snapshot

from .queries import ENDED, History, StoredFilter

LIVE = ("queued", "running")
#: the table's state order: what is happening first (running, largest; the queue, in the order it
#: is served), then ended jobs, latest first
STATE_ORDER = {"running": 0, "queued": 1, "done": 2, "failed": 2, "cancelled": 2}
#: the profiler's confidence in a job's curve, from resting on nothing to well measured
CONFIDENCE = ("prior", "given", "low", "medium", "high")


@dataclass(frozen=True)
class JobQuery:
    """Which jobs, in which order: `states` (any when empty), one `owner`, `text` found in the id,
    name or owner, `curves` (confidence words; any when empty), `order` (a key of KEYS)."""

    states: tuple[str, ...] = ()
    owner: Optional[str] = None
    text: str = ""
    curves: tuple[str, ...] = ()
    order: str = "registration"
    descending: bool = False

    def matches(self, job: dict) -> bool:
        if self.states and job["state"] not in self.states:
            return False
        if self.owner is not None and job["owner"] != self.owner:
            return False
        if self.curves and job.get("confidence") not in self.curves:
            return False
        t = self.text.lower()
        return not t or any(t in (job[k] or "").lower() for k in ("id", "name", "owner"))


def _state_key(job: dict) -> Any:
    rank = STATE_ORDER.get(job["state"], len(STATE_ORDER))
    return rank, (-job["nodes"] if rank == 0 else job["submit_time"] if rank == 1 else -(job["end_time"] or 0))


def _curve_key(job: dict) -> Any:
    word = job.get("confidence")
    return CONFIDENCE.index(word) if word in CONFIDENCE else len(CONFIDENCE)


#: each order's key of a job's entry (None: the job sorts last, either way); the store's rows sort
#: the same way (queries.ORDERS), which tests/test_jobs_page_paging.py checks for every order
KEYS: dict[str, Callable[[dict], Any]] = {
    "registration": lambda j: j.get("rowid"), "id": lambda j: j["id"], "name": lambda j: j["name"],
    "owner": lambda j: j["owner"], "state": _state_key, "nodes": lambda j: j["nodes"],
    "samples_per_second": lambda j: j["samples_per_second"], "progress": lambda j: j["progress"],
    "confidence": _curve_key, "eta": lambda j: j["eta"], "submit_time": lambda j: j["submit_time"],
}


@dataclass(frozen=True)
class _Item:
    entry: dict          # what the list shows
    key: Any             # where it sorts (None: last)
    tie: tuple           # among equal keys: listed jobs first, in the snapshot's order, then stored by row


def _before(a: _Item, b: _Item, descending: bool) -> bool:
    if (a.key is None) != (b.key is None):
        return b.key is None
    if a.key is not None and a.key != b.key:
        return a.key > b.key if descending else a.key < b.key
    return a.tie < b.tie


def _merge(xs: Sequence[_Item], ys: Sequence[_Item], descending: bool) -> list[_Item]:
    out, i, k = [], 0, 0
    while i < len(xs) and k < len(ys):
        if _before(ys[k], xs[i], descending):
            out.append(ys[k])
            k += 1
        else:
            out.append(xs[i])
            i += 1
    return out + list(xs[i:]) + list(ys[k:])


def list_jobs(snap: Snapshot, history: Optional[History], q: JobQuery, offset: int,
              limit: int) -> tuple[list[dict], int]:
    """The page [offset, offset + limit) of the jobs that match `q`, in its order, and how many match."""
    key = KEYS[q.order]
    listed = _listed(snap, history, q)
    items = sorted((_Item(j, key(j), (0, n)) for n, j in enumerate(listed)),
                   key=cmp_to_key(lambda a, b: -1 if _before(a, b, q.descending) else 1))
    flt = _stored_filter(snap, q)
    stored = history.count_jobs(flt) if history is not None and flt is not None else 0
    total = len(items) + stored
    if not stored or offset >= total or limit <= 0:
        return [j.entry for j in items[offset:offset + limit]], total
    first = max(0, min(offset - len(items), stored - 1))
    rows = history.stored_jobs(flt, q.order, q.descending, first, offset + limit - first)
    by_id = {j["id"]: j for j in snap.jobs}
    window = []
    for r in rows:
        entry = snap.stored({**r, "samples_done": r["samples_done"] or 0.0})
        window.append(_Item(by_id.get(r["id"], entry), key({**entry, "rowid": r["rowid"]}), (1, r["rowid"])))
    ahead = sum(1 for it in items if _before(it, window[0], q.descending)) if first else 0
    merged = _merge(items[ahead:], window, q.descending)
    start = first + ahead if first else 0
    return [it.entry for it in merged[offset - start:offset - start + limit]], total


def _listed(snap: Snapshot, history: Optional[History], q: JobQuery) -> list[dict]:
    """The snapshot's jobs that match, with their row number in the store for the registration
    order (one not stored yet comes after every stored one)."""
    listed = [j for j in snap.jobs if q.matches(j)]
    if q.order != "registration":
        return listed
    rowids = history.rowids([j["id"] for j in listed]) if history is not None else {}
    return [{**j, "rowid": rowids.get(j["id"], float("inf"))} for j in listed]


def _stored_filter(snap: Snapshot, q: JobQuery) -> Optional[StoredFilter]:
    """The store's part of `q`: ended jobs the snapshot does not list (None: none can match). A
    stored entry's confidence is the same for all (Snapshot.stored), so `curves` keeps all or none."""
    if q.curves and snap.stored({**dict.fromkeys(STORED, 0.0), "total_samples": 1.0})["confidence"] not in q.curves:
        return None
    states = tuple(s for s in ENDED if not q.states or s in q.states)
    if not states:
        return None
    return StoredFilter(states, q.owner, q.text.lower(), tuple(j["id"] for j in snap.jobs),
                        snap.time if snap.seq else None)


def jobs_page(snap: Snapshot, history: Optional[History], owner: Optional[str], state: Optional[str],
             offset: int, limit: int) -> tuple[list[dict], int]:
    """GET /api/jobs's page: registration order, one owner and one state at most."""
    return list_jobs(snap, history, JobQuery(states=(state,) if state else (), owner=owner), offset, limit)
