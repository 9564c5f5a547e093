"""SQLite store (WAL, through sqlite-utils): the source of truth a restarted process resumes from.

State tables (`jobs`, `nodes`, `meta`) always describe one consistent moment; history tables
(`events`, `allocations`, `throughput`, `solver_runs`) are appended in the same transaction,
so a crash loses at most the changes since the last flush, never half of one.

A store that cannot be used at start (damaged, not a database, unreadable, read-only) is a
StoreError naming the file; a write that fails later (disk full, locked past the busy timeout)
is a StoreWriteError, and the caller keeps the batch to write again.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import sqlite_utils

from .errors import StoreError
from .model import (DEFAULT_PROGRESS_PATTERN, LAUNCHER_RUNTIME, Curve, Event, Job, JobState, PauseSample,
                    RateSample)

SCHEMA: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "jobs": ({
        "id": str, "name": str, "owner": str, "state": str, "min_nodes": int, "max_nodes": int,
        "total_samples": float, "samples_done": float, "scale_up_seconds": float,
        "scale_down_seconds": float, "priority": float, "curve": str, "true_curve": str,
        "submit_time": float, "start_time": float, "end_time": float, "nodes": str,
        "nodes_now": int, "samples_per_second": float, "command": str, "global_batch": int,
        "given_curve": str, "launcher": str, "progress_pattern": str, "stop_grace_seconds": float,
        "run_as": str, "failure": str, "story": str, "samples_per_step": float,
        "resubmitted_from": str, "requeues": int,
    }, {"pk": "id"}),
    "nodes": ({"name": str, "state": str, "since": float, "job": str, "idle_since": float}, {"pk": "name"}),
    "events": ({"id": int, "time": float, "kind": str, "node": str, "job": str, "detail": str},
               {"pk": "id"}),
    "allocations": ({"id": int, "time": float, "job": str, "from_nodes": int, "to_nodes": int,
                     "added": str, "removed": str, "reason": str}, {"pk": "id"}),
    "throughput": ({"id": int, "time": float, "job": str, "nodes": int,
                    "samples_per_second": float, "samples_done": float, "source": str}, {"pk": "id"}),
    "timeline": ({"time": float, "idle": int, "used": int, "running": int, "queued": int,
                  "samples_per_second": float}, {"pk": "time"}),
    "samples": ({"id": int, "time": float, "job": str, "kind": str, "nodes": int, "value": float,
                 "seconds": float},
                {"pk": "id"}),
    "solver_runs": ({"id": int, "time": float, "policy": str, "solver": str, "status": str,
                     "objective": float, "jobs": int, "nodes": int, "solve_ms": float},
                    {"pk": "id"}),
    "meta": ({"key": str, "value": str}, {"pk": "key"}),
}
INDEXES = [("events", ["time"]), ("events", ["job"]), ("allocations", ["job"]), ("jobs", ["submit_time"]),
           ("jobs", ["end_time"]),     # the Jobs page's default order of ended jobs (app/job_list.py)
           ("allocations", ["time"]), ("throughput", ["job"]), ("solver_runs", ["time"]),
           ("samples", ["job"])]
HISTORY = ("events", "allocations", "throughput", "solver_runs", "samples")
#: seconds a write waits for another connection's lock before it fails
BUSY_TIMEOUT_S = 5.0


def read_only(path: Path, **options: Any) -> sqlite3.Connection:
    """A connection that cannot write the store: for readers beside its one writer."""
    return sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, **options)


class StoreWriteError(RuntimeError):
    """A write to the store failed; nothing of it was stored (the transaction rolled back)."""


@dataclass
class Batch:
    """Everything one flush writes, in one transaction."""

    jobs: dict[str, dict] = field(default_factory=dict)      # latest row per job
    nodes: dict[str, dict] = field(default_factory=dict)     # latest row per node
    events: list[dict] = field(default_factory=list)
    allocations: list[dict] = field(default_factory=list)
    throughput: list[dict] = field(default_factory=list)
    solver_runs: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def merge(self, newer: "Batch") -> "Batch":
        """This batch followed by `newer` (its rows win), as one: what a retried flush writes."""
        self.jobs.update(newer.jobs)
        self.nodes.update(newer.nodes)
        self.meta.update(newer.meta)
        for name in (*HISTORY, "timeline"):
            getattr(self, name).extend(getattr(newer, name))
        return self

    @property
    def rows(self) -> int:
        return sum(len(getattr(self, name)) for name in (*HISTORY, "timeline", "jobs", "nodes", "meta"))

    def __bool__(self) -> bool:
        return any((self.jobs, self.nodes, self.events, self.allocations, self.throughput,
                    self.solver_runs, self.timeline, self.samples, self.meta))

    # ---- rows in the store's shape, so the controller only says what happened ---------------
    def node(self, name: str, idle: bool, since: Optional[float], job: Optional[str] = None,
             idle_since: Optional[float] = None) -> None:
        """`since`: the last change of state or holder (the dashboard's); `idle_since`: when an
        idle node's idle fragment began (the horizon learner's age; `since` when not given)."""
        self.nodes[name] = {"name": name, "state": "idle" if idle else "busy", "since": since, "job": job,
                            "idle_since": (idle_since if idle_since is not None else since) if idle else None}

    def event(self, ev: Event) -> None:
        self.events.append({"time": ev.time, "kind": ev.kind.value, "node": ev.node, "job": ev.job,
                            "detail": ev.detail})

    def sample(self, smp: RateSample | PauseSample) -> None:
        if isinstance(smp, RateSample):
            self.samples.append({"time": smp.time, "job": smp.job, "kind": "rate", "nodes": smp.nodes,
                                 "value": smp.rate, "seconds": smp.seconds})
        else:
            self.samples.append({"time": smp.time, "job": smp.job, "kind": smp.kind, "nodes": None,
                                 "value": smp.seconds, "seconds": None})

    def solver_run(self, now: float, plan: Any, jobs: int, nodes: int) -> None:
        self.solver_runs.append({"time": now, "policy": plan.policy, "solver": plan.solver,
                                 "status": plan.status, "objective": plan.objective, "jobs": jobs,
                                 "nodes": nodes, "solve_ms": plan.solve_ms})

    def change(self, now: float, job: Job, before: Sequence[str], after: Sequence[str], reason: str,
               rate: float, done: Optional[float], source: str) -> None:
        """A job's node set changed: the allocation, a throughput point (while it runs), its row."""
        b, a = set(before), set(after)
        self.allocations.append({
            "time": now, "job": job.id, "from_nodes": len(before), "to_nodes": len(after),
            "added": json.dumps([n for n in after if n not in b]),
            "removed": json.dumps([n for n in before if n not in a]), "reason": reason})
        if done is not None:
            self.throughput.append({"time": now, "job": job.id, "nodes": len(after), "samples_per_second": rate,
                                    "source": source, "samples_done": done})
        self.jobs[job.id] = job_row(job, after, rate)

    def timeline_point(self, now: float, idle: int, used: int, running: int, queued: int, rate: float) -> None:
        self.timeline.append({"time": now, "idle": idle, "used": used, "running": running, "queued": queued,
                              "samples_per_second": rate})


