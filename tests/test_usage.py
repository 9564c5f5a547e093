"""Usage (issue 49, item 2): node-seconds, GPU-seconds and samples per job, owner and account.

The pure accounting (core/usage.py) on hand-made histories; a replay of a known run whose
`/api/usage` totals equal an independent computation from the store's allocations; and a live
server whose totals for a window survive a kill -9 and a restart."""
from __future__ import annotations

import csv
import io
import json
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from werkzeug.security import generate_password_hash

from core.usage import Change, JobRecord, Progress, holds, report, samples_at
from tests.support.browser import login, shoot
from tests.support.files import write_jobset, write_trace
from tests.support.server import password, start_app
from tests.support.waiting import wait

GPUS = 4
ACCOUNTS = {"alice": "physics", "bob": "chemistry"}
CURVE = "1:100, 2:190, 4:350"


def write_users(path: Path) -> Path:
    """The test users, alice and bob with an account each (the users file's `account` field)."""
    rows = [{"name": n, "role": r, "password_hash": generate_password_hash(password(n), method="pbkdf2:sha256:1000"),
             **({"account": ACCOUNTS[n]} if n in ACCOUNTS else {})}
            for n, r in (("staff1", "staff"), ("alice", "user"), ("bob", "user"))]
    path.write_text(json.dumps({"users": rows}))
    return path


# ---- the accounting alone ------------------------------------------------------------------

def test_a_node_counts_from_its_grow_to_its_shrink_or_reclaim():
    changes = [Change(0.0, "a", ("n1", "n2"), ()), Change(10.0, "a", ("n3",), ()),
               Change(20.0, "a", (), ("n1",)), Change(30.0, "b", ("n1",), ()),
               Change(40.0, "a", (), ("n2", "n3"))]
    got = {(h.job, h.node): (h.start, h.end) for h in holds(changes)}
    assert got == {("a", "n1"): (0.0, 20.0), ("a", "n2"): (0.0, 40.0), ("a", "n3"): (10.0, 40.0),
                   ("b", "n1"): (30.0, None)}
    jobs = [JobRecord("a", "A", "alice", 0.0, 40.0), JobRecord("b", "B", "bob", 0.0)]
    rep = report(changes, [], jobs, [(0.0, 4)], None, None, until=50.0, by="owner",
                 accounts={"alice": "physics"}, slots=lambda n: 2 if n == "n3" else 1)
    rows = {r.key: r for r in rep.rows}
    assert rows["alice"].totals.node_seconds == 20 + 40 + 30
    assert rows["alice"].totals.gpu_seconds == 20 + 40 + 2 * 30
    assert rows["bob"].totals.node_seconds == 20          # still held: counted up to the last save
    assert rows["alice"].share == pytest.approx(90 / 200) and rep.idle_node_seconds == 200
    window = report(changes, [], jobs, [(0.0, 4)], 15.0, 35.0, until=50.0, by="account",
                    accounts={"alice": "physics"})
    assert {r.key: r.totals.node_seconds for r in window.rows} == {"physics": 5 + 20 + 20, "": 5}


def test_a_node_taken_without_its_release_row_ends_the_earlier_hold():
    got = holds([Change(0.0, "a", ("n1",), ()), Change(5.0, "b", ("n1",), ())])
    assert [(h.job, h.start, h.end) for h in got] == [("a", 0.0, 5.0), ("b", 5.0, None)]


def test_samples_are_the_progress_between_the_window_ends():
    # 10/s from 0; a grow at 10 s charges its 18 s pause at once (100 -> 40), then 20/s; a save at 30 s
    pts = [(0.0, 0.0, 10.0), (10.0, 40.0, 20.0)]
    assert samples_at(pts, None, -1) == 0 and samples_at(pts, None, 5) == 50 and samples_at(pts, None, 25) == 340
    assert samples_at(pts, (30.0, 440.0), 25) == 340 and samples_at(pts, (30.0, 440.0), 99) == 440
    assert samples_at(pts, (30.0, 300.0), 25) == 300, "never past what the jobs table says"
    progress = [Progress(t, "a", s, r) for t, s, r in pts]
    job = [JobRecord("a", "A", "alice", 440.0)]
    rep = report([Change(0.0, "a", ("n1",), ())], progress, job, [], 5.0, 25.0, until=30.0, by="job")
    assert rep.rows[0].totals.samples == 340 - 50
    assert report([Change(0.0, "a", ("n1",), ())], progress, job, [], 5.0, 25.0, until=60.0, by="job").rows[0] \
        .totals.samples == 290, "a later save (a restart) does not change an earlier window"
    whole = report([Change(0.0, "a", ("n1",), ())], progress, job, [], None, None, until=30.0, by="job")
    assert whole.total.samples == 440                     # the jobs table's figure closes the run


