"""What bench.scale measures, from outside the harvester so that measuring costs it nothing while it
runs: its process in /proc, its store (SQLite) read after the run, /metrics, and the grid
callback a browser on the cluster page polls.

When a node entered or left an allocation comes from the store's `allocations` table: every
allocation change the controller makes is one row with `time` (live mode: time.time() at the
start of the controller step that made it), the job, and the nodes `added` and `removed`. The
pilots keep when they said hello and leaving on the same clock (bench/scale_pilots.py), so
hello -> allocated and leaving -> shrunk are exact to the step, with no polling and no load on
the harvester while it runs. The step's own solve time follows the row's time and is reported
apart (`alloc_ms_p99`: the `solver_runs` table's solve_ms, every decision the allocator made)."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from core.replay import percentile

from .scale_pilots import PilotRecord

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: the store's clock and the pilots' are the same host's time.time(); a row a hair earlier than
#: a hello is the same moment (floats written and read back)
EPS_S = 0.0005


@dataclass
class Cpu:
    own_s: float
    children_s: float


def proc_cpu(pid: int) -> Cpu:
    """CPU seconds of the process and of its reaped children (the fake Slurm commands it ran)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = [int(fields[i]) for i in (11, 12, 13, 14)]
    return Cpu((ticks[0] + ticks[1]) / CLK_TCK, (ticks[2] + ticks[3]) / CLK_TCK)


def proc_mem_mb(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM (peak RSS) in MB, and threads."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024.0
        elif key == "Threads":
            out[key] = int(value)
    return out


def store_bytes(db: Path) -> int:
    """The store's size on disk: the database and its write-ahead log."""
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())


def dist(values: list[float], digits: int = 1) -> dict[str, Optional[float]]:
    return {k: round(percentile(values, q), digits) if values else None
            for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))} | {"n": len(values)}


# ---- the store ----------------------------------------------------------------------------------
@dataclass
class Changes:
    """Each node's allocation changes in order: (time, 'add'|'remove', job). A node moved from one
    job to another is two rows of the same step, in either order: a node counts as allocated while
    any job holds it, judged once every row of a step is applied."""
    by_node: dict[str, list[tuple[float, str, str]]]
    rows: list[tuple[float, str, list[str], list[str]]]

    def _steps(self, node: str) -> Iterator[tuple[float, int]]:
        """(time, jobs holding the node after every change at that time)."""
        holders: set[str] = set()
        items = self.by_node.get(node, [])
        for i, (t, kind, job) in enumerate(items):
            (holders.add if kind == "add" else holders.discard)(job)
            if i + 1 == len(items) or items[i + 1][0] != t:
                yield t, len(holders)

    def first(self, node: str, kind: str, after: float) -> Optional[float]:
        """The first step at or after `after` that put the node in an allocation ('add') or took
        it out of every allocation ('remove')."""
        for t, held in self._steps(node):
            if t >= after - EPS_S and (held > 0) == (kind == "add"):
                return t
        return None

    def held_at(self, node: str, t: float) -> bool:
        """Whether `node` was in some job's allocation at `t`."""
        held = 0
        for at, n in self._steps(node):
            if at > t + EPS_S:
                break
            held = n
        return held > 0


def read_changes(db: Path) -> Changes:
    with sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True) as con:
        rows = [(t, job, json.loads(a or "[]"), json.loads(r or "[]")) for t, job, a, r in
                con.execute("select time, job, added, removed from allocations order by id")]
    by_node: dict[str, list] = defaultdict(list)
    for t, job, added, removed in rows:
        for n in removed:
            by_node[n].append((t, "remove", job))
        for n in added:
            by_node[n].append((t, "add", job))
    return Changes(dict(by_node), rows)


def solve_ms(db: Path, since: float = 0.0) -> list[float]:
    with sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True) as con:
        return [r[0] for r in con.execute("select solve_ms from solver_runs where time >= ? and solve_ms is not null",
                                          (since,))]


def event_count(db: Path, lo: float, hi: float) -> dict[str, int]:
    with sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True) as con:
        return dict(con.execute("select kind, count(*) from events where time >= ? and time < ? group by kind", (lo, hi)))


