"""The crash scenario with a real kill: `python -m app` replaying the full Summit machine at
600x is killed with SIGKILL while jobs run, and a second process on the same store (without
--fresh) continues the run: the job a person registered, the progress of every job, the history
and the simulated clock all survive, losing at most what the last ~1 s flush had not written."""
from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

from tests.support.server import start_app
from tests.support.waiting import wait

SPEED = 600
#: the store is flushed every ~1 s wall from the replay loop, whose tick is 0.5 s: a kill loses
#: at most this many wall seconds of replay
FLUSH_SLACK_S = 3.0


def read_store(db: Path) -> dict:
    """What the store holds, read-only (so the reader can never repair or change it)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        jobs = {r[0]: {"owner": r[1], "name": r[2], "state": r[3], "samples_done": r[4]}
                for r in conn.execute("select id, owner, name, state, samples_done from jobs")}
        meta = {k: json.loads(v) for k, v in conn.execute("select key, value from meta")}
        timeline, t_first = conn.execute("select count(*), min(time) from timeline").fetchone()
        return {"jobs": jobs, "meta": meta, "timeline": timeline, "t_first": t_first}
    finally:
        conn.close()


def test_sigkill_then_restart_continues_the_run(tmp_path):
    app = start_app(tmp_path, "--fresh", "--speed", str(SPEED))
    users = tmp_path / "users.json"
    try:
        def progressing():
            status, body = app.get("/api/jobs?state=running")
            assert status == 200, body
            jobs = [j for j in body["jobs"] if j["samples_done"] > 0]
            return jobs if len(jobs) >= 3 else None
        wait(progressing, 25, "three running jobs with progress", period=0.25)

        status, mine = app.request("POST", "/api/jobs", {
            "name": "alice-crash-test", "min_nodes": 1, "max_nodes": 64, "total_samples": 1e12,
            "curve": "1:100000, 64:6400000"}, token=app.token("alice"))
        assert status == 201, mine
        time.sleep(2)

        live = {j["id"]: j for j in app.get("/api/jobs")[1]["jobs"]}
        t_before = app.get("/api/health")[1]["time"]        # at or after the jobs' snapshot
        timeline_live = read_store(app.db)["timeline"]
        assert mine["id"] in live
    finally:
        rc = app.stop(signal.SIGKILL)
    assert rc == -signal.SIGKILL, f"the app was not killed but exited with {rc}"
    assert "state saved" not in app.output()           # no clean shutdown happened

    # what the killed process left in the store
    saved = read_store(app.db)
    cursor = saved["meta"]["replay_cursor"]
    assert mine["id"] in saved["jobs"], "the registered job was not durable"
    assert saved["jobs"][mine["id"]]["owner"] == "alice"
    assert cursor >= t_before - FLUSH_SLACK_S * SPEED, \
        f"the store's cursor is {(t_before - cursor) / SPEED:.1f} wall s behind the live replay"
    assert saved["timeline"] >= timeline_live > 0
    progressed = {jid: j["samples_done"] for jid, j in saved["jobs"].items() if (j["samples_done"] or 0) > 0}
    assert len(progressed) >= 3, saved["jobs"]

    # the same store, without --fresh
    again = start_app(tmp_path, db=app.db, users=users)
    try:
        h = again.get("/api/health")[1]
        assert h["nodes"] == 4734
        assert h["time"] >= cursor, f"restarted at {h['time']}, before the stored cursor {cursor}"
        assert h["time"] < cursor + 60 * SPEED, "the restarted replay jumped far ahead"
        status, cluster = again.get("/api/cluster?nodes=0")
        assert cluster["speed"] == SPEED, "the run's speed was not kept"

        status, job = again.get(f"/api/jobs/{mine['id']}")
        assert status == 200, job
        assert (job["owner"], job["name"]) == ("alice", "alice-crash-test")
        assert job["state"] in ("queued", "running"), job

        after = {j["id"]: j for j in again.get("/api/jobs")[1]["jobs"]}
        for jid, done in progressed.items():
            assert jid in after, f"job {jid} is gone after the restart"
            assert after[jid]["samples_done"] >= done * (1 - 1e-9), \
                f"{jid}: {after[jid]['samples_done']:,.0f} samples after the restart, {done:,.0f} in the store"
        # against what the killed process reported live: a job loses at most what it could
        # have done at its top rate between the store's cursor and the kill
        for jid, j in live.items():
            if j["samples_done"] > 0 and jid in after:
                lost = j["samples_done"] - after[jid]["samples_done"]
                top = max(again.get(f"/api/jobs/{jid}")[1]["curve"]["samples_per_second"])
                behind = max(0.0, t_before - cursor)      # the last flush may postdate t_before
                budget = top * behind * 1.001 + 1
                assert lost <= budget, (f"{jid} lost {lost:,.0f} samples, more than its top rate can do in the "
                                        f"{behind:.0f} simulated s the store was behind")

        # the clock keeps moving, and jobs that arrived after the last flush come back
        t1 = again.get("/api/health")[1]["time"]
        wait(lambda: again.get("/api/health")[1]["time"] > max(t1, t_before) + 60, 15,
             "the simulated clock to pass the pre-kill time", period=0.25)
        ids = {j["id"] for j in again.get("/api/jobs")[1]["jobs"]}
        missing = set(live) - ids
        assert not missing, f"jobs known before the kill are missing after the restart: {sorted(missing)}"

        now = read_store(again.db)
        assert now["timeline"] >= saved["timeline"], "timeline history was lost"
        assert now["t_first"] == saved["t_first"], "the timeline history was restarted"
        assert now["meta"]["replay_cursor"] >= cursor
    finally:
        rc = again.stop(signal.SIGTERM)
    assert rc == 0, again.output()[-3000:]
    assert "state saved" in again.output()
