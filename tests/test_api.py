"""The JSON API, /metrics and the two command lines (`python -m app`, `python -m app.users`),
against a real `python -m app` process: no mocks, every answer comes over HTTP and every
"is it stored" question is asked of the SQLite file itself (opened read-only).

One server for the whole module. Its scenario is the Summit trace cut to six racks that stay
idle for the first simulated ninety minutes from 2021-02-12T19:30 (108 nodes, ~100 idle), with
a two-job job set of its own, so that jobs registered here really get nodes and the metrics
have something non-zero to report. 120x keeps those ninety minutes longer than this file runs.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from itsdangerous import TimestampSigner, URLSafeTimedSerializer
from prometheus_client.parser import text_string_to_metric_families

from app.auth import TOKEN_TTL_S, Users, password_stamp
from tests.support.files import write_jobset
from tests.support.server import ROOT, free_port, password, start_app, write_users
from tests.support.waiting import wait

RACKS = "d30,e04,e06,e11,f36,g30"
START = "2021-02-12T19:30:00Z"
N_NODES = 108
SET_JOBS = [   # owned by the job set (owner ""), long enough never to finish here
    "S1,alex,2021-02-12T19:31:00Z,1,64,1e12,18,12,1;2;4;8;16;32;64,"
    "7115.3;13071.7;21066.1;40484.9;74002.9;130762.0;202135.4",
    "S2,vgg,2021-02-12T19:32:00Z,1,64,1e12,18,12,1;2;4;8;16;32;64,"
    "1193.3;2389.2;4691.7;9257.9;18348.9;36208.5;70151.7",
]
VALID = {"name": "resnet probe", "min_nodes": 1, "max_nodes": 4, "total_samples": 1e9,
         "curve": "1:100, 2:190, 4:350"}
MISSING = object()


# ---- helpers -------------------------------------------------------------------------------

def stored(db: Path, sql: str, args=()) -> list[dict]:
    """Rows from the store, read through a read-only connection of our own."""
    conn = sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def call(app, method: str, path: str, body=None, token=None, raw: bytes | None = None,
         headers: dict | None = None):
    """Like AppProcess.request, but also returns the response headers."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(app.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, hdrs, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, e.headers, e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except json.JSONDecodeError:
        return status, hdrs, text


def post_job(app, token, **changes):
    body = {**VALID, **changes}
    body = {k: v for k, v in body.items() if v is not MISSING}
    # json.dumps writes NaN / Infinity as the bare words Python's (and Flask's) JSON reader takes
    return app.request("POST", "/api/jobs", raw=json.dumps(body).encode(), token=token)


def job_state(app, job_id: str) -> str:
    status, body = app.get(f"/api/jobs/{job_id}")
    assert status == 200, body
    return body["state"]


def stored_state(app, job_id: str):
    rows = stored(app.db, "select state from jobs where id = ?", (job_id,))
    return rows[0]["state"] if rows else None


def server_key(app) -> str:
    return os.environ.get("HARVEST_SECRET_KEY") or Path(str(app.db) + ".secret").read_text().strip()


def signed_token(app, key: str, user: str, age_s: float = 0.0) -> str:
    """A token made the way the server makes them, with `key`, `age_s` seconds old, bound to the
    user's password in `app`'s users file (any stamp for a user it does not know)."""
    class Signer(TimestampSigner):
        def get_timestamp(self) -> int:
            return int(time.time() - age_s)
    known = Users.load(app.db.parent / "users.json").get(user)
    stamp = password_stamp(key, known) if known else "0" * 16
    return URLSafeTimedSerializer(key, salt="api-token", signer=Signer).dumps({"u": user, "p": stamp})


def metric_families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


# ---- the server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("api")
    jobs = write_jobset(workdir / "jobs.csv", SET_JOBS)
    proc = start_app(workdir, "--fresh", "--speed", "120", "--racks", RACKS, "--start", START,
                     "--jobs", str(jobs))
    # the first snapshot, published before the first tick, still says "stopped"
    assert wait(lambda: proc.get("/api/health")[1]["replay"] == "running", 6.0, period=0.1, fail=False), \
        proc.get("/api/health")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tokens(app):
    return {name: app.token(name) for name in ("alice", "bob", "staff1")}


def new_job(app, token, **changes) -> str:
    status, body = post_job(app, token, **changes)
    assert status == 201, body
    return body["id"]


# ---- 5a. health and cluster ----------------------------------------------------------------

def test_health_answers_ok(app):
    status, body = app.get("/api/health")
    assert status == 200, body
    assert body["status"] == "ok" and body["error"] is None
    assert body["nodes"] == N_NODES
    assert body["replay"] in ("running", "paused")


def test_cluster_lists_kpis_and_nodes_from_one_snapshot(app):
    status, body = app.get("/api/cluster")
    assert status == 200, body
    kpis = body["kpis"]
    for key in ("idle", "harvested", "running", "queued", "samples_per_second", "events_by_kind"):
        assert key in kpis, key
    nodes = body["nodes"]
    assert len(nodes) == N_NODES
    names = [n["name"] for n in nodes]
    assert len(set(names)) == len(names) and all(isinstance(n, str) and n for n in names)
    assert {n[:3] for n in names} == set(RACKS.split(","))
    assert {n["state"] for n in nodes} <= {"idle", "busy", "harvested"}
    held = [n for n in nodes if n["state"] == "harvested"]
    assert all(n["job"] for n in held)
    assert all(n["job"] is None for n in nodes if n["state"] != "harvested")
    # the list and the KPIs come from the same snapshot, so they agree exactly
    assert len(held) == kpis["harvested"]
    assert sum(n["state"] in ("idle", "harvested") for n in nodes) == kpis["idle"]
    assert kpis["idle"] > 0, "the scenario should have idle nodes to harvest"
    assert body["config"]["max_jobs"] >= 1 and body["speed"] == 120