# ---- latencies ----------------------------------------------------------------------------------
def hello_to_alloc_ms(records: Iterable[PilotRecord], ch: Changes) -> tuple[list[float], int]:
    """Per pilot: its hello -> its node added to a job's allocation while the pilot held it (ms);
    and how many pilots said hello but were never in an allocation while they held the node."""
    out, never = [], 0
    for r in records:
        if r.hello_at is None or r.welcome_at is None:
            continue
        t = ch.first(r.node, "add", r.hello_at)
        end = r.leave_at or r.ended_at or float("inf")
        if t is None or t > end:
            never += 1
        else:
            out.append((t - r.hello_at) * 1000.0)
    return out, never


def leave_to_shrunk_ms(records: Iterable[PilotRecord], ch: Changes) -> list[float]:
    """Per pilot that said leaving while its node was in an allocation: leaving -> the node removed."""
    out = []
    for r in records:
        if r.leave_at is None or not ch.held_at(r.node, r.leave_at):
            continue
        t = ch.first(r.node, "remove", r.leave_at)
        if t is not None:
            out.append((t - r.leave_at) * 1000.0)
    return out


def burst_alloc_s(nodes: set[str], last_hello: float, ch: Changes) -> Optional[float]:
    """The cold start: from the burst's last hello to the first allocation change after which
    every node of the burst is in some job's allocation (None: never)."""
    holders: dict[str, set[str]] = defaultdict(set)
    for i, (t, job, added, removed) in enumerate(ch.rows):
        for n in removed:
            holders[n].discard(job)
        for n in added:
            holders[n].add(job)
        last_of_step = i + 1 == len(ch.rows) or ch.rows[i + 1][0] != t
        if last_of_step and t >= last_hello - EPS_S and all(holders[n] for n in nodes):
            return t - last_hello
    return None


# ---- metrics and the grid ---------------------------------------------------------------------
def metric(m: dict, name: str, **labels: str) -> float:
    return float(m.get((name, tuple(sorted(labels.items()))), 0.0))


class Grid:
    """The cluster page's grid callback (POST /_dash-update-component), as a browser polls it:
    `full()` asks with no key (a new page: the whole figure), `update()` with the key of the
    previous answer (a viewer's once-a-second diff). Each is timed as the HTTP round trip and
    sized as the body received (decoded) and as sent (compressed)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        status, deps = app.get("/_dash-dependencies")
        if status != 200:
            raise RuntimeError(f"/_dash-dependencies answered {status}")
        self.cb = next(c for c in deps if "grid-key.data" in c["output"] and "grid.figure" in c["output"])
        self.key: Optional[dict] = None
        self.n = 0

    def _payload(self, key: Optional[dict]) -> dict:
        cb = self.cb
        outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in cb["output"].strip(".").split("...")]
        self.n += 1
        inputs = [{"id": i["id"], "property": i["property"], "value": self.n} for i in cb["inputs"]]
        state = [{"id": i["id"], "property": i["property"], "value": key if i["id"] == "grid-key" else None}
                 for i in cb["state"]]
        first = cb["inputs"][0]
        return {"output": cb["output"], "outputs": outputs, "inputs": inputs, "state": state,
                "changedPropIds": [f"{first['id']}.{first['property']}"]}

    def ask(self, key: Optional[dict]) -> dict:
        import gzip
        import urllib.request
        body = json.dumps(self._payload(key)).encode()
        req = urllib.request.Request(self.app.url + "/_dash-update-component", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept-Encoding": "gzip"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=60) as r:
            wire = r.read()
            enc = r.headers.get("Content-Encoding") or "identity"
        ms = (time.perf_counter() - t0) * 1000.0
        raw = gzip.decompress(wire) if enc == "gzip" else wire
        if raw:
            self.key = json.loads(raw)["response"]["grid-key"]["data"]
        return {"ms": ms, "kb": len(raw) / 1024.0, "kb_sent": len(wire) / 1024.0, "encoding": enc}

    def full(self) -> dict:
        return self.ask(None)

    def update(self) -> dict:
        return self.ask(self.key)


def grid_summary(samples: list[dict]) -> dict:
    if not samples:
        return {"ms_p50": None, "ms_max": None, "kb_p50": None, "kb_sent_p50": None, "n": 0}
    ms = [s["ms"] for s in samples]
    kb = [s["kb"] for s in samples]
    sent = [s["kb_sent"] for s in samples]
    return {"ms_p50": round(percentile(ms, 0.5), 1), "ms_max": round(max(ms), 1),
            "kb_p50": round(percentile(kb, 0.5), 1), "kb_sent_p50": round(percentile(sent, 0.5), 1), "n": len(ms)}