def test_the_series_stacks_the_mean_nodes_held_per_step():
    changes = [Change(0.0, "a", ("n1", "n2"), ()), Change(1800.0, "b", ("n3",), ()),
               Change(3600.0, "a", (), ("n1", "n2"))]
    jobs = [JobRecord("a", "A", "alice", 0.0), JobRecord("b", "B", "bob", 0.0)]
    rep = report(changes, [], jobs, [], None, None, until=7200.0, by="owner", series=True)
    s = rep.series
    assert s["step"] == 60 and len(s["times"]) == 120 and s["times"][0] == 0.0
    alice, bob = s["nodes"]["alice"], s["nodes"]["bob"]
    assert alice[:60] == [2.0] * 60 and alice[60:] == [0.0] * 60
    assert bob[:30] == [0.0] * 30 and bob[30:] == [1.0] * 90
    assert sum(alice) * 60 == rep.rows[0].totals.node_seconds == 7200


def test_an_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="by: give one of owner, job, account"):
        report([], [], [], [], None, None, until=0.0, by="rack")


# ---- an independent computation from the store ------------------------------------------------

def expected(db: Path, start: float, end: float) -> dict[str, dict[str, float]]:
    """Node-seconds per job, owner and account from the allocations table alone, by node counts
    (`to_nodes` stands until the job's next row, the last one until `end`): no node names, no
    core code."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        owners = dict(conn.execute("select id, coalesce(owner, '') from jobs"))
        rows = conn.execute("select job, time, to_nodes from allocations order by id").fetchall()
    finally:
        conn.close()
    per_job: dict[str, list[tuple[float, int]]] = {}
    for job, t, n in rows:
        per_job.setdefault(job, []).append((t, n))
    out: dict[str, dict[str, float]] = {"job": {}, "owner": {}, "account": {}}
    for job, pts in per_job.items():
        secs = 0.0
        for k, (t, n) in enumerate(pts):
            t1 = pts[k + 1][0] if k + 1 < len(pts) else end
            secs += n * max(0.0, min(t1, end) - max(t, start))
        if secs > 0:
            owner = owners.get(job, "")
            out["job"][job] = secs
            out["owner"][owner] = out["owner"].get(owner, 0.0) + secs
            account = ACCOUNTS.get(owner, "")
            out["account"][account] = out["account"].get(account, 0.0) + secs
    return out


def saved_clock(db: Path) -> float:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return json.loads(conn.execute("select value from meta where key = 'clock'").fetchone()[0])
    finally:
        conn.close()


def usage(app, token: str, **query) -> dict:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    status, body = app.get(f"/api/usage?{q}", token=token)
    assert status == 200, body
    return body


def by_key(body: dict) -> dict[str, float]:
    return {r[body["by"]]: r["node_seconds"] for r in body["rows"]}


def agrees(body: dict, want: dict[str, float]) -> None:
    got = by_key(body)
    assert got.keys() == want.keys(), (got, want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-6), (k, got[k], v)       # to the microsecond, not just the second
    assert body["total"]["node_seconds"] == pytest.approx(sum(want.values()), abs=1e-6)


# ---- a replay of a known run -------------------------------------------------------------------

@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The conftest's small trace (8 nodes in two racks, 3 hours, here 4 GPUs each) and small job
    set, with a job each of alice and bob, replayed to its end."""
    work = tmp_path_factory.mktemp("usage-replay")
    rows = [(f"2021-02-10T00:00:{i:02d}Z", f"r{i // 4:02d}n{i % 4:02d}", "idle") for i in range(8)]
    rows += [("2021-02-10T00:30:00Z", "r00n00", "busy"), ("2021-02-10T00:30:00Z", "r00n01", "busy"),
             ("2021-02-10T01:00:00Z", "r00n00", "idle"), ("2021-02-10T01:00:00Z", "r00n01", "idle"),
             ("2021-02-10T01:30:00Z", "r01n03", "busy"), ("2021-02-10T02:00:00Z", "r01n03", "idle")]
    trace = write_trace(work / "trace.csv", rows)
    jobs = write_jobset(work / "jobs.csv", [
        "A,alex,2021-02-10T00:01:00Z,1,4,2000000,18,12,1;2;4,100;190;350",
        "B,vgg,2021-02-10T00:02:00Z,2,8,3000000,18,12,2;4;8,200;380;700",
        "C,res,2021-02-10T00:03:00Z,1,2,100000,18,12,1;2,50;90"])
    app = start_app(work, "--fresh", "--trace", str(trace), "--jobs", str(jobs), "--hours", "3",
                    "--speed", "900", "--gpus-per-node", str(GPUS), users=write_users(work / "users.json"))
    try:
        for who in ("alice", "bob"):
            status, body = app.request("POST", "/api/jobs", {
                "name": f"{who}-net", "min_nodes": 1, "max_nodes": 4, "total_samples": 2e5, "curve": CURVE},
                token=app.token(who))
            assert status == 201, body
        wait(lambda: app.get("/api/health")[1].get("replay") == "finished", 90, "the replay to finish")
        yield app
    finally:
        app.stop()


