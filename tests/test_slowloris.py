"""Slow clients cannot lock out the dashboard (issue 47, row 3): 500 connections that trickle a
header line a second, from one address, leave /api/health answering within 1 s, and are closed
once their header deadline passes; a legitimate client that sends its headers in time and then
uploads a large body at an ordinary pace is still served. The attackers bind 127.0.0.2 (all of
127.0.0.0/8 is loopback on Linux) so that the per-address cap sets them apart from the normal
client on 127.0.0.1."""
from __future__ import annotations

import select
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pytest

from app.__main__ import build_parser, web_config
from app.slowclients import Tally
from app.webconfig import MAX_BODY_BYTES, WebConfig
from tests.support.server import start_app
from tests.support.waiting import wait

HEADER_TIMEOUT_S = 4.0
ATTACKERS = 500
ATTACKER_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("slowloris"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "2", "--header-timeout", str(HEADER_TIMEOUT_S))
    yield proc
    proc.stop()


def address(app) -> tuple[str, int]:
    host, port = urllib.parse.urlsplit(app.url).netloc.split(":")
    return host, int(port)


def health_s(app) -> float:
    """Seconds a fresh connection takes to get /api/health's 200; inf where none came within 1 s."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(app.url + "/api/health", timeout=1.0) as r:
            assert r.status == 200
            r.read()
    except OSError:                   # a timeout, however urllib words it
        return float("inf")
    return time.monotonic() - t0


@dataclass
class Trickle:
    """Connections from ATTACKER_HOST that each send a request line and then one header line a
    second, never the blank line that ends the headers; `closed_at` notes when the server closed
    each (monotonic seconds)."""
    target: tuple[str, int]
    socks: list[socket.socket] = field(default_factory=list)
    closed_at: dict[int, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def open(self, n: int) -> None:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ATTACKER_HOST, 0))
            s.settimeout(5)
            s.connect(self.target)
            s.sendall(b"GET /api/health HTTP/1.1\r\n")
            s.setblocking(False)
            self.socks.append(s)

    def run(self) -> None:
        poller = select.poll()
        fds = {s.fileno(): i for i, s in enumerate(self.socks)}
        for fd in fds:
            poller.register(fd, select.POLLIN)
        next_line = time.monotonic() + 1.0
        while not self.stop.is_set():
            for fd, _ in poller.poll(100):
                self.closed(fds[fd])
                poller.unregister(fd)
            if time.monotonic() >= next_line:
                next_line += 1.0
                for i, s in enumerate(self.socks):
                    if i not in self.closed_at:
                        try:
                            s.send(b"X-Trickle: %d\r\n" % i)
                        except OSError:
                            self.closed(i)

    def closed(self, i: int) -> None:
        try:
            gone = self.socks[i].recv(1) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            self.closed_at.setdefault(i, time.monotonic())

    def still_open(self) -> int:
        return len(self.socks) - len(self.closed_at)

    def close(self) -> None:
        self.stop.set()
        for s in self.socks:
            s.close()


def test_500_trickling_connections_leave_the_dashboard_answering(app):
    cap = WebConfig.per_address_limit
    trickle = Trickle(address(app))
    thread = threading.Thread(target=trickle.run, daemon=True)
    try:
        t0 = time.monotonic()
        trickle.open(ATTACKERS)
        thread.start()
        # the server takes them all in; those past the cap for 127.0.0.2 are closed at once
        wait(lambda: trickle.still_open() <= cap, 2, fail=False)
        times, still_open = [], []
        while time.monotonic() - t0 < HEADER_TIMEOUT_S - 1:     # the trickle goes on
            still_open.append(trickle.still_open())
            times.append(health_s(app))
            time.sleep(0.2)
        assert max(times) < 1.0 and len(times) >= 5, times
        assert set(still_open) == {cap}, still_open
        # then each is closed once its header deadline passes, within a couple of seconds of it
        assert wait(lambda: trickle.still_open() == 0, 4, fail=False), trickle.still_open()
        last = sorted(trickle.closed_at.values())[-cap:]
        assert t0 + HEADER_TIMEOUT_S < last[0] and last[-1] < t0 + HEADER_TIMEOUT_S + 3, (last[0] - t0, last[-1] - t0)
        assert health_s(app) < 1.0
    finally:
        trickle.close()
    # one log line each for the refused and the closed, once their burst is over
    refused = f"refused {ATTACKERS - cap} new connection(s) from address(es) already holding {cap}"
    closed = f"closed {cap} connection(s) whose request headers were not complete within {HEADER_TIMEOUT_S:g} s"
    assert wait(lambda: closed in app.output(), 3, fail=False), app.output()[-2000:]
    log = app.output()
    assert log.count(f"{refused} (the per-address limit): {ATTACKER_HOST}: {ATTACKERS - cap}\n") == 1, log[-2000:]
    assert log.count(f"{closed}: {ATTACKER_HOST}: {cap}\n") == 1, log[-2000:]
    assert "Traceback" not in log


def test_a_slow_legitimate_client_is_served(app):
    """Headers in three pieces over 2 s, then a 1 MiB body at about 200 kB/s (past the header
    deadline), then a second request on the same connection after an idle second: all answered."""
    host, port = address(app)
    head = (f"POST /api/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=10) as s:
        t0 = time.monotonic()
        for piece in (head[:20], head[20:60], head[60:]):
            s.sendall(piece)
            time.sleep(0.7)
        chunk = 64 * 1024
        for off in range(0, MAX_BODY_BYTES, chunk):
            s.sendall(b" " * min(chunk, MAX_BODY_BYTES - off))
            time.sleep(0.3)
        answer = read_answer(s)
        assert time.monotonic() - t0 > HEADER_TIMEOUT_S + 1
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]   # read in full, then refused for want of a login
        time.sleep(1.0)
        s.sendall(f"GET /api/health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        assert read_answer(s).startswith(b"HTTP/1.1 200")


def read_answer(s: socket.socket) -> bytes:
    """One response: its head, and its body by Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed by the server after {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("args, words", [(["--per-address-limit", "-1"], "--per-address-limit: must be at least 0"),
                                         (["--header-timeout", "0"], "--header-timeout: must be positive"),
                                         (["--header-timeout", "nan"], "--header-timeout: must be positive"),
                                         (["--header-timeout", "inf"], "--header-timeout: must be positive")])
def test_bad_slow_client_options_are_refused_by_name(args, words):
    with pytest.raises(ValueError, match=words):
        web_config(build_parser().parse_args(args))


def test_the_slow_client_options_reach_the_web_config():
    web = web_config(build_parser().parse_args(["--per-address-limit", "0", "--header-timeout", "2.5"]))
    assert (web.per_address_limit, web.header_timeout_s) == (0, 2.5)
    assert (WebConfig().per_address_limit, WebConfig().header_timeout_s) == (256, 10.0)


def test_refusals_are_logged_one_line_a_burst_and_at_most_one_per_interval():
    t = Tally()
    for i in range(300):
        t.add("127.0.0.2", 100.0 + i / 1000)
    assert t.due(100.4) is None                          # the burst goes on: wait for its end
    assert t.due(100.9) == {"127.0.0.2": 300}            # a check that finds no more: one line for all
    lines = []
    for k in range(30):                                  # then one a second, checked every half second
        t.add("127.0.0.3", 101.0 + k)
        for at in (101.2 + k, 101.7 + k):
            if (counts := t.due(at)) is not None:
                lines.append((at, counts.total()))
    assert [at for at, _ in lines] == [111.2, 121.7], lines    # 10 s or more apart, not more often
    assert sum(n for _, n in lines) + t.counts.total() == 30
