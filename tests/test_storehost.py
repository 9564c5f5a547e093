"""A job's store process (core/runtime/storehost.py) against a real TCPStore client: what the job
wrote stays, what it did not is deleted, a peer over its connection cap loses its newest
connections, memory over the limit ends the process with a reason, and the process never outlives
the harvester that started it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch.distributed as dist

from core.runtime.signing import signed
from core.runtime.storehost import StoreHost, StoreLimits
from tests.support.files import ROOT
from tests.support.waiting import wait

SECRET = "a-secret-of-the-job"


def _client(host: StoreHost) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", host.port, None, False, timeout=timedelta(seconds=10))


@pytest.fixture
def host():
    h = StoreHost.start("127.0.0.1", 0, None, SECRET, 30.0, StoreLimits(per_peer=64, sweep_s=0.05))
    yield h
    h.stop()


def test_what_the_job_wrote_stays_and_the_rest_is_deleted(host):
    raw = _client(host)
    job = signed(raw, SECRET)
    job.set("meta", "{}")
    job.add("evn", 3)
    group = dist.PrefixStore("gen1", job)            # how a process group's rendezvous writes
    group.set("rank0", b"\x00\x01address")
    namespace = next(k.split("/")[0] for k in raw.list_keys())
    raw.set("outside", "x")
    raw.set(f"{namespace}/untagged", "not a counter, no tag")
    raw.set(f"{namespace}/meta2", b"y" * (2 << 20))     # over max_value_bytes
    forged = signed(raw, "another-secret")             # a tag, but not under the job's secret
    raw.set(f"{namespace}/forged", bytes(forged._seal("forged", "v")))
    wait(lambda: len(raw.list_keys()) == 3, 5, "the sweep", lambda: raw.list_keys())
    assert job.read("meta") == b"{}" and job.add("evn", 0) == 3 and group.get("rank0") == b"\x00\x01address"
    wait(lambda: host.snapshot()["foreign_keys"] == 4, 5, "the report", host.snapshot)
    raw.set(f"{namespace}/meta", os.urandom((8 << 20) - 64))   # a known key overwritten, 8 MiB:
    wait(lambda: not raw.check([f"{namespace}/meta"]), 5, "the overwrite removed")   # memory grew, all checked


def test_a_peer_over_its_cap_loses_its_newest_connections_and_the_oldest_work_on(host):
    first = signed(_client(host), SECRET)
    first.set("k", "v")
    flood = [socket.create_connection(("127.0.0.1", host.port)) for _ in range(300)]
    try:
        wait(lambda: host.snapshot()["shut_connections"] > 0, 10, "the newest shut", host.snapshot)
        assert set(host.snapshot()["peers_over_cap"]) == {"127.0.0.1"}
        assert first.get("k") == b"v"          # the oldest connection was kept
        assert host.alive()
    finally:
        for s in flood:
            s.close()
    fds = lambda: len(os.listdir(f"/proc/{host.proc.pid}/fd"))
    wait(lambda: fds() < 32, 20, "the store's descriptors given back", fds)


def test_memory_over_the_limit_ends_the_store_with_its_reason():
    h = StoreHost.start("127.0.0.1", 0, None, SECRET, 30.0,
                        StoreLimits(max_value_bytes=8 << 20, max_rss_mb=400, sweep_s=0.05))
    try:
        job = signed(_client(h), SECRET)
        assert h.alive()
        try:
            for i in range(45):              # genuine, each under the value limit: 360 MB in all
                job.set(f"big{i}", os.urandom((8 << 20) - 64))
        except dist.DistError:
            pass                             # ended while being written to
        wait(lambda: not h.alive(), 10, "the store to end")
        assert "after removing what was not the job's" in (h.failure() or ""), h.failure()
    finally:
        h.stop()


def test_the_store_process_ends_with_the_harvester_that_started_it(tmp_path):
    """The harvester killed (no cleanup runs): its stores' stdin closes, and they leave."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from core.runtime.storehost import StoreHost
        h = StoreHost.start("127.0.0.1", 0, None, "s", 30.0)
        print(h.proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()

        def gone() -> bool:
            try:
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                return True
            return state == "Z"
        wait(gone, 10, "the store process to leave")
    finally:
        if parent.poll() is None:
            parent.kill()
