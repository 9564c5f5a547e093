"""The acceptance path across real hosts: `python -m app --dispatch ssh --advertise HEAD` with three
nodes in network namespaces, each at its own address with its own loopback and its own sshd. A
job registered through the API grows 1 -> 3, shrinks on a staff reclaim, loses a worker to
SIGKILL and finishes with exactly its total samples; its workers' store and report connections
go to the advertised address (a node that dialled 127.0.0.1 would reach only itself), and the
job's store listens there only."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from urllib.parse import urlparse

import pytest

from tests.support.procs import environ_of, leftovers, worker_pid
from tests.support.server import ROOT, start_app
from tests.support.pace import PaceFile
from tests.support.waiting import wait

GLOBAL_BATCH = 64
TOTAL = GLOBAL_BATCH * 1500
NODES = ["node1", "node2", "node3"]






@pytest.fixture
def app(tmp_path, netns_cluster):
    inventory = netns_cluster.write_inventory(tmp_path / "nodes.txt")
    proc = start_app(tmp_path, "--fresh", "--dispatch", "ssh", "--nodes", str(inventory),
                     "--ssh-config", str(netns_cluster.ssh_config), "--advertise", netns_cluster.head,
                     "--worker-env", "GLOO_SOCKET_IFNAME", "--tick", "0.1", "--workdir", str(ROOT),
                     "--no-profiler", env={"GLOO_SOCKET_IFNAME": "eth0"})   # the nodes' own interface
    yield proc
    proc.stop()


def test_a_job_trains_across_namespaced_hosts_through_the_advertised_address(app, netns_cluster, tmp_path):
    pace = PaceFile(tmp_path, 0.03)
    cluster, head = netns_cluster, netns_cluster.head
    staff, alice = app.token("staff1"), app.token("alice")
    node = lambda n, cmd: app.request("POST", f"/api/nodes/{n}/{cmd}", token=staff)
    for n in NODES[1:]:
        assert node(n, "reclaim")[0] == 200
    status, job = app.request("POST", "/api/jobs", {
        "name": "digits across hosts", "min_nodes": 1, "max_nodes": 3, "total_samples": TOTAL,
        "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": GLOBAL_BATCH, "command": [sys.executable, "examples/digits_cnn.py", "--seed", "3",
                                                  *pace.args]}, token=alice)
    assert status == 201, job
    jid = job["id"]
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    workers = lambda: get().get("workers") or {}
    world = lambda k: (lambda: workers().get("world_size") == k and not workers().get("regrouping"))
    wait(world(1), 90, "1 node", workers)
    for n in NODES[1:]:
        assert node(n, "release")[0] == 200
    wait(world(3), 120, "growth to 3", workers)

    app_port = urlparse(app.url).port
    for n in NODES:
        pid = worker_pid(jid, n)
        assert pid in cluster.pids(n), f"the worker of {n} runs in {n}'s namespace"
        env = environ_of(pid)
        store_host, _, store_port = env["HARVEST_STORE"].rpartition(":")
        assert store_host == head, env["HARVEST_STORE"]
        assert urlparse(env["HARVEST_REPORT_URL"]).hostname == head, env["HARVEST_REPORT_URL"]
        listening = {line.split()[3] for line in subprocess.run(["ss", "-tlnH"], capture_output=True, text=True)
                     .stdout.splitlines() if line.split()[3].endswith(f":{store_port}")}
        assert listening == {f"{head}:{store_port}"}, f"the job's store listens on {listening}, not only {head}"
        wait(lambda: (head, int(store_port)) in cluster.peers(n, pid), 10,
             f"{n}'s worker connected to the store at {head}:{store_port}", lambda: cluster.peers(n, pid))
    wait(lambda: [n for n in NODES if (head, app_port) in cluster.peers(n)], 30,     # rank 0 reports
         f"progress reports from a node to {head}:{app_port}", lambda: {n: cluster.peers(n) for n in NODES})
    first_loss = wait(lambda: workers().get("loss"), 30, "a loss")

    assert node(NODES[2], "reclaim")[0] == 200
    wait(world(2), 60, "shrunk to 2 by a reclaim", workers)
    wait(lambda: worker_pid(jid, NODES[2]) is None, 10, "node3's worker gone")
    assert node(NODES[2], "release")[0] == 200
    wait(world(3), 120, "growth back to 3", workers)

    victim = worker_pid(jid, NODES[1])
    os.kill(victim, signal.SIGKILL)
    wait(lambda: NODES[1] in (workers().get("lost") or []) or workers().get("world_size", 3) < 3, 15,
         "the killed worker noticed", workers)
    pace.release()
    wait(lambda: get()["state"] == "done", 300, "the job to finish", get)
    final = get()
    assert final["samples_done"] == TOTAL, final
    assert first_loss > 0
    story = final.get("workers") or {}          # a finished job keeps its losses and generations
    assert story.get("losses") and len(story.get("generations") or []) >= 3, story
    with sqlite3.connect(f"file:{app.db}?mode=ro", uri=True) as db:
        said = [d for (d,) in db.execute("SELECT detail FROM events WHERE job = ? AND kind = 'job_rescaled'", (jid,))]
    assert any(re.fullmatch(r"shrink 3 → 2 nodes in \d+\.\d\d s", d) for d in said), said
    assert any(re.match(r"grow \d → 3 nodes in \d+\.\d\d s", d) for d in said), said
    wait(lambda: not leftovers(jid), 20, "no worker left on any node")