def test_cluster_without_the_node_list(app):
    status, body = app.get("/api/cluster?nodes=0")
    assert status == 200, body
    assert "nodes" not in body
    assert "idle" in body["kpis"] and "status" in body


# ---- 1. every rule of the job form ---------------------------------------------------------

NAN, INF = float("nan"), float("inf")
INVALID = [
    # (id, changes to VALID, the field the error must be keyed by)
    ("min-above-max", dict(min_nodes=8, max_nodes=4), "max_nodes"),
    ("min-nodes-zero", dict(min_nodes=0), "min_nodes"),
    ("min-nodes-negative", dict(min_nodes=-1), "min_nodes"),
    ("max-nodes-zero", dict(min_nodes=1, max_nodes=0), "max_nodes"),
    ("max-nodes-negative", dict(max_nodes=-3), "max_nodes"),
    ("max-nodes-too-many", dict(max_nodes=100_001), "max_nodes"),
    ("total-samples-zero", dict(total_samples=0), "total_samples"),
    ("total-samples-negative", dict(total_samples=-1e6), "total_samples"),
    ("scale-up-negative", dict(scale_up_seconds=-1), "scale_up_seconds"),
    ("scale-up-over-an-hour", dict(scale_up_seconds=3601), "scale_up_seconds"),
    ("scale-down-negative", dict(scale_down_seconds=-0.5), "scale_down_seconds"),
    ("priority-zero", dict(priority=0), "priority"),
    ("priority-negative", dict(priority=-2), "priority"),
    ("priority-too-high", dict(priority=1001), "priority"),
    ("min-nodes-text", dict(min_nodes="abc"), "min_nodes"),
    ("max-nodes-text", dict(max_nodes="four"), "max_nodes"),
    ("total-samples-text", dict(total_samples="abc"), "total_samples"),
    ("scale-up-text", dict(scale_up_seconds="soon"), "scale_up_seconds"),
    ("priority-text", dict(priority="high"), "priority"),
    ("min-nodes-fraction", dict(min_nodes=1.5), "min_nodes"),
    ("max-nodes-fraction", dict(max_nodes=2.5), "max_nodes"),
    ("total-samples-nan", dict(total_samples=NAN), "total_samples"),
    ("total-samples-inf", dict(total_samples=INF), "total_samples"),
    ("total-samples-inf-text", dict(total_samples="inf"), "total_samples"),
    ("priority-nan", dict(priority=NAN), "priority"),
    ("scale-down-inf", dict(scale_down_seconds=INF), "scale_down_seconds"),
    ("min-nodes-inf", dict(min_nodes=INF), "min_nodes"),
    ("curve-throughput-nan", dict(curve={"nodes": [1, 2], "samples_per_second": [100, NAN]}), "curve"),
    ("curve-throughput-inf", dict(curve={"nodes": [1, 2], "samples_per_second": [100, INF]}), "curve"),
    ("launcher-unknown", dict(launcher="mpirun"), "launcher"),
    ("progress-pattern-no-group", dict(launcher="torchrun", progress_pattern=r"samples=\d+"), "progress_pattern"),
    ("progress-pattern-broken", dict(launcher="torchrun", progress_pattern="samples=(\\d+"), "progress_pattern"),
    ("stop-grace-negative", dict(launcher="torchrun", stop_grace_seconds=-1), "stop_grace_seconds"),
    ("curve-text-nan", dict(curve="1:100, 2:nan"), "curve"),
    ("curve-text-inf", dict(curve="1:inf"), "curve"),
    ("name-10000-chars", dict(name="x" * 10_000), "name"),
    ("name-empty", dict(name=""), "name"),
    ("name-blank", dict(name="   "), "name"),
    ("name-nul", dict(name="bad\x00name"), "name"),
    ("name-two-lines", dict(name="two\nlines"), "name"),
    ("name-bell", dict(name="ring\x07"), "name"),
    ("name-not-text", dict(name=5), "name"),
    ("curve-text-garbage", dict(curve="1-100"), "curve"),
    ("curve-text-words", dict(curve="a:100, b:200"), "curve"),
    ("curve-text-empty", dict(curve=""), "curve"),
    ("curve-unequal-lengths", dict(curve={"nodes": [1, 2, 4], "samples_per_second": [100, 190]}), "curve"),
    ("curve-empty-lists", dict(curve={"nodes": [], "samples_per_second": []}), "curve"),
    ("curve-decreasing-nodes", dict(curve="4:350, 2:190"), "curve"),
    ("curve-repeated-nodes", dict(curve="1:100, 1:120"), "curve"),
    ("curve-zero-nodes", dict(curve="0:100, 2:190"), "curve"),
    ("curve-negative-throughput", dict(curve="1:100, 2:-5"), "curve"),
    ("curve-negative-throughput-dict", dict(curve={"nodes": [1], "samples_per_second": [-1]}), "curve"),
    ("curve-extra-key", dict(curve={"nodes": [1], "samples_per_second": [1], "shape": "flat"}), "curve"),
    ("curve-wrong-type", dict(curve=[1, 2]), "curve"),
    ("unknown-field-owner", dict(owner="bob"), "owner"),
    ("unknown-field-state", dict(state="running"), "state"),
    ("missing-name", dict(name=MISSING), "name"),
    ("missing-min-nodes", dict(min_nodes=MISSING), "min_nodes"),
    ("missing-max-nodes", dict(max_nodes=MISSING), "max_nodes"),
    ("missing-total-samples", dict(total_samples=MISSING), "total_samples"),
    ("missing-curve", dict(curve=MISSING), "curve"),
]


