"""Nodes with 2 ranks each (GPU slots; gloo on this CPU machine), end to end through the API, for
local processes and for ssh to a real loopback sshd: a job starts on 2 nodes (4 ranks), grows to
3 (6 ranks), a node reclaimed by staff takes both its processes within 2 s, a SIGKILL of one rank
takes its node (both ranks) out while the job goes on, and the job finishes with exactly its
samples; every generation's ranks hold equal parameters at each sync and stop, and each process
sees its own RANK, LOCAL_RANK, NODE_RANK."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from core.runtime import ranks
from tests.support.procs import environ_of, leftovers, worker_pid
from tests.support.server import ROOT, start_app
from tests.support.pace import PaceFile
from tests.support.waiting import wait

GLOBAL_BATCH = 60                  # not a multiple of 4: the shards of 4 and 6 ranks differ in size
TOTAL = GLOBAL_BATCH * 900
SLOTS = 2


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture(params=["local", "ssh"])
def cluster(request, tmp_path):
    """(app, node names) with 3 nodes of 2 slots, the third reclaimed at the start."""
    if request.param == "local":
        nodes = [f"local-{i}" for i in range(3)]
        args = ["--dispatch", "local", "--local-nodes", "3", "--local-slots", str(SLOTS)]
    else:
        sshd = request.getfixturevalue("sshd_server")
        nodes = ["node0", "node1", "node2"]
        inventory = tmp_path / "nodes.txt"
        inventory.write_text("".join(f"{n} {n} {SLOTS}\n" for n in nodes))
        args = ["--dispatch", "ssh", "--nodes", str(inventory), "--ssh-config", str(sshd.client_config),
                "--workdir", str(ROOT)]
    app = start_app(tmp_path, "--fresh", "--tick", "0.1", "--no-profiler", *args)
    yield app, nodes
    app.stop()


def _check_generation(g: dict) -> None:
    """Equal parameters on every rank at the sync and at the stop; each rank's place as the
    script saw it matches its key: rank = position, local rank = slot, node rank = its node's
    position, and torchrun's variables say the same."""
    members = g["members"]
    synced = {s["checksum"] for s in g["synced"].values()}
    assert len(synced) == 1, g
    if len(g["stopped"]) == len(members):
        assert len({s["checksum"] for s in g["stopped"].values()}) == 1, g
    nodes = ranks.nodes_of(members)
    blocks = [ranks.node_of(k) for i, k in enumerate(members)
              if i == 0 or ranks.node_of(members[i - 1]) != ranks.node_of(k)]
    assert blocks == nodes, f"the ranks of a node are not consecutive: {members}"
    for key, s in g["synced"].items():
        place = s["place"]
        want = {"rank": members.index(key), "local_rank": ranks.slot_of(key),
                "node_rank": nodes.index(ranks.node_of(key)), "nodes": len(nodes),
                "local_world_size": sum(1 for k in members if ranks.node_of(k) == ranks.node_of(key))}
        assert {k: place[k] for k in want} == want, (key, g)
        assert place["env"] == {"RANK": str(want["rank"]), "WORLD_SIZE": str(len(members)),
                                "LOCAL_RANK": str(want["local_rank"]), "NODE_RANK": str(want["node_rank"]),
                                "LOCAL_WORLD_SIZE": str(want["local_world_size"])}, (key, g)
        assert place["device"] == "cpu"


def test_two_ranks_per_node_grow_reclaim_crash_and_finish(cluster, tmp_path):
    pace = PaceFile(tmp_path, 0.03)
    app, nodes = cluster
    staff, alice = app.token("staff1"), app.token("alice")
    node = lambda n, cmd: app.request("POST", f"/api/nodes/{n}/{cmd}", token=staff)
    assert node(nodes[2], "reclaim")[0] == 200
    status, job = app.request("POST", "/api/jobs", {
        "name": "digits, 2 ranks per node", "min_nodes": 1, "max_nodes": 3, "total_samples": TOTAL,
        "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": GLOBAL_BATCH, "command": [sys.executable, "examples/digits_cnn.py", "--seed", "3",
                                                  *pace.args]},
        token=alice)
    assert status == 201, job
    jid = job["id"]
    seen: dict[int, dict] = {}

    def workers() -> dict:
        w = app.get(f"/api/jobs/{jid}")[1].get("workers") or {}
        for g in w.get("generations") or []:
            seen[g["gen"]] = g
        return w

    at = lambda n: (lambda: (lambda w: w.get("nodes") == n and w.get("world_size") == n * SLOTS
                             and not w.get("regrouping"))(workers()))
    wait(at(2), 120, "2 nodes x 2 ranks", workers)
    for key in ranks.keys_of(nodes[0], SLOTS) + ranks.keys_of(nodes[1], SLOTS):
        pid = worker_pid(jid, key)
        assert pid, f"no worker for {key}"
        env = environ_of(pid)
        assert env["LOCAL_RANK"] == str(ranks.slot_of(key)) and env["LOCAL_WORLD_SIZE"] == str(SLOTS), env
        assert env["NODE_RANK"] in ("0", "1") and env["WORLD_SIZE"] == "4", env

    assert node(nodes[2], "release")[0] == 200
    wait(at(3), 120, "growth to 3 nodes x 2 ranks", workers)

    pids = [worker_pid(jid, k) for k in ranks.keys_of(nodes[1], SLOTS)]
    assert all(pids), pids
    t0 = time.monotonic()
    assert node(nodes[1], "reclaim")[0] == 200
    wait(lambda: all(_gone(p) for p in pids), 10, f"both ranks of {nodes[1]} gone")
    vacate_s = time.monotonic() - t0
    assert vacate_s < 2.0, vacate_s
    wait(at(2), 60, "2 nodes after the reclaim", workers)
    assert node(nodes[1], "release")[0] == 200
    wait(at(3), 120, "back to 3 nodes", workers)

    victim_key = ranks.worker_key(nodes[0], 1, SLOTS)
    victim, mate = worker_pid(jid, victim_key), worker_pid(jid, ranks.worker_key(nodes[0], 0, SLOTS))
    assert victim and mate
    os.kill(victim, signal.SIGKILL)
    wait(lambda: _gone(mate), 15, "the killed rank's node-mate stopped too")
    wait(lambda: nodes[0] not in ranks.nodes_of(workers().get("members") or [nodes[0]]), 15,
         "the node out of the group", workers)

    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    pace.release()
    wait(lambda: (workers(), get()["state"] == "done")[1], 300, "the job to finish", get)
    final = get()
    assert final["samples_done"] == TOTAL, final
    wait(lambda: not leftovers(jid), 20, "no worker left")
    assert len(seen) >= 5, sorted(seen)
    for g in seen.values():
        if g["synced"] and len(g["synced"]) == len(g["members"]):
            _check_generation(g)
    sizes = {len(g["members"]) for g in seen.values()}
    assert {4, 6} <= sizes, sizes
    assert all(n % SLOTS == 0 for n in sizes), f"a node's ranks came or went apart: {sizes}"
    print(f"vacate of a 2-rank node: {vacate_s:.2f} s; generations seen: {sorted(seen)}")
