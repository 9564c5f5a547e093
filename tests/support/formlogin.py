"""Raw HTTP to a test server as a browser sends it: one request on a connection of its own, and
the cookie a login through the form gives (tests of sessions, tokens and their revocation)."""
from __future__ import annotations

import http.client
import urllib.parse


def send(app, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, str]:
    netloc = urllib.parse.urlsplit(app.url).netloc
    conn = http.client.HTTPConnection(netloc, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


def browser_login(app, name: str, pw: str) -> dict:
    """The headers a browser sends after logging in through the form: its cookie and origin."""
    status, headers, body = send(app, "POST", "/login", urllib.parse.urlencode({"username": name, "password": pw}).encode(),
                                 {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303, body[:300]
    return {"Cookie": headers["Set-Cookie"].split(";")[0], "Origin": app.url}