def job_row(job: Job, nodes: Iterable[str] = (), rate: float = 0.0) -> dict:
    nodes = list(nodes)
    return {
        "id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value,
        "min_nodes": job.min_nodes, "max_nodes": job.max_nodes,
        "total_samples": job.total_samples, "samples_done": job.samples_done,
        "scale_up_seconds": job.scale_up_seconds, "scale_down_seconds": job.scale_down_seconds,
        "priority": job.priority, "curve": json.dumps(job.curve.to_dict()),
        "true_curve": json.dumps(job.true_curve.to_dict()) if job.true_curve else None,
        "submit_time": job.submit_time, "start_time": job.start_time, "end_time": job.end_time,
        "nodes": json.dumps(nodes), "nodes_now": len(nodes), "samples_per_second": rate,
        "command": json.dumps(list(job.command)) if job.command else None,
        "global_batch": job.global_batch or None,
        "given_curve": json.dumps(job.given_curve.to_dict()) if job.given_curve else None,
        "launcher": job.launcher, "progress_pattern": job.progress_pattern,
        "stop_grace_seconds": job.stop_grace_seconds, "run_as": job.run_as or None,
        "samples_per_step": job.samples_per_step or None,
        "failure": json.dumps(job.failure) if job.failure else None,
        "story": json.dumps(job.story) if job.story else None,
        "resubmitted_from": job.resubmitted_from or None, "requeues": job.requeues or None,
    }


