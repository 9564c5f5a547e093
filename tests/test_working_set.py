"""Costs bounded by what is live (issue 57, item 5, the controller's side): ended jobs leave the
controller's working set (the store keeps them), each step walks the live jobs only, and the
API still lists every job, a page at a time, and shows and resubmits an ended one that memory
no longer holds. Real controller on a real SQLite file; the API test runs the real server."""
from __future__ import annotations

import gc
import weakref

from core.controller_config import ControllerConfig
from core.job_book import ENDED_KEPT
from core.model import JobState
from core.store import Store
from tests.support.server import start_app
from tests.support.sim import T0, controller, job

NODES = [f"n{i}" for i in range(4)]
MANY = 500


def test_ended_jobs_leave_the_working_set_and_each_step_walks_the_live_ones(tmp_path):
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=2, tfwd=1000), store)
    seen: list[set[str]] = []
    review = ctl.quota.review

    def recording(owners, now):
        owners = list(owners)
        seen.append(set(owners))
        return review(owners, now)

    ctl.quota.review = recording
    for k in range(3):
        live = job(f"L{k}", total=1e12, submit=T0 + k)
        live.owner = f"live{k}"
        ctl.submit(live)
    ended = []
    for k in range(MANY):           # register, and cancel before or after a step took the job in
        j = job(f"C{k}", submit=T0 + 10 + k)
        j.owner = f"gone{k}"
        ended.append(weakref.ref(j))
        ctl.submit(j)
        if k % 2:
            clock.advance_to(T0 + 10 + k)
            ctl.step()
        ctl.cancel(j.id)
        del j
        if k % 50 == 49:
            ctl.step()
            ctl.flush()
    clock.advance_to(T0 + 1000)
    ctl.step(force=True)
    ctl.flush()

    gc.collect()
    alive = sum(1 for r in ended if r() is not None)
    assert alive <= ENDED_KEPT, f"{alive} ended jobs still in memory"
    assert seen[-1] == {"live0", "live1", "live2"}, "quota.review sees the live jobs' owners only"
    assert all(len(s) <= 4 for s in seen), "at most the live jobs and the one just taken in"
    assert set(ctl.jobs.live) == {"L0", "L1", "L2"} and len(ctl.jobs.ended) == ENDED_KEPT
    snap = ctl.snapshot("running", 0)
    assert len(snap.jobs) == 3 + ENDED_KEPT
    assert snap.kpis["cancelled"] == MANY and snap.kpis["running"] + snap.kpis["queued"] == 3
    first = ctl.job("C0")                                # long out of memory: read from the store
    assert first is not None and first.state is JobState.CANCELLED and first.owner == "gone0"
    assert len(ctl.jobs) == MANY + 3 and sum(1 for _ in ctl.jobs.values()) == MANY + 3


def test_the_api_lists_shows_and_resubmits_jobs_that_left_memory(tmp_path):
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.2")
    try:
        token = app.token("staff1")
        ids = []
        for k in range(ENDED_KEPT + 20):
            status, body = app.request("POST", "/api/jobs", {"name": f"j{k}", "min_nodes": 1, "max_nodes": 2,
                                                             "total_samples": 1e12, "curve": "1:10, 2:19"}, token=token)
            assert status == 201, body
            ids.append(body["id"])
            status, body = app.request("DELETE", f"/api/jobs/{ids[-1]}", token=token)
            assert status == 200 and body["state"] == "cancelled", body
        seen, path = [], "/api/jobs?limit=64"
        while path:
            status, page = app.get(path)
            assert status == 200, page
            seen += [(j["id"], j["state"]) for j in page["jobs"]]
            path = page["next"]
        assert seen == [(i, "cancelled") for i in ids]
        status, page = app.get("/api/jobs?state=cancelled&limit=10&offset=5")
        assert page["total"] == len(ids) and [j["id"] for j in page["jobs"]] == ids[5:15]
        assert app.get("/api/jobs?state=queued")[1]["total"] == 0
        status, old = app.get(f"/api/jobs/{ids[0]}")      # ended first, long out of the controller's memory
        assert status == 200 and old["state"] == "cancelled" and old["id"] == ids[0], old
        status, again = app.request("POST", f"/api/jobs/{ids[0]}/resubmit", {}, token=token)
        assert status == 201 and again["resubmitted_from"] == ids[0], again
        status, page = app.get("/api/jobs?state=queued")
        assert [j["id"] for j in page["jobs"]] in ([again["id"]], []) or page["total"] <= 1
        assert app.get("/api/health")[1]["jobs"] <= ENDED_KEPT + 1
    finally:
        app.stop()
