"""The pilot hub's defences (core/pilots/hub.py, lobby.py, wire.py, tls.py; job ids in cli.py),
without Slurm: pilots are the real pilot program in a subprocess or a fake one speaking the wire
protocol; Slurm's commands, where one is run, are fakes on PATH that record their argv.

Each test stands for one hole closed: idle connections cannot lock pilots out; a hello is
bounded in time as a whole; a hello for a held node never displaces the holder; a job id that
looks like an option never reaches scancel; the token never crosses the wire in clear; a pilot
talks to no hub but the one it pinned; the listener survives EMFILE and thread-start failures;
a pilot that stops reading cannot block a sender."""
from __future__ import annotations

import json
import logging
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from core.pilots.base import BadJobId
from core.slurm.cli import SlurmCli, valid_job_id
from core.pilots.hub import PilotGone, PilotHub, PilotLink
from core.pilots.settings import PilotSettings
from core.pilots.wire import (ALIVE, ENV_HUB, ENV_HUB_SHA256, ENV_TOKEN, HELLO, Wire, WrongCertificate,
                             client_context, dial)
from tests.support.files import ROOT
from tests.support.fakeslurm import fake_slurm, slurm_source
from tests.support.waiting import wait

TOKEN = "the-harvesters-token-" + "x" * 20
OPTION_LIKE_IDS = ("--me", "1;rm", "-1")


class Hub:
    """A PilotHub with the hellos and leaves it reported."""

    def __init__(self, token: str = TOKEN, **kw) -> None:
        self.hellos: list[PilotLink] = []
        self.leaves: list[str] = []
        self.hub = PilotHub(token, self.hellos.append, lambda link, why: self.leaves.append(why), **kw)
        self.address = "%s:%d" % self.hub.address

    def __enter__(self) -> "Hub":
        return self

    def __exit__(self, *exc) -> None:
        self.hub.close()


def fake_pilot(hub: Hub, job: str, node: str, token: str = TOKEN, address: str = "") -> Wire:
    w = dial(address or hub.address, hub.hub.fingerprint, timeout_s=5)
    assert w.send({"op": HELLO, "token": token, "job": job, "node": node, "pid": 1})
    return w


