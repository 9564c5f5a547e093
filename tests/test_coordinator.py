"""Elastic runtime with real processes: one coordinator, "nodes" = local worker processes running
examples/digits_cnn.py with the coordinator's environment (gloo on localhost)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.runtime import protocol as P
from core.runtime.coordinator import JobCoordinator
from core.runtime.reports import ReportBook, ReportServer
from tests.support.waiting import wait
from tests.support.workers import EXAMPLE, WorkerProcs, worker_env

ROOT = Path(__file__).resolve().parent.parent
GB = 64
STEPS = 1000
TOTAL = GB * STEPS


def _json_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


#: the workers of the grow/shrink/kill/leave/restore test: checkpoints every step
CLUSTER_ARGS = ("--checkpoint-every", "1", "--log-every", "100", "--lr", "0.05", "--seed", "0")


@pytest.fixture
def job(tmp_path: Path):
    book = ReportBook()
    server = ReportServer(book)
    coord = JobCoordinator("digits", GB, TOTAL, report_url=server.url_for("digits"),
                           pg_timeout_s=10.0, extra_env={P.ENV_REPORT_INTERVAL: "0.25"})
    book.register("digits", coord.token)
    cluster = WorkerProcs(tmp_path, coord, ("--checkpoint-dir", str(tmp_path / "ckpt"), *CLUSTER_ARGS))
    try:
        yield cluster, book, server
    finally:
        cluster.kill_all()
        coord.close(grace_s=0.5)
        server.close()


def test_grow_shrink_kill_leave_restore(job) -> None:
    c, book, server = job
    coord = c.coord
    for node in "ABCDE":                     # E waits warm until every other node is gone
        c.start(node)
    wait(lambda: {"A", "B"} <= coord.ready(), 30, "A and B ready", c.diag, 0.01)
    assert coord.regroup(["A", "B"]) == 1
    wait(lambda: c.step() >= 80, 20, "80 steps on 2 nodes", c.diag, 0.01)
    wait(lambda: {"C", "D", "E"} <= coord.ready(), 30, "C, D, E warm", c.diag, 0.01)

    assert coord.regroup(["A", "B", "C"]) == 2                    # grow
    wait(c.first_step_of(2), 20, "first step on 3 nodes", c.diag, 0.01)
    busy = coord.status()
    assert busy["world_size"] == 3 and busy["members"] == ["A", "B", "C"]
    wait(lambda: c.step() >= 200, 20, "200 steps", c.diag, 0.01)
    running = coord.status()
    assert running["samples_per_second"] and running["step_time_s"] and running["loss"] is not None

    assert coord.regroup(["A"]) == 3                              # shrink
    coord.dismiss("C")                                            # C leaves for good, cleanly
    wait(c.first_step_of(3), 20, "first step on 1 node", c.diag, 0.01)
    assert c.procs["C"].wait(10) == 0
    wait(lambda: c.step() >= 300, 20, "300 steps", c.diag, 0.01)

    assert coord.regroup(["A", "B", "D"]) == 4                    # grow again
    wait(c.first_step_of(4), 20, "first step on 3 nodes", c.diag, 0.01)
    wait(lambda: c.step() >= 420, 20, "420 steps", c.diag, 0.01)

    c.procs["D"].send_signal(signal.SIGKILL)                      # a node dies mid-training
    coord.node_lost("D")
    wait(c.first_step_of(5), 20, "first step after losing D", c.diag, 0.01)
    assert coord.status()["members"] == ["A", "B"]
    assert c.procs["D"].wait(5) == -signal.SIGKILL
    wait(lambda: c.step() >= 520, 20, "520 steps", c.diag, 0.01)

    c.procs["B"].send_signal(signal.SIGTERM)                      # preempted: leaves at a step boundary
    assert c.procs["B"].wait(10) == 0
    wait(c.first_step_of(6), 20, "first step after B left", c.diag, 0.01)
    assert coord.status()["members"] == ["A"]
    wait(lambda: c.step() >= 620, 20, "620 steps", c.diag, 0.01)

    c.procs["A"].send_signal(signal.SIGTERM)                      # the last node is preempted
    assert c.procs["A"].wait(10) == 0
    wait(lambda: coord.status()["phase"] == "idle", 20, "job paused at 0 nodes", c.diag, 0.01)
    paused = coord.status()
    assert paused["world_size"] == 0 and paused["ready"] == ["E"]
    left_at = paused["committed_step"]
    assert 620 <= left_at < STEPS

    assert coord.regroup(["E"]) == 7                              # restores A's last checkpoint
    wait(lambda: coord.status()["finished"], 40, "job finished", c.diag, 0.01)
    assert c.procs["E"].wait(10) == 0

    # exact accounting: nothing lost (A checkpointed when it left), nothing counted twice
    final = coord.status()
    assert final["samples_done"] == TOTAL and final["committed_step"] == STEPS
    assert final["lost_samples"] == 0

    gens = coord.generations()
    assert [g["members"] for g in gens] == [
        ["A", "B"], ["A", "B", "C"], ["A"], ["A", "B", "D"], ["A", "B"], ["A"], ["E"]]
    assert [g["reason"] for g in gens] == ["regroup"] * 4 + ["node_lost", "leave", "regroup"]
    for g in gens:
        synced = {s["checksum"] for s in g["synced"].values()}
        assert len(g["synced"]) == len(g["members"]) and len(synced) == 1, g   # identical replicas
        at_step: dict[int, set] = {}
        for s in g["stopped"].values():
            at_step.setdefault(s["step"], set()).add(s["checksum"])
        assert all(len(sums) == 1 for sums in at_step.values()), g            # same step, same state
    for before, after in zip(gens, gens[1:]):
        assert after["start_step"] == before["end_step"], (before, after)       # no step lost
        newest = {s["checksum"] for s in before["stopped"].values() if s["step"] == before["end_step"]}
        assert {s["checksum"] for s in after["synced"].values()} == newest, (before, after)
    # the restored state is exactly what A held when it left
    assert gens[6]["start_step"] == left_at and gens[6]["synced"]["E"]["restored"]
    assert gens[6]["synced"]["E"]["checksum"] == gens[5]["stopped"]["A"]["checksum"]
    assert gens[5]["stopped"]["A"]["reason"] == P.STOP_LEAVING
    assert gens[4]["stopped"]["B"]["reason"] == P.STOP_LEAVING
    # a survivor either failed the collective D died in or, if it reached the step boundary first,
    # took the coordinator's stop. A ring all-reduce can complete on one survivor and fail on the
    # other, so they may stop a step apart: the next generation goes on from the newer (above).
    assert {s["reason"] for s in gens[3]["stopped"].values()} <= {P.STOP_FAILED, P.STOP_ASKED}
    assert set(gens[3]["stopped"]) == {"A", "B"}                 # D died without a word

    latencies = {g["gen"]: (g["prev_size"], len(g["members"]), g["decision_s"], g["switch_s"])
                 for g in gens[1:]}
    print("\nrescale latency, decision -> first step at the new size:")
    for gen, (a, b, decision, switch) in latencies.items():
        print(f"  gen {gen}: {a} -> {b} nodes  {decision * 1000:7.1f} ms  (pause {switch * 1000:.1f} ms)")
    for gen, (_, _, decision, switch) in latencies.items():
        assert 0 < switch <= decision < 5.0, (gen, decision, switch)

    # progress reports reached the HTTP endpoint with the job's token, and the loss went down
    reports = book.reports("digits")
    assert len(reports) >= 5 and book.refused == 0
    losses = [r["loss"] for r in reports if r.get("loss") is not None]
    first, last = sum(losses[:2]) / 2, sum(losses[-3:]) / 3
    print(f"loss: first reports {first:.3f}, last reports {last:.3f} ({len(reports)} reports)")
    assert last < 0.5 * first
    result = _json_lines(c.tmp / "E.log")[-1]
    assert result["final"] and result["samples"] == TOTAL and result["test_accuracy"] > 0.6

    # a report with another token is refused
    req = urllib.request.Request(server.url_for("digits"), data=b'{"step": 1}', method="POST",
                                 headers={"Authorization": "Bearer not-the-token"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 401 and book.refused == 1


def test_report_book_checks_tokens() -> None:
    book = ReportBook(keep=3)
    book.register("j1", "secret-1")
    book.register("j2", "secret-2")
    assert book.accept("j1", "secret-1", {"step": 1})
    assert not book.accept("j1", "secret-2", {"step": 2})       # another job's token
    assert not book.accept("j3", "secret-1", {"step": 3})       # unknown job
    assert not book.accept("j1", "", {"step": 4})
    assert book.accept_http("j2", "Bearer secret-2", b'{"step": 5}') == 204
    assert book.accept_http("j2", "Bearer secret-1", b'{"step": 6}') == 401
    assert book.accept_http("j2", "secret-2", b'{"step": 7}') == 401   # not a bearer header
    assert book.accept_http("j2", "Bearer secret-2", b"[1, 2]") == 400
    assert book.accept_http("j2", "Bearer secret-2", b'{"step": 8, "loss": NaN}') == 400
    assert book.accept_http("j2", "Bearer secret-2", b'{"step": 9, "rate": -Infinity}') == 400
    for i in range(5):
        book.accept("j1", "secret-1", {"step": 10 + i})
    assert [r["step"] for r in book.reports("j1")] == [12, 13, 14]
    assert book.latest("j2")["step"] == 5 and book.refused == 5
    book.revoke("j1")
    assert not book.accept("j1", "secret-1", {"step": 99})


def test_shard_is_the_same_global_batch_at_any_world_size() -> None:
    from core.runtime import elastic
    job = elastic.init(64, 1000, seed=3, handle_sigterm=False)
    job._dataset_size = 300
    for step in (0, 4, 9, 15):                       # 15 = the partial last step (40 samples)
        batches = []
        for world in (1, 2, 3, 5):
            job.world_size = world
            parts = []
            for rank in range(world):
                job.rank = rank
                parts.append(job.shard(step).tolist())
            assert sum(len(p) for p in parts) == P.batch_of_step(step, 1000, 64)
            batches.append(sorted(i for p in parts for i in p))
        assert all(b == batches[0] for b in batches)
    job.world_size, job.rank = 1, 0
    walk = [i for s in range(10) for i in job.shard(s).tolist()]                # 640 positions
    assert sorted(walk[:300]) == list(range(300)) == sorted(walk[300:600])    # once per epoch
    assert walk[:300] != walk[300:600]                                         # reshuffled
    assert P.total_steps(1000, 64) == 16 and P.samples_after(16, 1000, 64) == 1000


def test_example_runs_standalone_and_resumes(tmp_path: Path) -> None:
    cmd = [sys.executable, str(EXAMPLE), "--total-samples", "6400", "--global-batch", "64",
           "--checkpoint-dir", str(tmp_path), "--log-every", "20"]
    first = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    lines = _json_lines_text(first.stdout)
    losses = [r["loss"] for r in lines if "loss" in r]
    assert losses[-1] < 0.6 * losses[0]
    assert lines[-1]["final"] and lines[-1]["step"] == 100 and lines[-1]["test_accuracy"] > 0.5
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 100
    again = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    resumed = _json_lines_text(again.stdout)
    assert len(resumed) == 1 and resumed[0]["step"] == 100       # restored: nothing left to run
    assert resumed[0]["test_accuracy"] == lines[-1]["test_accuracy"]


def _json_lines_text(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_late_calls_about_an_old_worker_spare_the_new_one() -> None:
    coord = JobCoordinator("inc", GB, TOTAL)
    try:
        first = coord.worker_env("X")
        second = coord.worker_env("X")                    # the node's worker was restarted
        assert (first[P.ENV_INCARNATION], second[P.ENV_INCARNATION]) == ("1", "2")
        coord.node_lost("X", incarnation=1)                # news about the old process
        coord.dismiss("X", incarnation=1)
        assert coord.status()["workers"] == {"X": "starting"} and coord.status()["lost"] == []
        coord.node_lost("X", incarnation=2)
        assert coord.status()["workers"] == {"X": "gone"} and coord.status()["lost"] == ["X"]
        with pytest.raises(ValueError):
            coord.regroup(["Y"])                           # no worker was ever started there
    finally:
        coord.close(wait=False)
