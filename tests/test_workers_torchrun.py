"""A `launcher: torchrun` job end to end through the API, with local processes and over ssh to a
real loopback sshd: examples/torchrun_digits.py (which imports nothing of ours) starts on 1 node,
grows to 3, shrinks when staff reclaim a node, restarts from its checkpoint each time (every
generation's rank 0 starts exactly where the previous generation's last checkpoint was), the
profiler learns a restart cost near the measured ones, and the job finishes with exactly its
samples; no process is left behind."""
from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.support.procs import leftovers
from tests.support.server import ROOT, start_app
from tests.support.pace import PaceFile
from tests.support.waiting import wait

GLOBAL_BATCH = 64
TOTAL = GLOBAL_BATCH * 1500
SCRIPT = "examples/torchrun_digits.py"


@pytest.fixture(params=["local", "ssh"])
def cluster(request, tmp_path):
    if request.param == "local":
        nodes = [f"local-{i}" for i in range(3)]
        args = ["--dispatch", "local", "--local-nodes", "3"]
    else:
        sshd = request.getfixturevalue("sshd_server")
        nodes = ["node0", "node1", "node2"]
        inventory = tmp_path / "nodes.txt"
        inventory.write_text("".join(f"{n} {n}\n" for n in nodes))
        args = ["--dispatch", "ssh", "--nodes", str(inventory), "--ssh-config", str(sshd.client_config),
                "--workdir", str(ROOT)]
    app = start_app(tmp_path, "--fresh", "--tick", "0.1", "--profile-sizes", "0", *args)
    yield app, nodes
    app.stop()


def _generations(logdir: Path) -> dict[int, str]:
    """Rank 0's output of each generation (only rank 0 prints progress)."""
    out: dict[int, str] = {}
    for log in logdir.glob("*-g*.log"):
        gen = int(re.search(r"-g(\d+)\.log$", log.name).group(1))
        text = log.read_text(errors="replace")
        if "start step=" in text:
            out[gen] = text
    return out


def _samples(line_kind: str, text: str) -> list[int]:
    return [int(m) for m in re.findall(rf"^{line_kind} step=\d+ samples=(\d+)", text, re.M)]


def test_a_torchrun_job_restarts_from_its_checkpoint_on_every_change(cluster, tmp_path):
    pace = PaceFile(tmp_path, 0.03)
    app, nodes = cluster
    staff, alice = app.token("staff1"), app.token("alice")
    node = lambda n, cmd: app.request("POST", f"/api/nodes/{n}/{cmd}", token=staff)
    for n in nodes[1:]:
        assert node(n, "reclaim")[0] == 200
    status, job = app.request("POST", "/api/jobs", {
        "name": "torchrun digits", "launcher": "torchrun", "min_nodes": 1, "max_nodes": 3,
        "total_samples": TOTAL, "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "stop_grace_seconds": 20,
        "command": [sys.executable, SCRIPT, "--total-samples", str(TOTAL), "--global-batch", str(GLOBAL_BATCH),
                    *pace.args, "--checkpoint-every", "50", "--log-every", "5"]}, token=alice)
    assert status == 201, job
    jid = job["id"]
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    assert get()["launcher"] == "torchrun"
    nodes_now = lambda k: (lambda: (lambda j, w: j["nodes"] == k and w.get("world_size") == k
                                    and w.get("progressing"))(*(lambda j: (j, j.get("workers") or {}))(get())))
    wait(nodes_now(1), 120, "1 node training", get)
    for n in nodes[1:]:
        assert node(n, "release")[0] == 200
    wait(nodes_now(3), 180, "growth to 3 nodes", get)
    assert node(nodes[2], "reclaim")[0] == 200
    wait(nodes_now(2), 180, "2 nodes after the reclaim", get)
    pace.release()
    wait(lambda: get()["state"] == "done", 400, "the job to finish", get)
    final = get()
    assert final["samples_done"] == TOTAL, final
    wait(lambda: not leftovers(jid), 30, "no process left")

    gens = _generations(Path(str(app.db) + ".workers") / jid)
    assert len(gens) >= 3, sorted(gens)
    order = sorted(gens)
    for before, after in zip(order, order[1:]):
        saved = _samples("checkpoint", gens[before])
        starts = _samples("start", gens[after])
        assert saved and starts, (before, after)
        assert starts[0] == saved[-1], f"generation {after} started at {starts[0]}, the checkpoint held {saved[-1]}"
    assert _samples("done", gens[order[-1]]) == [TOTAL]

    db = sqlite3.connect(app.db)
    measured = [s for (s,) in db.execute("SELECT value FROM samples WHERE job = ? AND kind IN ('up', 'down')", (jid,))]
    assert measured, "no restart cost was measured"
    profile = final["profile"] or get()["profile"]
    learned = [profile["scale_up_seconds"], profile["scale_down_seconds"]]
    lo, hi = min(measured), max(measured)
    assert all(0.5 * lo <= c <= 1.5 * hi for c in learned), (learned, measured)
    print(f"restart costs measured {measured}, learned up/down {learned}")