def pilot_process(hub_address: str, sha256: str, job: str, node: str) -> subprocess.Popen:
    """The real pilot program, as Slurm would start it on `node` for job `job`."""
    env = {**os.environ, ENV_HUB: hub_address, ENV_HUB_SHA256: sha256, ENV_TOKEN: TOKEN,
           "SLURM_JOB_ID": job, "SLURMD_NODENAME": node}
    return subprocess.Popen([sys.executable, "-c", "import sys; from core.pilots.pilot_job import main; "
                             "sys.exit(main())"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 10) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the other end closes `sock` within `timeout` (what it sends meanwhile is read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                if not sock.recv(65536):
                    return True
            except OSError:
                return True
    return False


# ---- the cap and the deadline ------------------------------------------------------------------
def test_a_thousand_idle_connections_do_not_lock_a_pilot_out():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = PilotSettings().hub_connection_cap
    assert soft > 1000 + cap + 200, f"RLIMIT_NOFILE {soft} is too low for this test"
    idle: list[socket.socket] = []
    with Hub(max_connections=cap) as h:
        threads = threading.active_count()
        try:
            for _ in range(1000):
                idle.append(socket.create_connection(h.hub.address, timeout=5))
            t0 = time.monotonic()
            w = fake_pilot(h, "41", "node1")
            link = wait(lambda: h.hub.link("node1"), 5, "the pilot's hello accepted")
            took = time.monotonic() - t0
            assert link.job == "41" and took < 3, f"accepted after {took:.2f} s"
            lobby = h.hub._lobby
            assert len(lobby._guests) + lobby.established() <= cap
            assert lobby.closed["evicted at the cap"] >= 1000 - cap
            assert threading.active_count() <= threads + 2, "no thread per connection"
            w.close()
        finally:
            for s in idle:
                s.close()


def test_at_the_cap_with_only_pilots_a_new_connection_is_closed_at_once():
    with Hub(max_connections=2) as h:
        pilots = [fake_pilot(h, str(40 + i), f"node{i}") for i in (1, 2)]
        wait(lambda: len(h.hub.links()) == 2, 5, "two pilots")
        with socket.create_connection(h.hub.address, timeout=5) as s:
            assert closed_by_peer(s, 2), "a third connection is closed at once"
        assert [l.job for l in h.hub.links()] == ["41", "42"]
        for w in pilots:
            w.close()


def test_the_hello_deadline_is_for_the_whole_hello_not_per_read():
    with Hub(hello_timeout_s=1.0) as h:
        with socket.create_connection(h.hub.address, timeout=5) as s:
            t0 = time.monotonic()
            ended = None
            hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200)   # a ClientHello, slowly
            for b in hello:
                try:
                    s.send(bytes([b]))
                except OSError:
                    ended = time.monotonic() - t0
                    break
                if closed_by_peer(s, 0.1):
                    ended = time.monotonic() - t0
                    break
            assert ended is not None and ended < 2.5, f"a trickling client kept its connection ({ended})"


# ---- a hello for a held node -------------------------------------------------------------------
def test_a_hello_for_a_held_node_leaves_the_holder_in_place():
    with Hub() as h:
        holder = pilot_process(h.address, h.hub.fingerprint, "101", "node1")
        try:
            link = wait(lambda: h.hub.link("node1"), 10, "the real pilot on node1")
            assert link.job == "101"
            for job, node in (("102", "node1"), ("101", "node2")):      # the node, or the job id, taken
                intruder = fake_pilot(h, job, node)
                assert closed_by_peer(intruder.sock, 3), "the hub refuses the intruder"
                assert h.hub.link("node1") is link and h.hub.link_of_job("101") is link
                intruder.close()
            time.sleep(0.3)                  # the intruders' ends are handled
            assert h.hub.link("node1") is link and not link.closed.is_set()
            assert [l.job for l in h.hellos] == ["101"] and not h.leaves
            assert link.request(ALIVE, 5, handles=[]) == {"re": 0, "ok": True, "alive": []}
        finally:
            h.hub.close()
            out = finish(holder)
        assert holder.returncode == 0, out


# ---- job ids -----------------------------------------------------------------------------------
def calls(record: Path) -> list[list[str]]:
    return [json.loads(l) for l in record.read_text().splitlines()] if record.exists() else []


def test_job_ids_that_look_like_options_never_reach_slurm(tmp_path, monkeypatch):
    assert all(valid_job_id(j) for j in ("1", "123456", "77_3"))
    assert not any(valid_job_id(j) for j in (*OPTION_LIKE_IDS, "", "1 2", "1\n", "_1", "1_", 12, None))
    record = fake_slurm(tmp_path, monkeypatch)
    cli = SlurmCli()
    for bad in OPTION_LIKE_IDS:
        with pytest.raises(BadJobId):
            cli.cancel(["12", bad])
    with pytest.raises(ValueError):
        cli.jobs(name="harvest-pilot", user="--me")
    assert calls(record) == [], "nothing was run"
    cli.cancel(["12", "3_4"])
    cli.jobs(name="harvest-pilot", user="alice")
    assert calls(record) == [["scancel", "--", "12", "3_4"], ["sinfo", "--version"],
                             ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N|%P|%u|%r|%j",
                              "--name=harvest-pilot", "--user=alice"]]

    # the whole way: hellos to the source's hub for a node it does not watch (a stray pilot,
    # which the source cancels), with job ids that are options
    source = slurm_source(PilotSettings())
    try:
        assert source.hub is not None and source.node_names() == ["node1", "node2"]
        address = "%s:%d" % source.hub.address
        for bad in OPTION_LIKE_IDS:
            w = dial(address, source.hub.fingerprint)
            w.send({"op": HELLO, "token": source._token, "job": bad, "node": "node9", "pid": 1})
            assert closed_by_peer(w.sock, 3), f"the hub refuses job id {bad!r}"
            w.close()
        w = dial(address, source.hub.fingerprint)      # a real job id: cancelled as a stray
        w.send({"op": HELLO, "token": source._token, "job": "77", "node": "node9", "pid": 1})
        wait(lambda: ["scancel", "--", "77"] in calls(record), 5, "the stray pilot 77 cancelled")
        w.close()
    finally:
        source.close()
    argv = [a for c in calls(record) for a in c]
    assert not set(OPTION_LIKE_IDS) & set(argv), calls(record)