@pytest.fixture(scope="class")
def form_baseline(app, tokens):
    """Alice's jobs before TestJobFormRules posts anything; pauses the replay for the class."""
    status, body = app.request("POST", "/api/replay/pause", token=tokens["staff1"])
    assert status == 200, body
    _, jobs = app.get("/api/jobs?owner=alice")
    ids = {r["id"] for r in stored(app.db, "select id from jobs where owner = 'alice'")}
    ctx = {"count": jobs["count"], "ids": ids, "names": []}
    yield ctx
    status, body = app.request("POST", "/api/replay/resume", token=tokens["staff1"])
    assert status == 200, body


class TestJobFormRules:
    """Invalid jobs are refused with 422 and an error beside the field at fault, and leave no
    trace. The replay is paused meanwhile: a wrongly accepted job is cancelled again before any
    tick could hand it nodes (a bad curve in the allocator would stall the replay for the rest
    of the module)."""

    @pytest.mark.parametrize("changes, field", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
    def test_refused_with_the_field_at_fault(self, app, tokens, form_baseline, request, changes, field):
        changes = {"name": f"invalid {request.node.callspec.id}", **changes}
        if isinstance(changes["name"], str):
            form_baseline["names"].append(changes["name"])
        status, body = post_job(app, tokens["alice"], **changes)
        if status == 201:   # wrongly accepted: take it back at once (see the class docstring)
            app.request("DELETE", f"/api/jobs/{body['id']}", token=tokens["staff1"])
        assert status == 422, body
        assert body["error"] == "invalid job"
        assert set(body["errors"]) == {field}, body["errors"]
        assert isinstance(body["errors"][field], str) and body["errors"][field].strip()

    def test_min_above_max_says_so(self, app, tokens, form_baseline):
        status, body = post_job(app, tokens["alice"], name="invalid min above max", min_nodes=8, max_nodes=4)
        form_baseline["names"].append("invalid min above max")
        assert status == 422
        assert "at least min nodes" in body["errors"]["max_nodes"]

    def test_nothing_invalid_was_stored(self, app, form_baseline):
        _, jobs = app.get("/api/jobs?owner=alice")
        assert jobs["count"] == form_baseline["count"]
        now = {r["id"] for r in stored(app.db, "select id from jobs where owner = 'alice'")}
        assert now == form_baseline["ids"]
        for name in form_baseline["names"]:
            assert stored(app.db, "select id from jobs where owner = 'alice' and name = ?", (name,)) == []
            assert stored(app.db, "select id from jobs where owner = 'alice' and name = ?", (name.strip(),)) == []


# ---- 2. a valid job ------------------------------------------------------------------------

def test_a_valid_job_is_created_listed_and_durable(app, tokens):
    status, hdrs, body = call(app, "POST", "/api/jobs", {**VALID, "name": "valid one", "priority": 2},
                              token=tokens["alice"])
    assert status == 201, body
    job_id = body["id"]
    # durable: in the store's jobs table as soon as the 201 is sent
    rows = stored(app.db, "select * from jobs where id = ?", (job_id,))
    assert len(rows) == 1
    row = rows[0]
    assert (row["owner"], row["name"], row["min_nodes"], row["max_nodes"]) == ("alice", "valid one", 1, 4)
    assert row["total_samples"] == 1e9 and row["priority"] == 2
    assert json.loads(row["curve"]) == {"nodes": [1, 2, 4], "samples_per_second": [100.0, 190.0, 350.0]}
    assert row["state"] in ("queued", "running")

    assert hdrs["Location"] == f"/api/jobs/{job_id}"
    assert body["owner"] == "alice" and body["name"] == "valid one" and body["state"] in ("queued", "running")
    assert (body["min_nodes"], body["max_nodes"], body["total_samples"]) == (1, 4, 1e9)

    _, listed = app.get("/api/jobs")
    assert job_id in {j["id"] for j in listed["jobs"]}
    assert listed["count"] == len(listed["jobs"])
    _, mine = app.get("/api/jobs?owner=alice")
    assert job_id in {j["id"] for j in mine["jobs"]} and all(j["owner"] == "alice" for j in mine["jobs"])
    _, bobs = app.get("/api/jobs?owner=bob")
    assert job_id not in {j["id"] for j in bobs["jobs"]}

    status, one = app.get(hdrs["Location"])
    assert status == 200, one
    assert one["id"] == job_id and one["owner"] == "alice"
    assert one["curve"] == {"nodes": [1, 2, 4], "samples_per_second": [100.0, 190.0, 350.0]}
    assert (one["scale_up_seconds"], one["scale_down_seconds"]) == (18.0, 12.0)
    assert isinstance(one["why"], str) and one["why"].strip()

    # the replay takes it up: it runs on harvested nodes
    assert wait(lambda: app.get(f"/api/jobs/{job_id}")[1]["nodes"] > 0, 6.0, period=0.1, fail=False), \
        app.get(f"/api/jobs/{job_id}")
    app.request("DELETE", f"/api/jobs/{job_id}", token=tokens["alice"])


def test_a_curve_as_lists_is_accepted_too(app, tokens):
    curve = {"nodes": [1, 8], "samples_per_second": [1200, 9000]}
    status, body = post_job(app, tokens["bob"], name="  lists  ", curve=curve)
    assert status == 201, body
    assert body["name"] == "lists" and body["owner"] == "bob"   # surrounding blanks are trimmed
    assert app.get(f"/api/jobs/{body['id']}")[1]["curve"] == {"nodes": [1, 8], "samples_per_second": [1200.0, 9000.0]}
    app.request("DELETE", f"/api/jobs/{body['id']}", token=tokens["bob"])


def test_missing_job_is_404(app):
    status, body = app.get("/api/jobs/u-00000000")
    assert status == 404 and "u-00000000" in body["error"]
    status, body = app.get("/api/jobs/u-00000000/events")
    assert status == 404 and "u-00000000" in body["error"]


def test_a_jobs_events_come_oldest_first_a_page_at_a_time_after_a_sequence_number(app, tokens):
    """GET /api/jobs/<id>/events: the job's own events from the store, each with its seq; `last`
    is what to ask after next time, `next` the following page while more are stored."""
    jid = new_job(app, tokens["alice"], name="events")
    assert app.request("DELETE", f"/api/jobs/{jid}", token=tokens["alice"])[0] == 200
    events = lambda query="": app.get(f"/api/jobs/{jid}/events{query}")[1]
    wait(lambda: {"job_submit", "job_cancel"} <= {e["kind"] for e in events()["events"]}, 10,
         "the job's submission and cancellation in the store", events)
    every = events()
    rows, seqs = every["events"], [e["seq"] for e in every["events"]]
    assert seqs == sorted(set(seqs)) and [e["time"] for e in rows] == sorted(e["time"] for e in rows), rows
    assert every["count"] == len(rows) and every["last"] == seqs[-1] and every["next"] is None, every
    assert every["after"] == 0 and every["limit"] == 100 and set(rows[0]) == {"seq", "time", "kind", "node", "detail"}
    page, pages = events("?limit=1"), 1
    got = page["events"]
    while page["next"]:
        page = app.get(page["next"])[1]
        got, pages = got + page["events"], pages + 1
    assert got == rows and pages == len(rows), (got, rows)
    assert events(f"?after={seqs[0]}")["events"] == rows[1:]
    nothing = events(f"?after={seqs[-1]}")
    assert nothing["events"] == [] and nothing["last"] == seqs[-1] and nothing["next"] is None, nothing
    theirs = wait(lambda: app.get("/api/jobs/S1/events")[1].get("events"), 30,
                  "the replayed job S1 registered, with its events (seen: not yet, under load)")
    assert theirs and not {e["seq"] for e in theirs} & set(seqs), "another job's events are its own"


# ---- 3. no write without a login -----------------------------------------------------------

def _bad_tokens(app) -> dict[str, str]:
    key = server_key(app)
    good = app.token("alice")
    return {
        "garbage": "garbage",
        "tampered": good[:-2] + ("AA" if not good.endswith("AA") else "BB"),
        "other-key": signed_token(app, "not the server's key", "alice"),
        "unknown-user": signed_token(app, key, "mallory"),
        "expired": signed_token(app, key, "alice", age_s=TOKEN_TTL_S + 3600),
    }


def test_writes_without_a_token_are_401_with_a_challenge(app, tokens):
    victim = new_job(app, tokens["bob"], name="victim")
    _, before = app.get("/api/jobs")
    for method, path, body in [("POST", "/api/jobs", {**VALID, "name": "anon"}),
                               ("DELETE", f"/api/jobs/{victim}", None),
                               ("POST", "/api/replay/pause", None)]:
        status, hdrs, resp = call(app, method, path, body)
        assert status == 401, (method, path, resp)
        assert hdrs["WWW-Authenticate"].startswith("Bearer"), (method, path)
        status, _, resp = call(app, method, path, body, headers={"Authorization": "Basic YWxpY2U6eA=="})
        assert status == 401, (method, path, "basic auth", resp)
    _, after = app.get("/api/jobs")
    assert after["count"] == before["count"]
    assert job_state(app, victim) not in ("cancelled",) and stored_state(app, victim) != "cancelled"
    assert app.get("/api/health")[1]["replay"] == "running"
    app.request("DELETE", f"/api/jobs/{victim}", token=tokens["bob"])


@pytest.mark.parametrize("kind", ["garbage", "tampered", "other-key", "unknown-user", "expired"])
def test_writes_with_a_bad_token_are_401(app, tokens, kind):
    bad = _bad_tokens(app)[kind]
    victim = new_job(app, tokens["alice"], name=f"victim of {kind}")
    _, before = app.get("/api/jobs")
    for method, path, body in [("POST", "/api/jobs", {**VALID, "name": f"forged {kind}"}),
                               ("DELETE", f"/api/jobs/{victim}", None),
                               ("POST", "/api/replay/pause", None)]:
        status, hdrs, resp = call(app, method, path, body, token=bad)
        assert status == 401, (kind, method, path, resp)
        assert hdrs["WWW-Authenticate"].startswith("Bearer")
    _, after = app.get("/api/jobs")
    assert after["count"] == before["count"]
    assert stored(app.db, "select id from jobs where name = ?", (f"forged {kind}",)) == []
    assert job_state(app, victim) != "cancelled" and stored_state(app, victim) != "cancelled"
    assert app.get("/api/health")[1]["replay"] == "running"
    app.request("DELETE", f"/api/jobs/{victim}", token=tokens["alice"])


def test_forging_works_only_with_the_servers_key(app):
    """The control for the test above: a fresh token signed with the server's key is alice's
    (so 'other-key', 'unknown-user' and 'expired' were refused for that reason alone)."""
    token = signed_token(app, server_key(app), "alice")
    status, body = app.request("POST", "/api/replay/pause", token=token)
    assert status == 403, body     # known as alice, who may not pause: not 401


def test_token_endpoint(app):
    status, body = app.request("POST", "/api/token", {"username": "alice", "password": password("alice")})
    assert status == 200, body
    assert body["token"] and body["token_type"] == "Bearer" and body["user"] == "alice" and body["role"] == "user"
    assert body["expires_in"] == TOKEN_TTL_S
    for creds in [{"username": "alice", "password": "wrong-password"},
                  {"username": "alice", "password": password("bob")},
                  {"username": "nobody", "password": password("nobody")},
                  {"username": "alice"}, {}]:
        status, hdrs, body = call(app, "POST", "/api/token", creds)
        assert status == 401, (creds, body)
        assert "token" not in body
    for raw in [b"username=alice&password=alice-password", b"not json", b"[1, 2]", b'"alice"']:
        status, body = app.request("POST", "/api/token", raw=raw)
        assert status == 400, (raw, body)


def test_non_json_job_is_400(app, tokens):
    _, before = app.get("/api/jobs?owner=alice")       # the job set's own jobs keep arriving
    for raw in [b"name=x&min_nodes=1", b"{not json", b"[1, 2, 3]", b'"a job"', b"null"]:
        status, body = app.request("POST", "/api/jobs", raw=raw, token=tokens["alice"])
        assert status == 400, (raw, body)
    assert app.get("/api/jobs?owner=alice")[1]["count"] == before["count"]


# ---- 4. who may cancel, who may pause ------------------------------------------------------

def test_cancel_rules(app, tokens):
    job = new_job(app, tokens["alice"], name="alice's to keep")

    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["bob"])
    assert status == 403, body
    assert "alice" in body["error"]
    assert job_state(app, job) in ("queued", "running") and stored_state(app, job) in ("queued", "running")

    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["alice"])
    assert status == 200, body
    assert body["id"] == job
    assert stored_state(app, job) == "cancelled"          # durable as soon as it is answered
    assert wait(lambda: job_state(app, job) == "cancelled", 6.0, period=0.1, fail=False), job_state(app, job)
    assert app.get(f"/api/jobs/{job}")[1]["nodes"] == 0

    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["alice"])
    assert status == 409, body
    assert "already ended" in body["error"]

    status, body = app.request("DELETE", "/api/jobs/u-deadbeef", token=tokens["alice"])
    assert status == 404, body


