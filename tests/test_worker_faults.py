"""Workers that hang or keep crashing, and the harvester's own restarts (issue 17, item 5): a
SIGSTOPped worker's node leaves its job within the heartbeat timeout and is offered again;
only losses within the crash window count; every start's worker logs are kept; the event log
records the harvester's start, a crash found at restart, and the restart. Real worker processes
(local transport), a real store, and for the crash a real server killed with SIGKILL."""
from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time

from core.assemble import build
from core.crashes import note_loss
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.files import ROOT
from tests.support.procs import leftovers
from tests.support.server import start_app
from tests.support.waiting import wait

HEARTBEAT_S = 5.0


def test_only_losses_within_the_window_count():
    times: list[float] = []
    assert [note_loss(times, t, 10.0) for t in (0, 4, 8)] == [1, 2, 3]
    times = []
    assert [note_loss(times, t, 10.0) for t in (0, 11, 22, 33)] == [1, 1, 1, 1] and times == [33]


def _settings(db, nodes: int, **workers) -> HarvesterSettings:
    return HarvesterSettings.parse({"db": db, "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": nodes, "profiler": False, "config": {"tfwd": 60}, "trust_user_commands": True,
        "workers": {"rejoin_after_s": 1.0, **workers}}})


def _events(h, job_id=None) -> list[tuple[str, str, str]]:
    h.controller.flush()
    rows = h.controller.store.db.execute(
        "select kind, coalesce(node, ''), coalesce(detail, '') from events" +
        (" where job = ?" if job_id else "") + " order by id", (job_id,) if job_id else ())
    return [tuple(r) for r in rows]


def test_a_stopped_worker_loses_its_node_within_the_heartbeat_timeout_and_logs_survive_a_restart(tmp_path):
    db = tmp_path / "live.db"
    h = build(_settings(db, 2, heartbeat_timeout_s=HEARTBEAT_S))
    h.open()
    try:
        names = h.source.node_names()
        job = h.submit(JobSpec(name="digits", min_nodes=1, max_nodes=2, total_samples=64 * 10 ** 6,
                               curve="1:100, 2:200", scale_up_seconds=0, scale_down_seconds=0, global_batch=64,
                               command=[sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--seed", "1",
                                        "--log-every", "1000000", "--step-seconds", "0.05"]), "alice")
        d = h.dispatcher
        st = lambda: d.status(job.id) or {}
        wait(lambda: st().get("world_size") == 2 and not st().get("regrouping") and st().get("loss"), 120,
             "the job training on 2 nodes", st)
        victim = d._runs[job.id].handles[names[1]]
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait(lambda: h.controller.owner.get(names[1]) is None, HEARTBEAT_S + 4, "the stopped worker's node freed",
             lambda: (st().get("lost"), h.controller.owner))
        freed_s = time.monotonic() - t0
        assert freed_s <= HEARTBEAT_S + 2, freed_s   # the timeout, then one liveness check
        wait(lambda: not os.path.exists(f"/proc/{victim.pid}") or
             open(f"/proc/{victim.pid}/stat").read().split()[2] == "Z", 10, "the stopped worker killed")
        leave = [e for e in _events(h, job.id) if e[0] == "node_leave" and e[1] == names[1]]
        assert leave and f"no heartbeat from {names[1]} for 5 s" in leave[-1][2], _events(h, job.id)
        back = lambda: [e for e in _events(h) if e[0] == "node_join" and e[1] == names[1]
                        and e[2].startswith("back: a check passed")]
        wait(back, 10, "the node offered again once a check of it passed (a silent node is held out)")
        assert "no heartbeat" in back()[-1][2], back()
        wait(lambda: st().get("world_size") == 2 and not st().get("regrouping"), 120, "back on 2 nodes", st)
        assert h.snapshot.job(job.id)["state"] == "running"
    finally:
        h.close()

    h = build(_settings(db, 2, heartbeat_timeout_s=HEARTBEAT_S))    # the same store: a restart
    h.open()
    try:
        wait(lambda: (h.dispatcher.status(job.id) or {}).get("loss"), 120, "training again after the restart")
        logs = sorted(p.name for p in (db.parent / "live.db.workers" / job.id).glob("*.log"))
        assert any("-s1-" in n for n in logs) and any("-s2-" in n for n in logs), logs
        kinds = [e[0] for e in _events(h, job.id)]
        assert "harvester_restart" in kinds and "harvester_crash" not in kinds, "a clean stop is no crash"
    finally:
        h.close()
    wait(lambda: not leftovers(job.id), 15, "every worker process gone")


def test_three_losses_spread_over_more_than_the_window_do_not_fail_a_job(tmp_path):
    """A restart-based job (torchrun launcher, a trivial rank) loses its only rank three times,
    each loss further than the 3 s window from the one before: it keeps running."""
    h = build(_settings(tmp_path / "live.db", 1, crash_window_s=3.0, max_crashes=3))
    h.open()
    rank = "import itertools, time\nfor i in itertools.count():\n    print(f'samples={i}', flush=True)\n    time.sleep(0.1)"
    try:
        job = h.submit(JobSpec(name="flaky", launcher="torchrun", min_nodes=1, max_nodes=1, total_samples=1e9,
                               curve="1:10", command=[sys.executable, "-c", rank]), "alice")
        d = h.dispatcher
        handle = lambda: (lambda r: next(iter(r.gen.handles.values()), None) if r and r.gen else None)(
            d.restarts.runs.get(job.id))
        for k in range(3):
            first = wait(handle, 60, f"rank {k} running")
            time.sleep(0.5)
            d.transport.kill(first)
            wait(lambda: (lambda x: x is not None and x is not first)(handle()), 30, f"rank {k + 1} started")
            if k < 2:
                time.sleep(3.2)
        lost = [e for e in _events(h, job.id) if e[0] == "node_leave"]
        assert len(lost) == 3, lost
        assert h.snapshot.job(job.id)["state"] == "running", _events(h, job.id)
    finally:
        h.close()


def test_the_event_log_records_start_crash_and_restart(tmp_path):
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1")
    token = app.token("alice")
    status, job = app.request("POST", "/api/jobs", {"name": "j", "min_nodes": 1, "max_nodes": 2,
                                                    "total_samples": 1e12, "curve": "1:10, 2:19"}, token=token)
    assert status == 201
    time.sleep(1.5)                                   # a flush
    app.stop(signal.SIGKILL)
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1", db=app.db)
    try:
        wait(lambda: "harvester_restart" in _kinds(app.db), 10, "the restart in the log")
    finally:
        app.stop()
    assert app.proc.returncode == 0
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1", db=app.db)
    app.stop()
    with sqlite3.connect(app.db) as c:
        rows = c.execute("select kind, job from events where kind like 'harvester_%' order by id").fetchall()
    assert rows == [("harvester_start", None), ("harvester_crash", None), ("harvester_crash", job["id"]),
                    ("harvester_restart", None), ("harvester_restart", job["id"]),
                    ("harvester_restart", None), ("harvester_restart", job["id"])], rows


def _kinds(db) -> list[str]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("select kind from events")]