def job_from_row(row: dict) -> tuple[Job, list[str]]:
    job = Job(
        id=row["id"], min_nodes=row["min_nodes"], max_nodes=row["max_nodes"],
        total_samples=row["total_samples"], curve=Curve.from_dict(json.loads(row["curve"])),
        scale_up_seconds=row["scale_up_seconds"], scale_down_seconds=row["scale_down_seconds"],
        priority=row["priority"], submit_time=row["submit_time"], name=row["name"] or "",
        owner=row["owner"] or "", state=JobState(row["state"]), samples_done=row["samples_done"],
        start_time=row["start_time"], end_time=row["end_time"],
        true_curve=Curve.from_dict(json.loads(row["true_curve"])) if row["true_curve"] else None,
        command=tuple(json.loads(row["command"])) if row.get("command") else (),
        global_batch=row.get("global_batch") or 0,
        given_curve=Curve.from_dict(json.loads(row["given_curve"])) if row.get("given_curve") else None,
        launcher=row.get("launcher") or LAUNCHER_RUNTIME,
        progress_pattern=row.get("progress_pattern") or DEFAULT_PROGRESS_PATTERN,
        stop_grace_seconds=row["stop_grace_seconds"] if row.get("stop_grace_seconds") is not None else 30.0,
        run_as=row.get("run_as") or "", samples_per_step=row.get("samples_per_step") or 0.0, failure=_json_dict(row.get("failure")), story=_json_dict(row.get("story")),
        resubmitted_from=row.get("resubmitted_from") or "", requeues=row.get("requeues") or 0)
    return job, json.loads(row["nodes"] or "[]")


def _json_dict(text: Optional[str]) -> Optional[dict]:
    """A JSON object column (a job's failure, its story); None when empty or not an object."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _why(e: sqlite3.Error) -> str:
    """What to do about a store that cannot be opened, from SQLite's error."""
    text = str(e)
    if "readonly" in text:
        return f"the store is read-only ({text}): make the file and its folder writable, or give another --db"
    if "malformed" in text or "not a database" in text or isinstance(e, sqlite3.DatabaseError) and \
            not isinstance(e, sqlite3.OperationalError):
        return (f"the store is damaged ({text}): move the file (and its -wal and -shm files) aside and "
                "start a new run, or restore a backup")
    if "locked" in text or "busy" in text:
        return f"the store is locked by another program ({text}): stop it, or give another --db"
    return f"cannot use the store ({text}): check that the file and its folder exist and are readable and " \
           "writable by this user, or give another --db"


def keep_private(db: str) -> None:
    """Make the store and its -wal and -shm files readable by this Unix user only (0600), an old
    store's too: jobs may run as other accounts on this host (SQLite gives -wal and -shm the
    store's mode). A file this user does not own is left as it is (opening it says what fails)."""
    try:
        os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError:
        return
    for path in (db, db + "-wal", db + "-shm"):
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass


