"""Logins that end: a password change (`python -m app.users passwd`) revokes the user's tokens
and browser sessions on a running server; a browser session unused for `--session-idle` ends;
the demo password stays the same across restarts of one store unless `--fresh`."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from app.auth import Users
from tests.support.formlogin import browser_login, send
from tests.support.server import ROOT, password, start_app
from tests.support.waiting import wait

JOB = {"name": "revocation probe", "min_nodes": 1, "max_nodes": 2, "total_samples": 1e12, "curve": "1:100, 2:200"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("revoke"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "2", "--session-idle", "3")
    yield proc
    proc.stop()


def known_as(app, headers: dict) -> bool:
    """Whether the server takes these credentials as a login (a missing job: 404, not 401)."""
    status, _, body = send(app, "DELETE", "/api/jobs/no-such-job", headers=headers)
    assert status in (401, 404), (status, body)
    return status == 404


def users_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.users", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_after_passwd_the_old_token_and_session_get_401(app):
    users_file = str(app.db.parent / "users.json")
    token, other = app.token("alice"), app.token("bob")
    browser = browser_login(app, "alice", password("alice"))
    assert app.request("POST", "/api/jobs", JOB, token=token)[0] == 201
    assert known_as(app, browser)

    r = users_cli("passwd", "alice", "--file", users_file, "--password-stdin", stdin="alice-new-password\n")
    assert r.returncode == 0, r.stderr
    assert wait(lambda: app.request("POST", "/api/jobs", JOB, token=token)[0] == 401, 5.0, fail=False)
    status, body = app.request("DELETE", "/api/jobs/no-such-job", token=token)
    assert status == 401, body
    assert not known_as(app, browser)
    assert app.request("POST", "/api/token", {"username": "alice", "password": password("alice")})[0] == 401
    status, body = app.request("POST", "/api/token", {"username": "alice", "password": "alice-new-password"})
    assert status == 200, body
    assert app.request("POST", "/api/jobs", JOB, token=body["token"])[0] == 201
    assert known_as(app, {"Authorization": f"Bearer {other}"})      # bob's token is untouched


def test_passwd_needs_an_existing_user(app, tmp_path):
    users_file = app.db.parent / "users.json"
    before = users_file.read_bytes()
    r = users_cli("passwd", "mallory", "--file", str(users_file), "--password-stdin", stdin="mallory-password\n")
    assert r.returncode == 2 and "no user mallory" in r.stderr
    assert users_file.read_bytes() == before


def test_an_idle_browser_session_ends(app):
    browser = browser_login(app, "bob", password("bob"))
    assert known_as(app, browser)
    time.sleep(3.5)
    assert not known_as(app, browser)
    assert known_as(app, browser_login(app, "bob", password("bob")))


def test_the_demo_password_is_kept_beside_the_store_unless_fresh(tmp_path):
    db = tmp_path / "harvest.db"
    users, first = Users.demo(db)
    kept = tmp_path / "harvest.db.demo"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert json.loads(kept.read_text())["password"] == first
    again, second = Users.demo(db)
    assert second == first and again.get("demo").password_hash == users.get("demo").password_hash
    assert again.check("demo", first) is not None
    fresh, third = Users.demo(db, fresh=True)
    assert third != first and fresh.check("demo", first) is None and fresh.check("demo", third) is not None
    assert [p.name for p in tmp_path.iterdir()] == ["harvest.db.demo"]     # no temporary file left
