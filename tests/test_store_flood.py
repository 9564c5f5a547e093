"""A job's store (its TCPStore, served in the harvester's process) flooded with connections by
another local user: the harvester's web loop must not select() on descriptors past 1023 (the
flood pushes every later socket there), so the harvester, its pages and the job go on.
Issue 47, row 1 (the flood part; the store's own bounds are not done yet)."""
from __future__ import annotations

import socket
import sys
import time

from tests.support.procs import environ_of, worker_pid
from tests.support.server import ROOT, start_app
from tests.support.waiting import wait

FLOOD = 1500


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_flood_of_connections_to_a_jobs_store_does_not_take_the_harvester_down(tmp_path):
    app = start_app(tmp_path, "--fresh", "--dispatch", "local", "--local-nodes", "1", "--tick", "0.1",
                    "--no-profiler")
    socks: list[socket.socket] = []
    try:
        alice = app.token("alice")
        status, job = app.request("POST", "/api/jobs", {
            "name": "flooded", "min_nodes": 1, "max_nodes": 1, "curve": "1:100", "total_samples": 64 * 100_000,
            "global_batch": 64, "command": [sys.executable, str(ROOT / "examples" / "digits_cnn.py"),
                                            "--step-seconds", "0.02"]}, token=alice)
        assert status == 201, job
        jid = job["id"]
        step = lambda: (app.get(f"/api/jobs/{jid}")[1].get("workers") or {}).get("committed_step") or 0
        wait(lambda: step() > 5, 60, "the job training")
        host, _, port = environ_of(worker_pid(jid, "local-0"))["HARVEST_STORE"].rpartition(":")
        rss0 = _rss_mb(app.proc.pid)
        for _ in range(FLOOD):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        before = step()
        for _ in range(5):                          # new web connections get descriptors past 1023
            t0 = time.monotonic()
            status, health = app.get("/api/health")
            assert status == 200 and time.monotonic() - t0 < 1.0, health
        wait(lambda: step() > before + 20, 30, "the job training on through the flood")
        assert app.proc.poll() is None
        assert "filedescriptor out of range" not in app.output()
        assert _rss_mb(app.proc.pid) - rss0 < 50, (rss0, _rss_mb(app.proc.pid))
    finally:
        for s in socks:
            s.close()
        app.stop()


def test_the_harvester_raises_its_descriptor_limit_to_the_hard_one():
    """A site's default soft limit (often 1024) would refuse the flood's connections before poll()
    matters, and with them the jobs' own: `python -m app` takes the hard limit at start."""
    import resource

    from app.__main__ import raise_descriptor_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        assert raise_descriptor_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