def test_staff_may_cancel_anyones_job(app, tokens):
    job = new_job(app, tokens["bob"], name="bob's")
    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["staff1"])
    assert status == 200, body
    assert stored_state(app, job) == "cancelled"
    assert wait(lambda: job_state(app, job) == "cancelled", 6.0, period=0.1, fail=False)
    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["staff1"])
    assert status == 409, body


def test_a_cancelled_job_is_resubmitted_as_a_new_job_of_its_owner(app, tokens):
    """POST /api/jobs/<id>/resubmit in a replay: the owner's or staff's, only once the job has
    failed or been cancelled; the new job (201, Location) is stored at once, names the old one
    and continues from its samples."""
    job = new_job(app, tokens["alice"], name="alice's to continue")
    status, body = app.request("POST", f"/api/jobs/{job}/resubmit", token=tokens["alice"])
    assert status == 409 and "only a failed or cancelled job" in body["error"], body
    assert app.request("DELETE", f"/api/jobs/{job}", token=tokens["alice"])[0] == 200
    assert app.request("POST", f"/api/jobs/{job}/resubmit", token=tokens["bob"])[0] == 403
    assert app.request("POST", f"/api/jobs/{job}/resubmit")[0] == 401
    assert app.request("POST", "/api/jobs/u-deadbeef/resubmit", token=tokens["alice"])[0] == 404
    status, hdrs, body = call(app, "POST", f"/api/jobs/{job}/resubmit", token=tokens["staff1"])
    assert status == 201, body
    new = body["id"]
    assert hdrs["Location"] == f"/api/jobs/{new}" and new != job and body["owner"] == "alice", body
    assert body["resubmitted_from"] == job and stored_state(app, new) in ("queued", "running")
    one = app.get(f"/api/jobs/{new}")[1]
    assert one["resubmitted_from"] == job and one["name"] == "alice's to continue", one
    assert one["samples_done"] >= app.get(f"/api/jobs/{job}")[1]["samples_done"]
    assert job_state(app, job) == "cancelled"
    app.request("DELETE", f"/api/jobs/{new}", token=tokens["alice"])