def test_replay_usage_equals_the_allocations_to_the_second(replayed):
    token = replayed.token("staff1")
    until = saved_clock(replayed.db)
    whole = usage(replayed, token)
    assert whole["to"] == until
    for by in ("owner", "job", "account"):
        agrees(usage(replayed, token, by=by), expected(replayed.db, whole["from"], until)[by])
    owners = by_key(whole)
    assert {"alice", "bob", ""} <= owners.keys() and all(v > 0 for v in owners.values()), owners
    rows = {r["owner"]: r for r in whole["rows"]}
    assert rows["alice"]["account"] == "physics" and rows[""]["account"] is None
    for r in whole["rows"]:
        assert r["gpu_seconds"] == pytest.approx(GPUS * r["node_seconds"])
        assert 0 < r["idle_share"] <= 1.0 + 1e-9
    # a window in the middle of the run, as ISO and as epoch seconds
    t0, t1 = whole["from"] + 1800.5, whole["from"] + 5400.25
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)) + ".5Z"
    window = usage(replayed, token, by="job", **{"from": iso, "to": t1})
    assert window["from"] == t0 and window["to"] == t1
    agrees(window, expected(replayed.db, t0, t1)["job"])


def test_replay_samples_per_job_are_what_each_job_processed(replayed):
    body = usage(replayed, replayed.token("staff1"), by="job")
    conn = sqlite3.connect(f"file:{replayed.db}?mode=ro", uri=True)
    try:
        done = dict(conn.execute("select id, samples_done from jobs"))
    finally:
        conn.close()
    for r in body["rows"]:
        assert r["samples"] == pytest.approx(done[r["job"]], rel=1e-9), r
    assert body["total"]["samples"] == pytest.approx(sum(done[r["job"]] for r in body["rows"]), rel=1e-9)


def test_the_csv_export_says_the_same(replayed):
    token = replayed.token("staff1")
    body = usage(replayed, token, by="owner")
    status, text = replayed.get("/api/usage.csv?by=owner", token=token)
    assert status == 200
    lines = list(csv.DictReader(io.StringIO(text)))
    assert [r["owner"] for r in lines] == [r["owner"] for r in body["rows"]] + ["total"]
    for line, row in zip(lines, body["rows"]):
        assert float(line["node_seconds"]) == pytest.approx(row["node_seconds"], abs=1e-6)
        assert line["account"] == (row["account"] or "")
    assert float(lines[-1]["node_seconds"]) == pytest.approx(body["total"]["node_seconds"], abs=1e-6)


@pytest.mark.parametrize("query, says", [
    ("by=rack", "by: give one of owner, job, account"),
    ("from=yesterday", "from: give epoch seconds or an ISO 8601 date-time"),
    ("from=100&to=50", "to: give a time after from"),
    ("from=100&to=100", "to: give a time after from"),
    ("to=1e300", "to: give a time from year 1 to 9999"),
    ("from=nan", "from: give a time from year 1 to 9999"),
    ("by=job&by=owner", "by: give it once"),
])
def test_bad_queries_are_400s_that_say_why(replayed, query, says):
    status, body = replayed.get(f"/api/usage?{query}", token=replayed.token("staff1"))
    assert status == 400 and says in body["error"], body


def test_only_staff_read_usage(replayed):
    assert replayed.get("/api/usage")[0] == 401
    status, body = replayed.get("/api/usage.csv", token=replayed.token("alice"))
    assert status == 403 and "only staff" in body["error"]


