"""Bounded memory and work over a long run (issue 17, item 7 in part): solve times kept as a
fixed window plus whole-run totals (restored exactly from the store), worker reports capped and
freed when a job ends, and GET /api/jobs paged."""
from __future__ import annotations

import json

import pytest

from app.client import Client
from core.clock import SimClock
from core.controller_config import ControllerConfig
from core.counters import SolveTimes
from core.dispatchers.simulated import SimulatedDispatcher
from core.restore import restore
from core.runtime.reports import MAX_REPORT_BYTES, ReportBook
from core.store import Store
from tests.support.server import password, start_app
from tests.support.sim import T0, churn, controller, job

NODES = [f"a01n{i:02d}" for i in range(1, 9)]


def test_solve_times_keep_a_window_and_totals_of_every_solve():
    st = SolveTimes(window=5)
    for ms in range(1, 13):
        st.add(float(ms))
    assert st.ms == [8.0, 9.0, 10.0, 11.0, 12.0] and len(st.recent) == 5
    h = st.histogram()
    assert h.count == 12 and st.max_ms == 12.0 and h.sum_s == pytest.approx(78 / 1000)
    assert h.le[-1] == 12                       # every solve under the last bucket (5 s)


def test_a_restored_controller_has_the_same_solve_histogram(tmp_path):
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=3, tfwd=1000), store)
    for k in range(3):
        ctl.submit(job(f"J{k}", submit=T0 + k, total=1e9))
    churn(ctl, clock, NODES, 39)
    ctl.flush()
    back = restore(Store(tmp_path / "run.db"), SimulatedDispatcher(), SimClock(clock.now()), node_names=NODES)
    assert ctl.solve_times.count > 30
    got, want = back.solve_times.histogram(), ctl.solve_times.histogram()
    assert (got.le, got.count) == (want.le, want.count) and got.sum_s == pytest.approx(want.sum_s)
    assert back.solve_ms == ctl.solve_ms and back.solve_times.max_ms == ctl.solve_times.max_ms


def test_worker_reports_are_capped_and_freed_when_the_job_ends():
    book = ReportBook(keep=3)
    book.register("j", "tok")
    for step in range(10):
        assert book.accept_http("j", "Bearer tok", json.dumps({"step": step}).encode()) == 204
    assert [r["step"] for r in book.reports("j")] == [7, 8, 9]
    assert book.accept_http("j", "Bearer tok", b'{"x": "' + b"a" * MAX_REPORT_BYTES + b'"}') == 413
    assert book.accept_http("j", "Bearer tok", b"[" * 100_000 + b"]" * 100_000) == 413
    assert book.accept_http("j", "Bearer tok", b"[" * 5_000 + b"]" * 5_000) == 400   # too deep for json
    book.revoke("j")
    assert book.reports("j") == [] and book.accept_http("j", "Bearer tok", b'{"step": 11}') == 401


def test_jobs_are_listed_a_page_at_a_time(tmp_path):
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1")
    try:
        token = app.token("staff1")
        ids = []
        for k in range(5):
            status, body = app.request("POST", "/api/jobs", {"name": f"j{k}", "min_nodes": 1, "max_nodes": 2,
                                                             "total_samples": 1e12, "curve": "1:10, 2:19"}, token=token)
            assert status == 201, body
            ids.append(body["id"])
        status, page = app.get("/api/jobs?limit=2")
        assert status == 200 and page["count"] == 2 and page["total"] == 5 and page["offset"] == 0
        seen = []
        path = "/api/jobs?limit=2"
        while path:
            status, page = app.get(path)
            seen += [j["id"] for j in page["jobs"]]
            path = page["next"]
        assert seen == ids
        assert app.get("/api/jobs?limit=2&offset=4")[1]["jobs"][0]["id"] == ids[4]
        assert app.get("/api/jobs?offset=9")[1] | {"jobs": None} == {
            "jobs": None, "count": 0, "total": 5, "offset": 9, "limit": 1000, "next": None}
        for bad in ("limit=-1", "limit=x", "limit=10001", "offset=1.5"):
            status, body = app.get(f"/api/jobs?{bad}")
            assert status == 400 and body["error"].split(":")[0] in ("limit", "offset"), (bad, body)
        client = Client.login(app.url, "staff1", password("staff1"))
        assert [j["id"] for j in client.jobs()] == ids
    finally:
        app.stop()