def test_a_user_cannot_cancel_the_job_sets_jobs(app, tokens):
    # S1 arrives 60 simulated seconds after the start (half a second at 120x)
    assert wait(lambda: app.get("/api/jobs/S1")[0] == 200, 6.0, period=0.1, fail=False), app.get("/api/health")
    status, body = app.request("DELETE", "/api/jobs/S1", token=tokens["alice"])
    assert status == 403, body
    assert job_state(app, "S1") == "running"


def test_a_cancellation_while_running_is_answered_as_done(app, tokens):
    """The 200 to a DELETE reports the job cancelled, and a second DELETE straight after is
    409, even while the replay is running (not only once the next tick has happened)."""
    assert app.get("/api/health")[1]["replay"] == "running"
    job = new_job(app, tokens["alice"], name="cancel at once")
    status, body = app.request("DELETE", f"/api/jobs/{job}", token=tokens["alice"])
    assert status == 200, body
    again, body2 = app.request("DELETE", f"/api/jobs/{job}", token=tokens["alice"])
    assert body["state"] == "cancelled", body
    assert again == 409, body2


def test_only_staff_may_pause_the_replay(app, tokens):
    for user in ("alice", "bob"):
        status, body = app.request("POST", "/api/replay/pause", token=tokens[user])
        assert status == 403, body
    assert app.get("/api/health")[1]["replay"] == "running"
    status, body = app.request("POST", "/api/replay/pause", token=tokens["staff1"])
    try:
        assert status == 200 and body["status"] == "paused", body
        assert app.get("/api/health")[1]["replay"] == "paused"
        t0 = app.get("/api/health")[1]["time"]
        time.sleep(0.7)
        assert app.get("/api/health")[1]["time"] == t0      # paused means paused
        status, body = app.request("POST", "/api/replay/resume", token=tokens["alice"])
        assert status == 403, body
    finally:
        status, body = app.request("POST", "/api/replay/resume", token=tokens["staff1"])
    assert status == 200 and body["status"] == "running", body
    assert wait(lambda: app.get("/api/health")[1]["time"] > t0, 6.0, period=0.1, fail=False)


