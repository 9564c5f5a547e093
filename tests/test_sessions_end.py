"""Sessions that end (issue 57, item 4): a browser login is a server-side session whose id alone
rides in the signed cookie, so logout, a password change, the idle and the absolute lifetime end
it for good (a replayed cookie is refused, after a restart too); pages and API answers are not
cached; a failed login leaves one log line, its user name escaped, never its password."""
from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from werkzeug.security import generate_password_hash

from app.auth import RELOAD_CHECK_S, User, Users
from app.signin import Gate, LoginPolicy, Refused
from app.throttle import Limit
from tests.support.formlogin import browser_login, send
from tests.support.server import ROOT, password, start_app
from tests.support.waiting import wait

JOB = {"name": "session probe", "min_nodes": 1, "max_nodes": 2, "total_samples": 1e12, "curve": "1:100, 2:200"}
LIVE = ("--dispatch", "simulated", "--local-nodes", "2")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("sessions"), "--fresh", *LIVE)
    yield proc
    proc.stop()


def known_as(app, browser: dict) -> bool:
    """Whether the server takes this cookie as a login (a missing job: 404, not 401)."""
    status, _, body = send(app, "DELETE", "/api/jobs/no-such-job", headers={**browser, "Origin": app.url})
    assert status in (401, 404), (status, body)
    return status == 404


def register(app, browser: dict) -> int:
    status, _, _ = send(app, "POST", "/api/jobs", json.dumps(JOB).encode(),
                        {**browser, "Origin": app.url, "Content-Type": "application/json"})
    return status


def logout(app, browser: dict) -> None:
    status, _, body = send(app, "POST", "/logout", headers={**browser, "Origin": app.url})
    assert status == 303, body[:300]


def stored_sessions(app) -> dict[str, int]:
    """Rows of the server-side session table per user, read from its file."""
    path = Path(str(app.db) + ".sessions")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return dict(conn.execute("SELECT user, count(*) FROM sessions GROUP BY user").fetchall())


def users_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.users", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_a_cookie_replayed_after_logout_registers_nothing(app):
    browser = browser_login(app, "bob", password("bob"))
    other = browser_login(app, "bob", password("bob"))            # bob's second browser
    assert register(app, browser) == 201
    logout(app, browser)
    assert not known_as(app, browser)
    assert register(app, browser) == 401
    assert known_as(app, other)                                  # only that browser logged out
    assert stored_sessions(app).get("bob") == 1


def test_a_logout_stays_a_logout_across_a_restart(tmp_path):
    first = start_app(tmp_path, "--fresh", *LIVE)
    try:
        gone, kept = browser_login(first, "alice", password("alice")), browser_login(first, "alice", password("alice"))
        logout(first, gone)
    finally:
        first.stop()
    again = start_app(tmp_path, *LIVE, db=first.db, users=tmp_path / "users.json")
    try:
        assert known_as(again, kept)                              # a login survives the restart...
        assert not known_as(again, gone)                          # ...and so does a logout
        assert register(again, gone) == 401
    finally:
        again.stop()


def test_a_password_change_ends_every_session_of_that_user_for_good(app):
    users_file = app.db.parent / "users.json"
    before = users_file.read_bytes()
    alice = [browser_login(app, "alice", password("alice")) for _ in range(2)]
    bob = browser_login(app, "bob", password("bob"))
    try:
        r = users_cli("passwd", "alice", "--file", str(users_file), "--password-stdin", stdin="alice-new-password\n")
        assert r.returncode == 0, r.stderr
        assert wait(lambda: not known_as(app, alice[0]), 5.0, fail=False)
        assert not known_as(app, alice[1])
        assert known_as(app, bob)
        assert "alice" not in stored_sessions(app)
    finally:
        users_file.write_bytes(before)                            # the old password back (a restored file)
    time.sleep(RELOAD_CHECK_S + 0.2)                              # few tries: each failed one is throttled
    wait(lambda: app.request("POST", "/api/token", {"username": "alice", "password": password("alice")})[0] == 200,
         4.0, "the old users file read again", period=1.0)
    assert not any(known_as(app, b) for b in alice)               # revoked sessions do not come back