def test_a_slow_scancel_never_holds_up_the_pilots_hellos(tmp_path, monkeypatch):
    """Every pilot is read on one thread (issue 59), so the source's callbacks must not wait for
    Slurm: a stray pilot's scancel that takes seconds leaves the next pilot's hello as prompt as
    ever, and cancels asked for meanwhile go out together in the next scancel."""
    record = fake_slurm(tmp_path, monkeypatch)
    scancel = tmp_path / "bin" / "scancel"
    running = tmp_path / "scancel-running"
    scancel.write_text(scancel.read_text().replace(
        "print(", f"open({str(running)!r}, 'w').close()\nimport time; time.sleep(4)\nprint(", 1))
    source = slurm_source(PilotSettings())
    wires = []
    try:
        assert source.hub is not None
        address = "%s:%d" % source.hub.address

        def pilot(job: str, node: str) -> None:
            w = dial(address, source.hub.fingerprint)
            w.send({"op": HELLO, "token": source._token, "job": job, "node": node, "pid": 1})
            wires.append(w)

        pilot("77", "node9")                             # a stray: cancelled, slowly
        wait(running.exists, 5, "the first scancel running")
        pilot("78", "node8")                             # another stray, while it runs
        pilot("79", "node1")                             # a pilot on a watched node
        wait(lambda: source.book.held.get("node1") == "79", 2, "node1's hello while scancel is busy")
        assert [c for c in calls(record) if c[0] == "scancel"] == [["scancel", "--", "77"]]
        wait(lambda: ["scancel", "--", "78"] in calls(record), 15, "the stray pilot 78 cancelled next")
    finally:
        for w in wires:
            w.close()
        source.close()