def test_metrics_count_usage_per_owner(replayed):
    body = usage(replayed, replayed.token("staff1"))
    status, text = replayed.get("/metrics")
    assert status == 200
    for r in body["rows"]:
        for metric, field in (("node_seconds", "node_seconds"), ("gpu_seconds", "gpu_seconds"),
                              ("samples", "samples")):
            line = re.search(rf'^harvest_owner_{metric}_total{{owner="{r["owner"]}"}} (\S+)$', text, re.M)
            assert line, (metric, r["owner"], text[-2000:])
            assert float(line.group(1)) == pytest.approx(r[field], rel=1e-9)
    assert re.search(r"^# TYPE harvest_owner_node_seconds(_total)? counter$", text, re.M), text[:3000]


def test_the_usage_page_shows_the_totals_to_staff_only(replayed, browser):
    body = usage(replayed, replayed.token("staff1"))
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = ctx.new_page()
        login(page, replayed.url, "alice")
        assert "Usage" not in page.inner_text("header nav")
        page.goto(replayed.url + "/usage")
        page.wait_for_selector("main h2")
        assert "Only staff see usage" in page.inner_text("main")
        ctx.clear_cookies()
        login(page, replayed.url, "staff1")
        page.click("header nav >> text=Usage")
        page.wait_for_function("() => document.querySelectorAll('#usage-table td').length > 0", timeout=20_000)
        page.wait_for_selector("#usage-chart .scatterlayer .trace", timeout=20_000)
        summary = page.inner_text("#usage-summary")
        assert f"{body['total']['node_hours']:,.1f} node-hours" in summary, summary
        table = page.inner_text("#usage-table")
        for r in body["rows"]:
            assert f"{r['node_hours']:.2f}".rstrip("0").rstrip(".") in table, (r, table)
        assert "alice" in table and "physics" in table and "the job set" in table, table
        assert page.get_attribute("#usage-csv", "href") == "/api/usage.csv?by=owner"
        shoot(page, "usage", full=True)
        page.click("#usage-by")
        page.click("text=account / project")
        page.wait_for_function("() => (document.querySelector('#usage-table')?.innerText || '').includes('chemistry')",
                               timeout=20_000)
    finally:
        ctx.close()


# ---- live: kill -9 and restart --------------------------------------------------------------

def test_live_usage_survives_kill_9_and_restart(tmp_path):
    users = write_users(tmp_path / "users.json")
    app = start_app(tmp_path, "--fresh", "--dispatch", "simulated", "--local-nodes", "6", "--tick", "0.1",
                    users=users)
    try:
        staff = app.token("staff1")
        for who in ("alice", "bob"):
            status, body = app.request("POST", "/api/jobs", {
                "name": f"{who}-live", "min_nodes": 1, "max_nodes": 4, "total_samples": 1e9, "curve": CURVE},
                token=app.token(who))
            assert status == 201, body
        wait(lambda: len(by_key(usage(app, staff))) == 2, 20, "both owners to use nodes")
        status, body = app.request("POST", "/api/nodes/local-1/reclaim", token=staff)
        assert status == 200, body
        time.sleep(1.5)
        status, body = app.request("POST", "/api/nodes/local-1/release", token=staff)
        time.sleep(1.5)
        end = saved_clock(app.db)
        before = {by: usage(app, staff, by=by, to=end) for by in ("owner", "job", "account")}
    finally:
        rc = app.stop(signal.SIGKILL)
    assert rc == -signal.SIGKILL
    start = before["owner"]["from"]
    for by, body in before.items():
        agrees(body, expected(app.db, start, end)[by])
    assert by_key(before["account"]).keys() == {"physics", "chemistry"}

    again = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "6", db=app.db, users=users)
    try:
        staff = again.token("staff1")
        for by, body in before.items():
            after = usage(again, staff, by=by, to=end)
            assert after["from"] == start and after["to"] == end
            agrees(after, by_key(body))
            assert after["total"]["samples"] == pytest.approx(body["total"]["samples"], rel=1e-9)
            assert after["total"]["samples"] > 0
        later = wait(lambda: (b := usage(again, staff))["to"] > end + 1 and b, 20, "the restarted run to save")
        assert later["total"]["node_seconds"] > before["owner"]["total"]["node_seconds"], "usage went on"
    finally:
        again.stop()