def test_a_session_cannot_outlive_its_idle_or_absolute_lifetime(tmp_path):
    app = start_app(tmp_path, "--fresh", *LIVE, "--session-idle", "2", "--session-max", "5")
    try:
        busy, idle = browser_login(app, "bob", password("bob")), browser_login(app, "alice", password("alice"))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:
            assert known_as(app, busy)                             # kept in use: lives on...
            time.sleep(0.4)
        again = browser_login(app, "bob", password("bob"))
        assert stored_sessions(app) == {"bob": 2}                 # alice's, unused for 2 s, purged at a login
        assert not known_as(app, idle)
        assert wait(lambda: not known_as(app, busy), 3.0, fail=False)   # ...but not past 5 s
        assert time.monotonic() - t0 >= 4.5
        assert known_as(app, again) and stored_sessions(app) == {"bob": 1}
    finally:
        app.stop()


def test_a_user_holds_a_bounded_number_of_sessions(app):
    from app.sessions import MAX_PER_USER
    browsers = [browser_login(app, "staff1", password("staff1")) for _ in range(MAX_PER_USER + 5)]
    assert stored_sessions(app)["staff1"] == MAX_PER_USER
    assert known_as(app, browsers[-1]) and not known_as(app, browsers[0])


def test_pages_and_api_answers_are_not_cached(app):
    browser = browser_login(app, "bob", password("bob"))
    token = app.token("bob")
    for path, headers in [("/jobs", browser), ("/", browser), ("/api/jobs", {"Authorization": f"Bearer {token}"}),
                          ("/api/health", {}), ("/login", {})]:
        status, got, _ = send(app, "GET", path, headers=headers)
        assert status == 200 and got.get("Cache-Control") == "no-store", (path, status, got)
    status, got, _ = send(app, "POST", "/login", urllib.parse.urlencode({"username": "bob", "password": "x"}).encode(),
                          {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 401 and got.get("Cache-Control") == "no-store"
    status, got, _ = send(app, "GET", "/assets/style.css")
    assert status == 200 and "no-store" not in got.get("Cache-Control", "")     # static files may be cached


FORGED = "eve\n2099-01-01 00:00:00 INFO app.session: staff1\x1b[2K"


def gate_users() -> Users:
    ph = generate_password_hash("right-password", method="pbkdf2:sha256:1000")
    return Users({"eve": User("eve", "user", ph)}, "test")


def test_a_failed_login_is_one_escaped_line_without_the_password(caplog):
    caplog.set_level(logging.INFO)
    gate = Gate(LoginPolicy(per_user=Limit(1, 60.0)))
    assert gate.login(gate_users(), FORGED, "hunter2-secret", "10.0.0.7") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0] and "\x1b" not in lines[0], lines
    assert repr(FORGED) in lines[0] and "10.0.0.7" in lines[0]
    assert "hunter2" not in caplog.text
    caplog.clear()
    with pytest.raises(Refused):
        gate.login(gate_users(), FORGED, "hunter2-secret", "10.0.0.7")      # throttled: logged too
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and repr(FORGED) in lines[0] and "throttled" in lines[0], lines
    assert "hunter2" not in caplog.text
    caplog.clear()
    assert gate.login(gate_users(), "eve", "right-password", "10.0.0.8") is not None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_servers_log_has_one_line_per_failed_token_request(app):
    status, _ = app.request("POST", "/api/token", {"username": "mallory\nforged line", "password": "pw-never-logged"})
    assert status == 401
    lines = wait(lambda: [ln for ln in app.output().splitlines() if "mallory" in ln], 5.0, "the failed login logged")
    assert len(lines) == 1 and repr("mallory\nforged line") in lines[0], lines
    assert "forged line" not in app.output().replace(repr("mallory\nforged line"), "")
    assert "pw-never-logged" not in app.output()


def test_a_long_name_is_cut_in_the_log(caplog):
    caplog.set_level(logging.INFO)
    assert Gate().login(gate_users(), "x" * 100_000, "hunter2-secret", "10.0.0.9") is None
    [line] = [r.getMessage() for r in caplog.records]
    assert len(line) < 200 and line.count("x") < 100


@pytest.mark.parametrize("value", ["0", "nan", "-1"])
def test_a_bad_session_max_is_refused_by_name(tmp_path, value):
    r = subprocess.run([sys.executable, "-m", "app", "--db", str(tmp_path / "h.db"), "--session-max", value],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--session-max: must be positive" in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "h.db").exists()