# ---- the token on the wire, and the certificate ------------------------------------------------
class Proxy:
    """A TCP proxy on 127.0.0.1 in front of `target` that records every byte, both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up, self.down = bytearray(), bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        ends = {client: (server, self.up), server: (client, self.down)}
        try:
            while True:
                for s in select.select(list(ends), [], [])[0]:
                    data = s.recv(65536)
                    if not data:
                        return
                    other, seen = ends[s]
                    seen += data
                    other.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    def close(self) -> None:
        self.listener.close()


def test_a_capture_of_the_hello_holds_no_token():
    with Hub() as h:
        proxy = Proxy(h.hub.address)
        pilot = pilot_process(proxy.address, h.hub.fingerprint, "55", "node5")
        try:
            link = wait(lambda: h.hub.link("node5"), 10, "the pilot's hello through the proxy")
            assert link.request(ALIVE, 5, handles=[])["ok"]
        finally:
            h.hub.close()
            out = finish(pilot)
            proxy.close()
        assert pilot.returncode == 0, out
    seen = bytes(proxy.up + proxy.down)
    assert proxy.up[:1] == b"\x16" and len(proxy.up) > 100, "a TLS handshake went through the proxy"
    for secret in (TOKEN, '"hello"', '"node5"', '"alive"'):
        assert secret.encode() not in seen, f"{secret} on the wire in clear"


def test_a_pilot_refuses_a_hub_with_another_certificate():
    with Hub() as pinned, Hub() as impostor:            # the same token: only the pin tells them apart
        with pytest.raises(WrongCertificate):
            dial(impostor.address, pinned.hub.fingerprint)
        pilot = pilot_process(impostor.address, pinned.hub.fingerprint, "66", "node6")
        out = finish(pilot)
        assert pilot.returncode == 1 and "refusing to talk" in out, out
        time.sleep(0.2)
        assert not impostor.hellos and not pinned.hellos, "no hello reached either hub"
        assert impostor.hub._lobby.closed["closed by the peer"] == 2
        fake_pilot(impostor, "67", "node6").close()      # the impostor would have taken it
        wait(lambda: impostor.hellos, 5, "a hello to the impostor with its own fingerprint")


# ---- failures of the listener ------------------------------------------------------------------
def test_the_accept_loop_survives_emfile(caplog):
    caplog.set_level(logging.WARNING, logger="core.pilots.lobby")
    with Hub() as h:
        early = socket.socket()                       # its descriptor, before there are none
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
        try:
            early.connect(h.hub.address)              # the hub's accept() gets EMFILE
            wait(lambda: "cannot accept" in caplog.text, 5, "the hub's accept failing", lambda: caplog.text)
            time.sleep(0.3)                           # a few more failures, with pauses
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert "Too many open files" in caplog.text, caplog.text
        w = Wire(early, client_context(), server_side=False)
        w.handshake(time.monotonic() + 5)
        w.send({"op": HELLO, "token": TOKEN, "job": "31", "node": "node3", "pid": 1})
        wait(lambda: h.hub.link("node3"), 5, "the connection that came during EMFILE accepted")
        later = fake_pilot(h, "32", "node4")
        wait(lambda: h.hub.link("node4"), 5, "a connection after it")
        w.close()
        later.close()


def test_pilots_cost_no_thread_of_their_own():
    """Issue 59: a whole machine's pilots (10,624 on Aurora) cannot each have a thread; the hub
    reads them all on one, and a pilot's hello is still reported before its leave."""
    with Hub() as h:
        before = threading.active_count()
        pilots = [fake_pilot(h, str(100 + i), f"node{i}") for i in range(200)]
        wait(lambda: len(h.hellos) == 200, 20, "200 pilots connected")
        assert threading.active_count() == before, [t.name for t in threading.enumerate()]
        for w in pilots[:100]:
            w.close()
        wait(lambda: len(h.leaves) == 100, 10, "100 leaves")
        assert len(h.hub.links()) == 100 and h.hub._serving == 100
        assert threading.active_count() == before
        for w in pilots[100:]:
            w.close()


# ---- sends ---------------------------------------------------------------------------------------
def test_a_send_to_a_pilot_that_stops_reading_times_out():
    with Hub(send_timeout_s=0.5) as h:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(h.hub.address)
        pilot = Wire(sock, client_context(), server_side=False)
        pilot.handshake(time.monotonic() + 5)
        pilot.send({"op": HELLO, "token": TOKEN, "job": "91", "node": "node9", "pid": 1})
        link = wait(lambda: h.hub.link("node9"), 5, "the pilot")
        last: list[Optional[float]] = [None]

        def flood() -> None:                          # the pilot never reads: its buffers fill up
            while True:
                t0 = time.monotonic()
                if not link.wire.send({"op": "start", "pad": "x" * 65536}):
                    last[0] = time.monotonic() - t0
                    return

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), "a send to a pilot that does not read blocked for good"
        assert last[0] is not None and 0.4 < last[0] < 3, f"the failing send took {last[0]} s"
        wait(lambda: link.closed.is_set(), 5, "the pilot treated as gone")
        wait(lambda: h.leaves, 5, "the leave reported (on the link's own thread)")
        assert h.hub.link("node9") is None and h.leaves == ["pilot 91 lost its connection"]
        with pytest.raises(PilotGone):
            link.request(ALIVE, 5, handles=[])
        pilot.close()