def test_replay_commands_refuse_bad_input(app, tokens):
    staff = tokens["staff1"]
    status, body = app.request("POST", "/api/replay/rewind", token=staff)
    assert status == 404, body
    for speed_body in [{"speed": 0}, {"speed": -5}, {"speed": 1e9}, {"speed": "fast"}, {}]:
        status, body = app.request("POST", "/api/replay/speed", speed_body, token=staff)
        assert status == 422, (speed_body, body)
    status, body = app.request("POST", "/api/replay/speed", raw=b'{"speed": NaN}', token=staff)
    assert status == 422, body
    status, body = app.request("POST", "/api/replay/speed", {"speed": 600}, token=tokens["alice"])
    assert status == 403, body
    assert app.get("/api/cluster?nodes=0")[1]["speed"] == 120
    status, body = app.request("POST", "/api/replay/speed", [600], token=staff)
    assert status in (400, 422), body       # a JSON list is not a settings object


def test_staff_may_change_the_speed(app, tokens):
    status, body = app.request("POST", "/api/replay/speed", {"speed": 240}, token=tokens["staff1"])
    try:
        assert status == 200 and body["speed"] == 240, body
        assert app.get("/api/cluster?nodes=0")[1]["speed"] == 240
    finally:
        status, body = app.request("POST", "/api/replay/speed", {"speed": 120}, token=tokens["staff1"])
    assert status == 200 and body["speed"] == 120, body


# ---- 4b. what the OpenAPI document promises (schemathesis found these; tests/test_api_fuzz.py) --

def test_a_method_an_api_route_does_not_take_is_a_405_naming_the_ones_it_does(app):
    """Dash's catch-all GET route matches every path: without the API's own routing a GET on a
    POST-only route got the dashboard's page, and OPTIONS and 405 named GET in Allow."""
    for method, path, allow in [("OPTIONS", "/api/token", "OPTIONS, POST"),
                                ("OPTIONS", "/api/replay/pause", "OPTIONS, POST"),
                                ("OPTIONS", "/api/jobs/J1", "DELETE, GET, HEAD, OPTIONS"),
                                ("OPTIONS", "/api/jobs", "GET, HEAD, OPTIONS, POST")]:
        status, hdrs, body = call(app, method, path)
        assert (status, hdrs["Allow"]) == (200, allow), (method, path, status, hdrs["Allow"])
    for method, path, allow in [("GET", "/api/token", "OPTIONS, POST"), ("GET", "/api/replay/pause", "OPTIONS, POST"),
                                ("GET", "/api/nodes/d30n01/reclaim", "OPTIONS, POST"),
                                ("PUT", "/api/jobs", "GET, HEAD, OPTIONS, POST")]:
        status, hdrs, body = call(app, method, path)
        assert (status, hdrs["Allow"]) == (405, allow), (method, path, status, body)
        assert hdrs["Content-Type"] == "application/json" and body["error"], body
    status, hdrs, body = call(app, "GET", "/api/no-such-route")
    assert status == 404 and hdrs["Content-Type"] == "application/json", (status, body)
    status, hdrs, body = call(app, "GET", "/jobs")                    # the dashboard's own pages are untouched
    assert status == 200 and hdrs["Content-Type"].startswith("text/html"), status


@pytest.mark.parametrize("query, expected", [
    ("/api/jobs?offset=2147483648", 400), ("/api/jobs?limit=%C2%B2", 400),     # "²".isdigit(): was a 500
    ("/api/jobs?limit=%D9%A1", 400), ("/api/jobs?offset=", 400), ("/api/jobs?limit=1" + "0" * 5000, 400),
    ("/api/jobs?state=", 422), ("/api/jobs?state=queued&state=done", 400), ("/api/jobs?owner=a&owner=b", 400),
    ("/api/jobs?limit=5&limit=6", 400), ("/api/cluster?nodes=yes", 400), ("/api/cluster?nodes=0&nodes=1", 400),
    ("/api/jobs/S1/logs?lines=2&lines=3", 400), ("/api/jobs/S1/logs?lines=0", 400),
    ("/api/jobs/S1/events?limit=0", 400), ("/api/jobs/S1/events?limit=1001", 400), ("/api/jobs/S1/events?after=-1", 400),
    ("/api/jobs/S1/events?after=1&after=2", 400), ("/api/jobs/S1/events?after=9223372036854775808", 400)])
def test_a_query_argument_the_document_does_not_allow_is_refused(app, tokens, query, expected):
    status, body = app.get(query, token=tokens["staff1"])
    assert status == expected and body["error"], (query, status, body)


def test_an_offset_past_the_last_job_is_an_empty_last_page(app):
    status, body = app.get("/api/jobs?offset=2147483647")
    assert status == 200 and body["jobs"] == [] and body["next"] is None and body["total"] >= 2, body
    status, body = app.get("/api/jobs?limit=0")
    assert status == 200 and body["count"] == 0 and body["next"] is None, body   # limit 0 never gets further


