"""A harvester whose store holds jobs with hostile numbers, for the strict-JSON and fuzzing tests.

Job output is parsed to refuse `nan` (issue 57, item 3), so these values are planted where they
cannot be refused: a replay runs and stops, its store is changed with SQLite (which keeps
±Infinity; NaN comes out of Infinity/Infinity as the progress of a job) and the same run is
continued by a second process. What each value reaches: a job list's progress NaN, ±Infinity,
total_samples Infinity, a failure and a training story holding NaN and Infinity, and the usage
report's samples."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.support.server import AppProcess, start_app
from tests.support.waiting import wait

ARGS = ("--racks", "d30,e04", "--start", "2021-02-12T19:30:00Z")
INF = 9e999            # SQLite reads it as Infinity
STORY = '{"losses": [[1, NaN], [2, Infinity]], "metrics": {"loss": NaN}, "loss": -Infinity}'
FAILURE = '{"reason": "exception", "detail": "x", "at": NaN, "tail": ["samples=nan"]}'


def plant(db: Path) -> dict[str, str]:
    """Three of the stored jobs made hostile: {"nan", "inf", "minus_inf"} -> job id."""
    conn = sqlite3.connect(db)
    try:
        first = [r[0] for r in conn.execute("select id from jobs order by rowid limit 3")]
        assert len(first) == 3, "the replay registered no jobs before it stopped"
        nan, inf, minus = first
        conn.execute("update jobs set state = 'cancelled', end_time = submit_time, samples_done = ?, "
                     "total_samples = ?, story = ? where id = ?", (INF, INF, STORY, nan))
        conn.execute("update jobs set samples_done = ?, samples_per_second = ? where id = ?", (INF, INF, inf))
        conn.execute("update jobs set state = 'failed', end_time = submit_time, samples_done = ?, failure = ? "
                     "where id = ?", (-INF, FAILURE, minus))
        conn.commit()
    finally:
        conn.close()
    return {"nan": nan, "inf": inf, "minus_inf": minus}


def hostile_app(workdir: Path, *extra: str) -> tuple[AppProcess, dict[str, str]]:
    """A replay continued on a store with hostile jobs planted: (the server, the planted ids)."""
    first = start_app(workdir, "--fresh", *ARGS, *extra)
    wait(lambda: first.get("/api/jobs?limit=3")[1].get("count", 0) >= 3, 30, "three jobs in the replay")
    assert first.stop() == 0, first.output()[-3000:]
    planted = plant(first.db)
    return start_app(workdir, *ARGS, *extra), planted


def strict_loads(text: str):
    """`json.loads` as a browser's JSON.parse: a bare NaN or Infinity raises ValueError."""
    def refuse(word: str):
        raise ValueError(f"a bare {word}, which JSON.parse refuses")
    return json.loads(text, parse_constant=refuse)
