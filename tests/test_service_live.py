"""Live mode in wall time: a static node source, the simulated dispatcher, the real scheduler
thread; reclaimed nodes are vacated at once, a paused harvester re-divides nothing, and a
restart takes the jobs up again."""
from __future__ import annotations

import time

import pytest

from core.assemble import build
from core.schemas import JobSpec
from core.service import Unsupported
from core.settings import HarvesterSettings
from core.snapshot import BUSY, HELD
from tests.support.waiting import wait

NODES = [f"lab{i}" for i in range(6)]
SPEC = JobSpec(name="mlp", min_nodes=1, max_nodes=6, total_samples=1e12, curve="1:100, 6:600",
               scale_up_seconds=0, scale_down_seconds=0)


def harvester(db, fresh=False, taken=()):
    """Simulated workers on the static nodes NODES; `taken`: nodes their owner took back while
    the harvester was down."""
    inventory = db.parent / "nodes.txt"
    inventory.write_text("".join(n + "\n" for n in NODES))
    h = build(HarvesterSettings.parse({"db": db, "fresh": fresh, "tick_s": 0.05, "live": {
        "dispatch": "simulated", "inventory": inventory, "config": {"tfwd": 60}}}))
    for n in taken:
        h.source.reclaim(n, time.time())
    h.source.poll(time.time())
    h.open()
    return h


def holds(h, job_id):
    j = h.snapshot.job(job_id)
    return j["nodes"] if j else None


def test_a_reclaimed_node_is_vacated_within_a_tick(tmp_path):
    h = harvester(tmp_path / "live.db")
    try:
        assert not h.capabilities.can_set_speed and h.capabilities.operates_nodes and len(h.snapshot.nodes) == 6
        job = h.submit(SPEC, "alice")
        wait(lambda: holds(h, job.id) == 6, 5, "the job on 6 nodes", period=0.02)
        t0 = time.monotonic()
        h.source.reclaim("lab3", time.time())
        wait(lambda: holds(h, job.id) == 5, 5, "lab3 vacated", period=0.02)
        took = time.monotonic() - t0
        snap = h.snapshot
        i = snap.nodes.index("lab3")
        assert snap.state[i] == BUSY and snap.job_of[i] is None
        assert took < 2.0, f"vacating took {took:.2f} s"
        h.pause()
        h.source.release("lab3", time.time())
        time.sleep(0.4)
        assert holds(h, job.id) == 5, "a paused harvester hands out no node"
        h.resume()
        wait(lambda: holds(h, job.id) == 6, 5, "lab3 held again after the resume", period=0.02)
        assert h.snapshot.state[i] == HELD
        with pytest.raises(Unsupported):
            h.set_speed(10)
        with pytest.raises(RuntimeError):
            h.restart()
    finally:
        h.close()


def test_a_restart_takes_the_jobs_up_again(tmp_path):
    db = tmp_path / "live.db"
    h = harvester(db)
    job = h.submit(SPEC, "bob")
    wait(lambda: holds(h, job.id) == 6, 5, "the job on 6 nodes", period=0.02)
    time.sleep(0.5)
    h.close()
    again = harvester(db, taken=["lab0"])        # while we were down, lab0 was taken back
    try:
        assert again.job(job.id).owner == "bob"
        wait(lambda: holds(again, job.id) == 5, 5, "the restarted job on the 5 nodes left", period=0.02)
        assert again.snapshot.job(job.id)["samples_done"] > 0
    finally:
        again.close()
    fresh = harvester(db, fresh=True)
    try:
        assert fresh.job(job.id) is None
    finally:
        fresh.close()