def test_a_body_the_document_refuses_is_a_400(app, tokens):
    """Pause, resume and the node commands take no body or a JSON object (ignored); speed takes a
    JSON object whose speed is a number: a NUL byte, a list or a string speed is refused."""
    staff = tokens["staff1"]
    for path, raw in [("/api/replay/pause", b"\x00"), ("/api/replay/pause", b"[]"), ("/api/replay/resume", b"1"),
                      ("/api/replay/speed", b"\x00"), ("/api/nodes/d30n01/reclaim", b"\x00")]:
        status, body = app.request("POST", path, raw=raw, token=staff)
        assert status == 400 and body["error"], (path, raw, status, body)
    assert app.get("/api/health")[1]["replay"] == "running"
    for speed in [True, "600", None]:
        status, body = app.request("POST", "/api/replay/speed", {"speed": speed}, token=staff)
        assert status == 422, (speed, body)
    status, body = app.request("POST", "/api/replay/speed", raw=b'{"speed": 1' + b"0" * 400 + b"}", token=staff)
    assert status == 422, body          # float() of a 400-digit int overflows: was a 500
    assert app.get("/api/cluster?nodes=0")[1]["speed"] == 120


# ---- 5b. /metrics --------------------------------------------------------------------------

def test_metrics_agree_with_the_api(app, tokens):
    mine = new_job(app, tokens["alice"], name="metrics probe")
    assert wait(lambda: app.get(f"/api/jobs/{mine}")[1]["samples_per_second"] > 0, 6.0, period=0.1, fail=False)
    status, body = app.request("POST", "/api/replay/pause", token=tokens["staff1"])
    assert status == 200, body
    try:   # paused: /api/cluster, /api/jobs and /metrics all read the same snapshot
        _, cluster = app.get("/api/cluster")
        _, jobs = app.get("/api/jobs")
        status, hdrs, text = call(app, "GET", "/metrics")
    finally:
        app.request("POST", "/api/replay/resume", token=tokens["staff1"])
        app.request("DELETE", f"/api/jobs/{mine}", token=tokens["alice"])
    assert status == 200
    assert hdrs["Content-Type"].startswith("text/plain")
    fams = metric_families(text)
    kpis = cluster["kpis"]

    for name, kind in [("harvest_idle_nodes", "gauge"), ("harvest_harvested_nodes", "gauge"),
                       ("harvest_idle_gpus", "gauge"), ("harvest_harvested_gpus", "gauge"),
                       ("harvest_job_samples_per_second", "gauge"), ("harvest_solver_seconds", "histogram"),
                       ("harvest_events", "counter"), ("harvest_jobs", "gauge")]:
        assert name in fams, f"{name} missing from /metrics"
        assert fams[name].type == kind, (name, fams[name].type)

    def one(name):
        (sample,) = fams[name].samples
        return sample.value

    assert kpis["idle"] > 0 and kpis["harvested"] > 0
    assert one("harvest_idle_nodes") == kpis["idle"]
    assert one("harvest_harvested_nodes") == kpis["harvested"]
    # Summit's nodes have 6 GPUs each: every node says so, and the GPU gauges count them
    assert {n["slots"] for n in cluster["nodes"]} == {6}
    held = [n for n in cluster["nodes"] if n["state"] == "harvested"]
    assert one("harvest_harvested_gpus") == kpis["harvested_gpus"] == 6 * len(held) == 6 * kpis["harvested"]
    assert one("harvest_idle_gpus") == kpis["idle_gpus"] == 6 * kpis["idle"]
    for j in jobs["jobs"]:
        assert j["slots"] == 6 and j["ranks"] == 6 * j["nodes"], j
        assert j["ranks"] == 6 * sum(n["job"] == j["id"] for n in held), j
    assert math.isclose(one("harvest_samples_per_second"), kpis["samples_per_second"])

    per_job = {s.labels["job"]: s.value for s in fams["harvest_job_samples_per_second"].samples}
    running = {j["id"]: j["samples_per_second"] for j in jobs["jobs"] if j["state"] == "running"}
    assert per_job == pytest.approx(running)
    assert per_job[mine] > 0

    by_state = {s.labels["state"]: s.value for s in fams["harvest_jobs"].samples}
    assert set(by_state) == {"queued", "running", "done", "failed", "cancelled"}
    for state in by_state:
        assert by_state[state] == sum(j["state"] == state for j in jobs["jobs"]), state
    assert by_state["running"] == kpis["running"]

    events = {s.labels["kind"]: s.value for s in fams["harvest_events"].samples
              if s.name == "harvest_events_total"}
    assert events == {k: float(v) for k, v in kpis["events_by_kind"].items()}
    assert events["job_submit"] >= 3     # the job set's two and ours

    hist = fams["harvest_solver_seconds"].samples
    buckets = [(s.labels["le"], s.value) for s in hist if s.name == "harvest_solver_seconds_bucket"]
    assert buckets[-1][0] == "+Inf" and len(buckets) > 5
    bounds = [float(le) for le, _ in buckets]
    counts = [n for _, n in buckets]
    assert bounds == sorted(bounds) and counts == sorted(counts)
    count = next(s.value for s in hist if s.name == "harvest_solver_seconds_count")
    total = next(s.value for s in hist if s.name == "harvest_solver_seconds_sum")
    assert counts[-1] == count == kpis["solves"] > 0
    assert total >= 0


