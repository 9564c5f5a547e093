"""Login throttling: per user name and per client address, on the form (`POST /login`) and on
`POST /api/token`, against a real server; and the bound on parallel password hashing."""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse

import pytest
from werkzeug.security import generate_password_hash

from app.auth import User, Users
from app.signin import Gate, LoginPolicy, Refused
from app.throttle import FailureWindow, Limit
from tests.support.server import password, start_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("throttle"), "--fresh", "--racks", "d30",
                     "--start", "2021-02-12T19:30:00Z")
    yield proc
    proc.stop()


def post(app, path: str, body: bytes, content_type: str, source: str = "127.0.0.1",
         headers: dict | None = None) -> tuple[int, dict, str]:
    """One POST from loopback address `source` (all of 127/8 is this host), redirects not followed."""
    host, port = urllib.parse.urlsplit(app.url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type, **(headers or {})})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


def api_login(app, name: str, pw: str, source: str = "127.0.0.1"):
    return post(app, "/api/token", json.dumps({"username": name, "password": pw}).encode(),
                "application/json", source)


def form_login(app, name: str, pw: str, source: str = "127.0.0.1"):
    return post(app, "/login", urllib.parse.urlencode({"username": name, "password": pw}).encode(),
                "application/x-www-form-urlencoded", source)


@pytest.mark.parametrize("path, user, source", [(api_login, "bob", "127.0.0.2"),
                                                (form_login, "alice", "127.0.0.3")])
def test_the_sixth_failed_login_within_a_minute_is_429(app, path, user, source):
    for k in range(5):
        status, _, body = path(app, user, "wrong-password", source)
        assert status == 401, (k, body[:300])
    status, headers, body = path(app, user, "wrong-password", source)
    assert status == 429, body[:300]
    assert 1 <= int(headers["Retry-After"]) <= 60
    # throttled means not even checked: the right password waits too, from any address
    status, headers, _ = path(app, user, password(user), "127.0.0.4")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    # other users are not held up
    assert api_login(app, "staff1", password("staff1"), source)[0] == 200


def test_the_form_says_why_in_the_page(app):
    status, headers, body = form_login(app, "staff1", password("staff1"), "127.0.0.5")
    assert status == 303 and headers["Location"].endswith("/jobs")
    assert "session=" in headers.get("Set-Cookie", "")
    status, _, body = form_login(app, "staff1", "nope", "127.0.0.5")
    assert status == 401 and "<div id=\"react-entry-point\">" in body     # the dashboard, showing /login
    # another site cannot log a browser in (login CSRF): refused before the password is looked at
    status, headers, body = post(app, "/login", urllib.parse.urlencode(
        {"username": "staff1", "password": password("staff1")}).encode(),
        "application/x-www-form-urlencoded", "127.0.0.5", {"Origin": "http://127.0.0.1:1"})
    assert status == 403 and "Set-Cookie" not in headers, body[:300]


def test_one_address_trying_many_names_is_throttled_too(app):
    statuses = [api_login(app, f"nobody{k}", "wrong-password", "127.0.0.6")[0] for k in range(21)]
    assert statuses[:20] == [401] * 20 and statuses[20] == 429, statuses
    status, headers, _ = form_login(app, "staff1", password("staff1"), "127.0.0.6")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert api_login(app, "staff1", password("staff1"), "127.0.0.7")[0] == 200


def test_a_window_forgets_failures_as_they_age():
    now = [1000.0]
    w = FailureWindow(Limit(3, 60.0), max_keys=2, clock=lambda: now[0])
    for dt in (0, 10, 20):
        now[0] = 1000.0 + dt
        assert w.wait_s("a") == 0
        w.fail("a")
    assert w.wait_s("a") == pytest.approx(40.0)       # the first failure leaves the window at 1060
    now[0] = 1060.0
    assert w.wait_s("a") == 0
    w.fail("b"), w.fail("c")                           # at most two keys kept: "a" is forgotten
    assert w.wait_s("a") == 0 and w.wait_s("b") == 0


class CountingUsers(Users):
    """Real users with scrypt hashes that record how many password checks run at once."""

    def __init__(self) -> None:
        super().__init__({"carol": User("carol", "user", generate_password_hash("carol-password"))}, "test")
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def check(self, name, password):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().check(name, password)
        finally:
            with self.lock:
                self.now -= 1


def test_parallel_guesses_hash_in_two_slots_at_most():
    users = CountingUsers()
    gate = Gate(LoginPolicy(per_user=Limit(1000, 60), per_address=Limit(1000, 60), hashing_wait_s=0.05))
    results: list[str] = []

    def guess(k: int) -> None:
        try:
            results.append("ok" if gate.login(users, "carol", f"guess {k}", f"10.0.0.{k}") else "wrong")
        except Refused as e:
            results.append(str(e.status))
    threads = [threading.Thread(target=guess, args=(k,)) for k in range(12)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert users.most <= 2, users.most
    assert "503" in results and "wrong" in results, results
    assert time.monotonic() - t0 < 30


def test_parallel_wrong_guesses_are_checked_within_the_limits():
    """Issue 47, row 6: 40 parallel wrong logins for one user check at most 5 passwords (the
    per-user limit), and 60 over 3 users from one address at most 20 (the per-address limit):
    each attempt counts as failed before its password is checked."""
    users = CountingUsers()
    users.checked = 0
    check = users.check

    def counted(name, pw):
        with users.lock:
            users.checked += 1
        return check(name, pw)
    users.check = counted
    gate = Gate(LoginPolicy(hashing_wait_s=30))

    def guesses(names: list[str], address: str) -> list[str]:
        out: list[str] = []

        def guess(name: str) -> None:
            try:
                out.append("ok" if gate.login(users, name, "wrong", address) else "wrong")
            except Refused as e:
                out.append(str(e.status))
        threads = [threading.Thread(target=guess, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    out = guesses(["carol"] * 40, "10.0.0.1")
    assert users.checked == 5 and out.count("wrong") == 5 and out.count("429") == 35, (users.checked, out)
    users.checked = 0
    out = guesses([f"user{k % 3}" for k in range(60)], "10.0.0.2")
    assert users.checked <= 15 and out.count("429") >= 45, (users.checked, out)   # 5 per name, 20 per address
