"""The acceptance path of real elastic training, end to end: `python -m app --dispatch ssh`
against a real sshd on 127.0.0.1 with four node names mapped to it. A job registered through
the API starts on 2 nodes, grows to 3, shrinks to 1 (its nodes reclaimed: each vacated within
2 s), grows back, loses a node by SIGKILL of its worker, and finishes with exactly its total
samples and a falling loss; no worker process is left behind."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.server import ROOT, start_app
from tests.support.procs import leftovers, worker_pid
from tests.support.pace import PaceFile
from tests.support.waiting import wait

GLOBAL_BATCH = 64
TOTAL = GLOBAL_BATCH * 1200
NODES = ["node0", "node1", "node2", "node3"]




@pytest.fixture
def app(tmp_path, sshd_server):
    inventory = tmp_path / "nodes.txt"
    inventory.write_text("".join(f"{n} {n}\n" for n in NODES))
    proc = start_app(tmp_path, "--fresh", "--dispatch", "ssh", "--nodes", str(inventory),
                     "--ssh-config", str(sshd_server.client_config), "--tick", "0.1",
                     "--workdir", str(ROOT), "--no-profiler")      # sizes set by the test, not by probes
    yield proc
    proc.stop()


def test_a_job_grows_shrinks_loses_a_node_and_finishes_over_ssh(app, sshd_server, tmp_path):
    pace = PaceFile(tmp_path, 0.03)
    staff, alice = app.token("staff1"), app.token("alice")
    node = lambda n, cmd: app.request("POST", f"/api/nodes/{n}/{cmd}", token=staff)
    for n in NODES[2:]:
        assert node(n, "reclaim")[0] == 200
    status, job = app.request("POST", "/api/jobs", {
        "name": "digits over ssh", "min_nodes": 1, "max_nodes": 3, "total_samples": TOTAL,
        "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": GLOBAL_BATCH, "command": [sys.executable, "examples/digits_cnn.py", "--seed", "2",
                                                  *pace.args]},
        token=alice)
    assert status == 201, job
    jid = job["id"]
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    workers = lambda: get().get("workers") or {}
    world = lambda k: (lambda: workers().get("world_size") == k and not workers().get("regrouping"))
    wait(world(2), 90, "2 nodes", workers)
    first_loss = wait(lambda: workers().get("loss"), 30, "a loss")
    assert node(NODES[2], "release")[0] == 200
    wait(world(3), 90, "growth to 3", workers)
    vacate = {}
    for n in NODES[:2]:
        pid = worker_pid(jid, n)
        assert pid, f"no worker on {n}"
        t0 = time.monotonic()
        assert node(n, "reclaim")[0] == 200
        wait(lambda: not Path(f"/proc/{pid}").exists() or
             Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10, f"worker on {n} gone")
        vacate[n] = time.monotonic() - t0
    wait(world(1), 60, "shrunk to 1", workers)
    assert max(vacate.values()) < 2.0, vacate
    for n in NODES[:2]:
        node(n, "release")
    wait(world(3), 90, "growth back to 3", get)
    mid_loss = wait(lambda: workers().get("loss"), 30, "a loss at 3 nodes")
    victim = worker_pid(jid, NODES[1])
    os.kill(victim, signal.SIGKILL)
    wait(lambda: NODES[1] in (workers().get("lost") or []) or workers().get("world_size", 3) < 3, 15,
         "the killed worker noticed", workers)
    refused = app.request("POST", f"/api/workers/{jid}/report", {"step": 1, "samples": 64}, token="not-the-job-token")
    assert refused[0] == 401, refused
    pace.release()
    wait(lambda: get()["state"] == "done", 300, "the job to finish", get)
    final = get()
    assert final["samples_done"] == TOTAL, final
    assert mid_loss < first_loss, (first_loss, mid_loss)
    wait(lambda: not leftovers(jid), 20, "no worker left")
    print(f"vacate seconds: {vacate}")