def test_the_replay_still_advances_after_all_this(app):
    """Whatever the requests above did, the replay kept ticking and logged no failed tick."""
    t0 = app.get("/api/health")[1]["time"]
    assert wait(lambda: app.get("/api/health")[1]["time"] > t0 + 60, 6.0, period=0.1, fail=False), "the replay is stuck"
    log = app.output()
    assert "raised an exception" not in log, log[-3000:]


# ---- 6. python -m app.users and Users.parse ------------------------------------------------

def users_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.users", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_users_add_stores_a_hash_that_checks(tmp_path):
    path = tmp_path / "users.json"
    secret = "carol's long secret"
    r = users_cli("add", "carol", "--role", "staff", "--file", str(path), "--password-stdin", stdin=secret + "\n")
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert secret not in text and "carol" in text
    assert path.stat().st_mode & 0o777 == 0o600
    (row,) = json.loads(text)["users"]
    assert row["name"] == "carol" and row["role"] == "staff" and row["password_hash"] != secret
    users = Users.parse(text, str(path))
    user = users.check("carol", secret)
    assert user is not None and user.name == "carol" and user.is_staff
    assert users.check("carol", "carol's long secreT") is None
    assert users.check("carol", "") is None
    assert users.check("nobody", secret) is None

    # a second user leaves the first one as it was
    r = users_cli("add", "dave", "--file", str(path), "--password-stdin", stdin="dave-password\n")
    assert r.returncode == 0, r.stderr
    users = Users.parse(path.read_text(), str(path))
    assert users.check("carol", secret).role == "staff"
    assert users.check("dave", "dave-password").role == "user"


def test_users_add_refuses_a_short_password_and_leaves_the_file(tmp_path):
    path = write_users(tmp_path / "users.json")
    before = path.read_bytes()
    r = users_cli("add", "erin", "--file", str(path), "--password-stdin", stdin="short\n")
    assert r.returncode == 2
    assert "error:" in r.stderr and "8 characters" in r.stderr
    assert path.read_bytes() == before
    r = users_cli("add", "alice", "--file", str(path), "--password-stdin", stdin="\n")
    assert r.returncode == 2 and path.read_bytes() == before
    assert Users.parse(path.read_text(), "f").check("alice", password("alice")) is not None


def test_users_add_refuses_a_broken_file(tmp_path):
    path = tmp_path / "users.json"
    path.write_text('{"users": [{"name": "x", "role": "admin", "password_hash": "h"}]}')
    before = path.read_bytes()
    r = users_cli("add", "frank", "--file", str(path), "--password-stdin", stdin="frank-password\n")
    assert r.returncode == 2 and "error:" in r.stderr and "role" in r.stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ('["alice"]', 'expected {"users"'),
    ('{"people": []}', 'expected {"users"'),
    ('{"users": [{"name": "a", "role": "admin", "password_hash": "h"}]}', "role must be staff or user"),
    ('{"users": [{"name": "a", "password_hash": "h"}, {"name": "a", "password_hash": "h2"}]}', "listed twice"),
    ('{"users": [{"name": "a"}]}', "needs name and password_hash"),
    ('{"users": ["a"]}', "needs name and password_hash"),
    ('{"users": [{"name": ["a"], "password_hash": "h"}]}', "name"),
    ('{"users": [{"name": "a", "password_hash": 5}]}', "password_hash"),
], ids=["bad-json", "not-an-object", "no-users-key", "unknown-role", "duplicate", "no-hash", "row-not-object",
        "name-not-text", "hash-not-text"])
def test_users_parse_refuses_a_bad_file(text, message):
    with pytest.raises(ValueError) as e:
        Users.parse(text, "users.json")
    assert str(e.value).startswith("users.json: ")
    assert message in str(e.value)


# ---- 7. python -m app refuses bad input ----------------------------------------------------

@pytest.mark.parametrize("case", ["hours-negative", "hours-nan", "unknown-scenario-key", "speed-zero",
                                  "nodes-zero", "missing-trace", "bad-users-file", "gpus-zero"])
def test_app_refuses_bad_input_clearly(tmp_path, case):
    users = write_users(tmp_path / "users.json")
    extra = {
        "hours-negative": ["--hours", "-1"],
        "hours-nan": ["--hours", "nan"],
        "unknown-scenario-key": ["--scenario", str(tmp_path / "scenario.json")],
        "speed-zero": ["--speed", "0"],
        "nodes-zero": ["--nodes", "0"],
        "missing-trace": ["--trace", str(tmp_path / "no-such-trace.csv")],
        "bad-users-file": ["--users", str(tmp_path / "bad-users.json")],
        "gpus-zero": ["--gpus-per-node", "0"],
    }[case]
    (tmp_path / "scenario.json").write_text(json.dumps({"hours": 2, "bogus": 1}))
    (tmp_path / "bad-users.json").write_text('{"users": [{"name": "x", "role": "root", "password_hash": "h"}]}')
    db = tmp_path / "store" / "harvest.db"
    db.parent.mkdir()
    cmd = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(free_port()), "--db", str(db),
           "--users", str(users), *extra]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=8)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"python -m app {' '.join(extra)} did not refuse: it was still running after 8 s\n{out[-2000:]}")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert not list(db.parent.iterdir()), "a refused start leaves nothing beside the store"
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert {"hours-negative": "hours", "unknown-scenario-key": "bogus", "speed-zero": "speed",
            "nodes-zero": "nodes", "missing-trace": "no-such-trace.csv", "bad-users-file": "role",
            "hours-nan": "hours", "gpus-zero": "--gpus-per-node: must be a whole number from 1 to 1024"}[case] \
        in errors[0]
    assert sorted(p.name for p in db.parent.iterdir()) == [], "a refused start left a store behind"
