"""History for the pages, read from the SQLite store through a read-only connection per thread
(WAL lets these read while the scheduler thread writes; nothing here can change the store)."""
from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: the states a job ends in: the store holds these jobs once the controller lets them go
ENDED = ("done", "failed", "cancelled")
#: how stored jobs sort for each order a list offers (ascending, descending): as app/job_list.py's
#: KEYS sort a job's entry, ties by row; orders where every stored job's entry is alike (nodes
#: now, rate, ETA, curve) keep the rows' order. "state": ended jobs, the latest end first
ORDERS: dict[str, tuple[str, str]] = {
    "": ("rowid", "rowid"),
    "registration": ("rowid", "rowid desc"),
    "id": ("id", "id desc"),
    "name": ("name is null, name, rowid", "name is null, name desc, rowid"),
    "owner": ("owner is null, owner, rowid", "owner is null, owner desc, rowid"),
    "submit_time": ("submit_time, rowid", "submit_time desc, rowid"),
    "progress": ("coalesce(samples_done, 0) / total_samples, rowid",
                 "coalesce(samples_done, 0) / total_samples desc, rowid"),
    "state": ("end_time desc, rowid", "end_time, rowid"),
}


@dataclass(frozen=True)
class StoredFilter:
    """Which stored jobs a list wants: `states`, one `owner` (None: any), lower-case `text` found
    in the id, name or owner, and ids to leave out (those the snapshot lists)."""

    states: tuple[str, ...] = ENDED
    owner: Optional[str] = None
    text: str = ""
    skip: tuple[str, ...] = ()
    #: only jobs that had ended by the snapshot's time: the store runs ahead of the snapshot, and a
    #: job it already holds but the snapshot has not seen would be listed without its live fields
    ended_by: Optional[float] = None

    def sql(self) -> tuple[str, tuple]:
        terms, args = [f"state in ({', '.join('?' * len(self.states))})"], [*self.states]
        if self.owner is not None:
            terms.append("owner = ?")
            args.append(self.owner)
        if self.text:
            terms.append("(instr(lower(id), ?) or instr(lower(coalesce(name, '')), ?) "
                         "or instr(lower(coalesce(owner, '')), ?))")
            args += [self.text] * 3
        if self.skip:
            terms.append("id not in (select value from json_each(?))")   # one argument, however many
            args.append(json.dumps(self.skip))
        if self.ended_by is not None:
            terms.append("end_time <= ?")
            args.append(self.ended_by)
        return "where " + " and ".join(terms), tuple(args)


class History:
    def __init__(self, db: Path) -> None:
        self.db = Path(db)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = vars(self._local).get("conn")
        if conn is None:
            conn = sqlite3.connect(f"file:{self.db.resolve()}?mode=ro", uri=True, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def rows(self, sql: str, args: tuple = ()) -> list[dict]:
        try:
            return [dict(r) for r in self._conn().execute(sql, args)]
        except sqlite3.OperationalError:
            return []     # the store is being created or reset: nothing to show yet

    def timeline(self, after: Optional[float] = None, limit: int = 20000) -> list[dict]:
        if after is None:
            return self.rows("select * from (select * from timeline order by time desc limit ?) "
                             "order by time", (limit,))
        return self.rows("select * from timeline where time > ? order by time limit ?", (after, limit))

    def first_time(self) -> Optional[float]:
        rows = self.rows("select min(time) as t from timeline")
        return rows[0]["t"] if rows else None

    def job_curve_points(self, job: str) -> list[dict]:
        """Measured (simulated: reported) throughput per size, the mean over reports."""
        return self.rows("select nodes, avg(samples_per_second) as samples_per_second, count(*) as n "
                         "from throughput where job = ? and nodes > 0 group by nodes order by nodes",
                         (job,))

    def job_throughput(self, job: str) -> list[dict]:
        return self.rows("select time, nodes, samples_per_second, samples_done from throughput "
                         "where job = ? order by id", (job,))

    def job_allocations(self, job: str) -> list[dict]:
        return self.rows("select time, from_nodes, to_nodes, reason, added, removed from allocations "
                         "where job = ? order by id", (job,))

    def job_events(self, job: str, limit: int = 200) -> list[dict]:
        return self.rows("select time, kind, node, detail from events where job = ? order by id desc "
                         "limit ?", (job, limit))

    def job_events_after(self, job: str, after: int, limit: int) -> list[dict]:
        """The job's events with a sequence number (the store's row id) above `after`, oldest
        first, at most `limit`: the API's page of them."""
        return self.rows("select id as seq, time, kind, node, detail from events where job = ? and id > ? "
                         "order by id limit ?", (job, after, limit))

    def job_row(self, job: str) -> Optional[dict]:
        rows = self.rows("select * from jobs where id = ?", (job,))
        return rows[0] if rows else None

    def count_jobs(self, flt: "StoredFilter") -> int:
        where, args = flt.sql()
        rows = self.rows(f"select count(*) as n from jobs {where}", args)
        return rows[0]["n"] if rows else 0

    def stored_jobs(self, flt: "StoredFilter", order: str, descending: bool, offset: int,
                    limit: int) -> list[dict]:
        """Rows [offset, offset + limit) of the stored jobs `flt` lets through, in `order` (a key
        of ORDERS), each with its `rowid`: the ended jobs the controller no longer holds."""
        where, args = flt.sql()
        by = ORDERS.get(order, ORDERS[""])[descending]
        return self.rows(f"select rowid as rowid, * from jobs {where} order by {by} limit ? offset ?",
                         (*args, limit, offset))

    def rowids(self, ids: list[str]) -> dict[str, int]:
        """The store's row number of each of `ids` it has (its registration order)."""
        rows = self.rows("select id, rowid as rowid from jobs where id in (select value from json_each(?))",
                         (json.dumps(ids),))
        return {r["id"]: r["rowid"] for r in rows}

    def solver_runs(self, limit: int = 25) -> list[dict]:
        return self.rows("select * from solver_runs order by id desc limit ?", (limit,))

    def solve_times(self, limit: int = 20000) -> list[float]:
        return [r["solve_ms"] for r in
                self.rows("select solve_ms from solver_runs order by id desc limit ?", (limit,))]

    def last_decisions(self) -> list[dict]:
        """Allocation changes of the most recent decision time."""
        return self.rows("select time, job, from_nodes, to_nodes, reason, added, removed from allocations "
                         "where time = (select max(time) from allocations) order by id")

    def events_page(self, page: int, size: int, kind: Optional[str] = None) -> tuple[list[dict], int]:
        where, args = ("where kind = ?", (kind,)) if kind else ("", ())
        total = self.rows(f"select count(*) as n from events {where}", args)
        n = total[0]["n"] if total else 0
        rows = self.rows(f"select id, time, kind, node, job, detail from events {where} "
                         f"order by id desc limit ? offset ?", (*args, size, page * size))
        return rows, n

    def meta(self, key: str):
        rows = self.rows("select value from meta where key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else None
