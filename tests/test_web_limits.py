"""The web server's own limits, against a real server: a body over 1 MiB is refused from its
Content-Length before any of it is read (so nothing is spooled), and idle connections close."""
from __future__ import annotations

import socket
import time
import urllib.parse

import pytest

from app.webconfig import MAX_BODY_BYTES
from tests.support.server import start_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("limits"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "2", "--channel-timeout", "2")
    yield proc
    proc.stop()


def connect(app) -> socket.socket:
    host, port = urllib.parse.urlsplit(app.url).netloc.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def head_of_answer(sock: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("latin-1")


def post_head(app, length: int, path: str = "/api/jobs") -> bytes:
    host = urllib.parse.urlsplit(app.url).netloc
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_200_mb_body_is_refused_before_it_is_sent(app):
    with connect(app) as s:
        t0 = time.monotonic()
        s.sendall(post_head(app, 200 * 1000 * 1000) + b'{"name": ')     # and not one byte more
        answer = head_of_answer(s)
        assert answer.startswith("HTTP/1.1 413"), answer[:200]
        assert time.monotonic() - t0 < 5
    # the limit is the app's own (1 MiB): one byte over is refused, the limit itself is read
    with connect(app) as s:
        s.sendall(post_head(app, MAX_BODY_BYTES + 1))
        assert head_of_answer(s).startswith("HTTP/1.1 413")
    with connect(app) as s:
        s.sendall(post_head(app, MAX_BODY_BYTES) + b" " * MAX_BODY_BYTES)
        answer = head_of_answer(s)
        assert answer.startswith("HTTP/1.1 401"), answer[:200]       # read, then refused for want of a login
    assert app.get("/api/health")[0] == 200


def test_a_chunked_body_over_the_limit_is_cut_off(app):
    host = urllib.parse.urlsplit(app.url).netloc
    chunk = b"x" * 65536
    with connect(app) as s:
        s.sendall(f"POST /api/jobs HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        try:
            for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert head_of_answer(s).startswith("HTTP/1.1 413")


def test_an_idle_connection_is_closed(app):
    with connect(app) as s:
        s.settimeout(15)
        t0 = time.monotonic()
        assert s.recv(1) == b""            # closed by the server, nothing sent
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("args, words", [(["--threads", "0"], "--threads: must be at least 1"),
                                         (["--connection-limit", "-5"], "--connection-limit: must be at least 1"),
                                         (["--session-idle", "0"], "--session-idle: must be positive")])
def test_bad_web_options_are_refused_by_name(tmp_path, args, words):
    import subprocess
    import sys
    from tests.support.server import ROOT
    r = subprocess.run([sys.executable, "-m", "app", "--db", str(tmp_path / "h.db"), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "h.db").exists()