def refuse_foreign(path: str | Path, fresh: bool) -> None:
    """Before a harvester opens `path`: StoreError when the file is there but is no harvester's
    store. An empty file (truncated) would otherwise start a new run in silence, with every job
    of the old one gone; another program's SQLite file would get our tables."""
    p = Path(path)
    if str(path) == ":memory:" or not p.is_file():
        return
    wal = Path(f"{p}-wal")
    if p.stat().st_size == 0 and not (wal.is_file() and wal.stat().st_size > 0):
        if not fresh:
            raise StoreError(str(p), "is empty (0 bytes), not a harvester's store: restore it from a backup, "
                                     "or give --fresh to start a new run in it")
        return
    try:
        with closing(read_only(p)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return              # damage: the store's own check says what it is
    if tables and "meta" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StoreError(str(p), f"is an SQLite file of another program (tables {shown}), not a harvester's "
                                 "store: give another --db")


class Store:
    def __init__(self, path: str | Path = ":memory:", busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        """Open (or create) the store and check it: StoreError if it cannot be used."""
        self.path = str(path)
        conn: Optional[sqlite3.Connection] = None
        if self.path != ":memory:":
            keep_private(self.path)
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=busy_timeout_s)
            self.db = sqlite_utils.Database(conn)
            self.lock = threading.RLock()
            if self.path != ":memory:":
                self.db.enable_wal()
                self._check()
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema()
        except sqlite3.Error as e:
            if conn is not None:
                conn.close()
            raise StoreError(self.path, _why(e)) from None

    def _check(self) -> None:
        """`PRAGMA quick_check` (damage SQLite can see without reading every index entry), then a
        write that is rolled back (a read-only file opens and reads fine)."""
        problems = [r[0] for r in self.db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            said = " ".join(" ".join(problems).replace("*", "").split())   # one line, however SQLite wraps it
            raise sqlite3.DatabaseError(f"malformed: {said[:160]}")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            self.db.execute(f"PRAGMA user_version = {int(version)}")
        finally:
            self.db.execute("ROLLBACK")

    def _ensure_schema(self) -> None:
        with self.lock:
            for name, (columns, opts) in SCHEMA.items():
                table = self.db[name]
                if not table.exists():
                    table.create(columns, **opts)
                else:
                    for col, typ in columns.items():
                        if col not in table.columns_dict:
                            table.add_column(col, typ)
            for table, cols in INDEXES:
                self.db[table].create_index(cols, if_not_exists=True)

    @property
    def journal_mode(self) -> str:
        return self.db.execute("PRAGMA journal_mode").fetchone()[0]

    def is_empty(self) -> bool:
        return self.db["jobs"].count == 0 and self.db["meta"].count == 0 and self.db["events"].count == 0

    def write(self, batch: Batch) -> None:
        """Write the batch in one transaction; StoreWriteError (nothing written) if it fails."""
        if not batch:
            return
        try:
            self._write(batch)
        except sqlite3.Error as e:
            raise StoreWriteError(f"{self.path}: {e}") from e

    def _write(self, batch: Batch) -> None:
        with self.lock, self.db.atomic():
            if batch.jobs:
                self.db["jobs"].upsert_all(batch.jobs.values(), pk="id")
            if batch.nodes:
                self.db["nodes"].upsert_all(batch.nodes.values(), pk="name")
            for table in HISTORY:
                rows = getattr(batch, table)
                if rows:
                    self.db[table].insert_all(rows, batch_size=1000)
            if batch.timeline:
                self.db["timeline"].upsert_all(batch.timeline, pk="time")
            if batch.meta:
                self.db["meta"].upsert_all(
                    ({"key": k, "value": json.dumps(v)} for k, v in batch.meta.items()), pk="key")

    def meta(self, key: str, default: Any = None) -> Any:
        rows = list(self.db["meta"].rows_where("key = ?", [key]))
        try:
            return json.loads(rows[0]["value"]) if rows else default
        except ValueError as e:
            raise self._damaged("meta", f"key {key!r}", e) from None

    def jobs(self, where: Optional[str] = None, args: Iterable = ()) -> list[tuple[Job, list[str]]]:
        out = []
        for r in self.db["jobs"].rows_where(where, list(args), order_by="rowid"):
            try:
                out.append(job_from_row(r))
            except (ValueError, TypeError, KeyError) as e:
                raise self._damaged("jobs", f"job {r.get('id')!r}", e) from None
        return out

    def _damaged(self, table: str, row: str, e: Exception) -> StoreError:
        """A record that no longer reads (a byte changed on disk): the file, the table, the row."""
        return StoreError(self.path, f"damaged record in table {table}, {row} ({type(e).__name__}: {e}): restore the "
                                     "store from a backup, or give --fresh to start a new run")

    def idle_nodes(self) -> dict[str, float]:
        """Idle node -> when its idle fragment began (`since` in stores written before idle_since)."""
        return {name: t for name, t in self.db.execute(
            "select name, coalesce(idle_since, since) from nodes where state = 'idle' order by rowid")}

    def node_holders(self) -> list[tuple[str, float, Optional[str]]]:
        """(name, since, job) of every node, for a restart."""
        return [tuple(r) for r in self.db.execute("select name, since, job from nodes")]

    def samples(self) -> list[tuple]:
        """The profiler's measurements in the order taken: (time, job, kind, nodes, value, seconds)."""
        return [tuple(r) for r in self.db.execute(
            "select time, job, kind, nodes, value, seconds from samples order by id")]

    def solve_times(self, limit: int = -1) -> list[float]:
        """Recorded solve times in ms, oldest first: the last `limit` (-1: all)."""
        rows = self.db.execute("select solve_ms from (select id, solve_ms from solver_runs order by id desc "
                               "limit ?) order by id", (limit,))
        return [r[0] for r in rows]

    def solve_totals(self, bounds_ms: Sequence[float]) -> tuple[int, float, float, list[int]]:
        """Count, sum and max (ms) of every recorded solve, and how many took at most each bound."""
        cols = "".join(f", sum(solve_ms <= {float(b)!r})" for b in bounds_ms)
        row = self.db.execute(f"select count(*), coalesce(sum(solve_ms), 0), coalesce(max(solve_ms), 0){cols} "
                              "from solver_runs").fetchone()
        return row[0], row[1], row[2], [int(x or 0) for x in row[3:]]

    def owned_changes(self) -> list[tuple[float, str, list[str], list[str]]]:
        """(time, job, added, removed) of every allocation change of a job with an owner, in the
        order made: what an owner's period quotas count from after a restart (core.quotas)."""
        rows = self.db.execute("select time, job, added, removed from allocations where job in "
                               "(select id from jobs where coalesce(owner, '') != '') order by id").fetchall()
        return [(t, job, json.loads(a or "[]"), json.loads(r or "[]")) for t, job, a, r in rows]

    def last_timeline_time(self) -> Optional[float]:
        return self.db.execute("select max(time) from timeline").fetchone()[0]

    def count(self, table: str, where: Optional[str] = None, args: Iterable = ()) -> int:
        sql = f"select count(*) from [{table}]" + (f" where {where}" if where else "")
        return self.db.execute(sql, list(args)).fetchone()[0]

    def reset(self) -> None:
        """Forget the run this store holds (a new replay scenario), in one transaction."""
        with self.lock, self.db.atomic():
            for name in SCHEMA:
                self.db.execute(f"delete from [{name}]")

    def close(self) -> None:
        self.db.conn.close()


class UsageHistory:
    """The history usage is computed from (core/usage.py), through a read-only connection of its
    own (reports never hold up the writer's flushes), read in one transaction: every table as of
    the same flush."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._conn: Optional[sqlite3.Connection] = None
        self.lock = threading.Lock()

    def read(self) -> Optional[dict]:
        """{"changes": [(time, job, added, removed)] in the order made, "progress": [(time, job,
        samples_done, samples/s)], "jobs": [(id, name, owner, samples_done, end_time)], "timeline": [(time,
        idle)] in time order, "until": the clock at the last flush}; None while the store is being
        created or reset."""
        with self.lock:
            try:
                if self._conn is None:
                    self._conn = read_only(self.path, check_same_thread=False, isolation_level=None)
                conn = self._conn
                conn.execute("BEGIN")
                try:
                    changes = conn.execute("select time, job, added, removed from allocations order by id").fetchall()
                    progress = conn.execute("select time, job, samples_done, coalesce(samples_per_second, 0) "
                                            "from throughput "
                                            "where samples_done is not null order by id").fetchall()
                    jobs = conn.execute("select id, coalesce(name, ''), coalesce(owner, ''), "
                                        "coalesce(samples_done, 0), end_time from jobs order by rowid").fetchall()
                    timeline = conn.execute("select time, idle from timeline order by time").fetchall()
                    clock = conn.execute("select value from meta where key = 'clock'").fetchone()
                finally:
                    conn.execute("COMMIT")
            except sqlite3.OperationalError:
                return None
        try:
            until = float(json.loads(clock[0])) if clock else None
        except (ValueError, TypeError):
            until = None
        return {"changes": [(t, job, json.loads(a or "[]"), json.loads(r or "[]")) for t, job, a, r in changes],
                "progress": progress, "jobs": jobs, "timeline": timeline, "until": until}

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
