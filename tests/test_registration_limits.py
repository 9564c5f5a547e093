"""Registrations have a bound (issue 57, item 5): a user registers at most N jobs a minute and M a
day, every registration counted (a register-then-cancel loop made 634 jobs in 60 s while
--user-max-jobs counted only queued and running ones); one more is a 429 with Retry-After and
nothing stored; staff are exempt; the day's count survives a restart. Real servers, real store."""
from __future__ import annotations

import sqlite3

import pytest

from core.registrations import RegistrationLimits, Registrations, TooManyRegistrations
from tests.support.server import start_app

SPEC = {"min_nodes": 1, "max_nodes": 2, "total_samples": 1e12,
        "curve": {"nodes": [1, 2], "samples_per_second": [10.0, 19.0]}}


def jobs_stored(db) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("select count(*) from jobs").fetchone()[0]


def register(app, token: str, name: str):
    status, body = app.request("POST", "/api/jobs", {**SPEC, "name": name}, token=token)
    return status, body


def raw_register(app, token: str, name: str):
    """The status and the Retry-After header (urllib, to read the header)."""
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(app.url + "/api/jobs", data=json.dumps({**SPEC, "name": name}).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


@pytest.fixture(scope="module")
def per_minute(tmp_path_factory):
    a = start_app(tmp_path_factory.mktemp("per-minute"), "--dispatch", "simulated", "--local-nodes", "4",
                  "--tick", "0.1", "--user-jobs-per-minute", "3", "--user-jobs-per-day", "0")
    yield a
    a.stop()


def test_more_than_the_per_minute_limit_is_a_429_with_retry_after_and_nothing_stored(per_minute):
    app = per_minute
    alice = app.token("alice")
    for k in range(3):
        status, body = register(app, alice, f"a{k}")
        assert status == 201, body
        assert app.request("DELETE", f"/api/jobs/{body['id']}", token=alice)[0] == 200
    before = jobs_stored(app.db)
    status, headers, body = raw_register(app, alice, "a3")
    assert status == 429, body
    assert 1 <= int(headers["Retry-After"]) <= 60, headers
    assert "3 job(s) in the last minute" in body["error"], body
    assert jobs_stored(app.db) == before, "a refused registration stores nothing"
    assert app.get("/api/jobs?owner=alice")[1]["total"] == 3
    assert register(app, app.token("bob"), "bob's")[0] == 201, "one user's limit is theirs alone"


def test_a_resubmission_is_a_registration_too(per_minute):
    app = per_minute
    bob = app.token("bob")
    ids = []
    for k in range(2):      # bob registered one above: three in all
        status, body = register(app, bob, f"b{k}")
        assert status == 201, body
        ids.append(body["id"])
        app.request("DELETE", f"/api/jobs/{body['id']}", token=bob)
    before = jobs_stored(app.db)
    status, body = app.request("POST", f"/api/jobs/{ids[0]}/resubmit", token=bob)
    assert status == 429, body
    assert jobs_stored(app.db) == before


def test_staff_are_exempt(per_minute):
    app = per_minute
    staff = app.token("staff1")
    for k in range(5):
        status, body = register(app, staff, f"s{k}")
        assert status == 201, body
        app.request("DELETE", f"/api/jobs/{body['id']}", token=staff)


def test_a_register_then_cancel_loop_meets_the_daily_cap_which_survives_a_restart(tmp_path):
    """--user-max-jobs 1 never refuses the loop (each job is cancelled before the next); the day's
    cap of 5 does, and still does after a restart on the same store."""
    args = ("--dispatch", "simulated", "--local-nodes", "4", "--tick", "0.1", "--user-max-jobs", "1",
            "--user-jobs-per-minute", "0", "--user-jobs-per-day", "5")
    app = start_app(tmp_path / "a", *args)
    try:
        alice = app.token("alice")
        statuses = []
        for k in range(8):
            status, body = register(app, alice, f"loop{k}")
            statuses.append(status)
            if status == 201:
                assert app.request("DELETE", f"/api/jobs/{body['id']}", token=alice)[0] == 200
        assert statuses == [201] * 5 + [429] * 3, statuses
        status, headers, body = raw_register(app, alice, "again")
        assert status == 429 and "5 job(s) in the last 24 hours" in body["error"], body
        assert 86_000 < int(headers["Retry-After"]) <= 86_400, headers
        stored = jobs_stored(app.db)
        assert stored == 5
    finally:
        app.stop()
    app = start_app(tmp_path / "a", *args, db=app.db)
    try:
        status, body = register(app, app.token("alice"), "after restart")
        assert status == 429, body
        assert jobs_stored(app.db) == stored
        assert register(app, app.token("staff1"), "staff")[0] == 201
    finally:
        app.stop()


def test_the_windows_forget_as_they_age_and_a_seed_places_each_registration_in_its_time():
    now = [1_000_000.0]
    r = Registrations(RegistrationLimits(per_minute=2, per_day=3), clock=lambda: now[0])
    r.seed([("alice", now[0] - 86_500), ("alice", now[0] - 3600), ("", now[0])], now=now[0])
    assert r.count("alice") == (0, 1), "older than a day is not counted, nor a job set's job"
    r.record("alice", staff=False)
    r.record("alice", staff=False)
    with pytest.raises(TooManyRegistrations) as e:
        r.check("alice", staff=False)
    assert e.value.retry_after == 60
    r.check("alice", staff=True)
    now[0] += 61
    with pytest.raises(TooManyRegistrations) as e:        # the minute is over, the day is full
        r.check("alice", staff=False)
    assert e.value.retry_after == 86_400 - 3600 - 61
    r = Registrations(RegistrationLimits(per_minute=0, per_day=0), clock=lambda: now[0])
    for _ in range(100):
        r.record("alice", staff=False)
    r.check("alice", staff=False)
