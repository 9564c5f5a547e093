"""Nodes that fail under a training job on a real Slurm (issue 56): the chaos test of
tests/test_chaos.py, on the test Slurm (tests/support/slurm.py, the host's 22.05) with real
workers inside the pilots (`python -m app --source slurm`, `--dispatch pilot`).

A runtime job (examples/digits_cnn.py at a slow pace, tests/support/pace.py) trains on the 3
nodes; then one node fails, the hard way:

- its pilot is SIGKILLed (the pilot job's own process on the node, not scancel): its workers die
  with it (their parent-death signal) and its connection to the hub ends without a word. The job
  shrinks and trains on, the node's leave is `lost` (not `preempted`), Slurm ends the pilot's job,
  the node gets a new pilot and the job grows back onto it.
- its slurmd is SIGKILLed, as a dead host would leave it (here the pilot and its workers run on:
  slurmstepd does not need slurmd). This module's cluster runs with `SlurmdTimeout=10` (the
  default, 300 s, is too long for a test): Slurm shows the node `not_responding` 13-17 s after
  the kill and `down` (it would end the pilot NODE_FAIL) 27-31 s after. The harvester takes
  Slurm's word: a held node Slurm says is not responding or down leaves its job at once (`lost`)
  and its pilot is cancelled; it is not offered while Slurm says so. slurmd is started again
  once the node is down: with `ReturnToService=2` (the test cluster's, as in the notes' conf)
  Slurm makes it idle as soon as it registers, without `scontrol update state=resume`, and ends
  the old pilot; a new pilot holds the node and the job grows back onto it.

Either way the job never fails, no healthy node is declared lost, and the job finishes with its
exact total samples once the pace is released. `--slurm-backoff 2`: a pilot that dies within
30 s of its hello counts against its node (core/pilots/backoff.py), and the default 20 s wait
would only stretch the test. The host's Slurm only (22.05): what is tested is the harvester's
reading of Slurm's node states, which tests/test_slurm_parse.py checks on every version.
The last test is the book's part without Slurm: the cause of each end, and a pilot that is over
holding its node again neither by a redial nor as a main job's taking."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from core.model import LEFT_LOST, LEFT_PREEMPTED, EventKind
from core.pilots.book import PilotBook
from core.pilots.hub import PilotLink
from core.slurm.records import SlurmJob, SlurmNode
from core.pilots.settings import PilotSettings
from tests.support.pace import PaceFile
from tests.support.server import ROOT, AppProcess, start_app
from tests.support.slurm import HOST_VERSION, SlurmCluster, parent, processes_with_env, start_cluster, steps_into_generation
from tests.support.waiting import wait

NODES = ["node1", "node2", "node3"]
VICTIM = "node3"
GLOBAL_BATCH = 64
STEPS = 400                      # at the pace, ~200 s: still training after the faults
STEP_S = 0.5
#: Slurm's word on a node that does not answer (slurmctld pings every SlurmdTimeout/3 or so)
SLURMD_TIMEOUT_S = 10
OFFERED = ("idle", "harvested")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = start_cluster(tmp_path_factory.mktemp("slurm-faults"), nodes=len(NODES), version=HOST_VERSION,
                      extra_conf=f"SlurmdTimeout={SLURMD_TIMEOUT_S}")
    try:
        yield c
    finally:
        left = c.stop()
        assert not left, f"left running in the Slurm namespace after stop: {left}"


@dataclass
class Watch:
    """Polls /api/cluster, the job and sinfo every 0.2 s in a thread: what was offered when."""
    app: AppProcess
    cluster: SlurmCluster
    jid: str
    nodes: dict[str, dict] = field(default_factory=dict)
    slurm: dict[str, str] = field(default_factory=dict)
    job: dict = field(default_factory=dict)
    states: set = field(default_factory=set)              # every state the job was seen in
    dead_since: dict[str, float] = field(default_factory=dict)    # node -> when it was noticed dead
    offered_while_dead: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                self.errors.append(repr(e))
            self.stop.wait(0.2)

    def poll(self) -> None:
        slurm = self.cluster.node_states()
        rows = {r["name"]: r for r in self.app.get("/api/cluster")[1]["nodes"]}
        self.slurm, self.nodes = slurm, rows
        for node, since in list(self.dead_since.items()):
            if rows[node]["state"] in OFFERED and time.monotonic() - since > 1.0:
                self.offered_while_dead.append(f"{node} {rows[node]['state']} while Slurm says {slurm[node]}")
        self.job = self.app.get(f"/api/jobs/{self.jid}")[1]
        self.states.add(self.job["state"])

    def workers(self) -> dict:
        return self.job.get("workers") or {}

    def on(self, k: int) -> bool:
        w = self.workers()
        return w.get("world_size") == k and not w.get("regrouping") and self.job.get("nodes") == k

    def step(self) -> int:
        return int(self.workers().get("committed_step") or 0)


def pilots(cluster: SlurmCluster) -> dict[str, str]:
    return {j["nodes"]: j["job_id"] for j in cluster.jobs().values()
            if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}


def lost_removals(db: Path) -> list[tuple[str, str]]:
    """(node, job) of every node a job lost, from the store's allocation changes (reason `lost`)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT job, removed FROM allocations WHERE reason = 'lost' ORDER BY id").fetchall()
    return [(n, job) for job, removed in rows for n in json.loads(removed)]


def start(cluster: SlurmCluster, tmp_path: Path) -> tuple[AppProcess, Watch, PaceFile]:
    cluster.wait_quiet()
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(), "--slurm-pilot-logs", str(tmp_path),
                    "--tfwd", "600", "--workdir", str(ROOT), "--no-profiler", "--slurm-slots", "1",
                    "--slurm-backoff", "2", "--metrics-interval", "0")     # /metrics as of now
    pace = PaceFile(tmp_path, STEP_S)
    total = GLOBAL_BATCH * STEPS
    status, job = app.request("POST", "/api/jobs", {
        "name": "digits under failing nodes", "min_nodes": 1, "max_nodes": len(NODES), "total_samples": total,
        "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0, "global_batch": GLOBAL_BATCH,
        "command": [sys.executable, "examples/digits_cnn.py", "--total-samples", str(total), "--global-batch",
                    str(GLOBAL_BATCH), "--log-every", "1000000", *pace.args]}, token=app.token("alice"))
    assert status == 201, job
    watch = Watch(app, cluster, job["id"])
    threading.Thread(target=watch.run, daemon=True, name="slurm-faults-watch").start()
    wait(lambda: watch.on(3), 150, "the job training on 3 nodes", watch.workers)
    wait(lambda: steps_into_generation(watch.workers(), 10), 30, "10 steps into the generation", watch.workers)
    return app, watch, pace


def finish(app: AppProcess, watch: Watch, pace: PaceFile) -> None:
    """Release the pace; the job ends done with its exact samples, it never failed, and only the
    victim was ever lost."""
    pace.release()
    t0, step = time.monotonic(), watch.step()
    wait(lambda: watch.job.get("state") in ("done", "failed", "cancelled"), 150, "the job's end", lambda: watch.job)
    print(f"released at step {step} of {STEPS}: done {time.monotonic() - t0:.1f} s later")
    final = app.get(f"/api/jobs/{watch.jid}")[1]
    assert final["state"] == "done" and final["samples_done"] == final["total_samples"] == GLOBAL_BATCH * STEPS, final
    assert "failed" not in watch.states, watch.states
    assert watch.offered_while_dead == [], watch.offered_while_dead
    lost = lost_removals(app.db)
    assert lost and {n for n, _ in lost} == {VICTIM}, f"a healthy node declared lost: {lost}"


def run_fault(cluster: SlurmCluster, tmp_path: Path, fault) -> None:
    app, watch, pace = start(cluster, tmp_path)
    try:
        fault(app, watch)
        finish(app, watch, pace)
    finally:
        watch.stop.set()
        app.stop()
        print(app.output()[-4000:])


def test_a_pilot_killed_outright_is_a_lost_node_the_job_trains_on_and_grows_back(cluster, tmp_path):
    def kill_pilot(app: AppProcess, watch: Watch) -> None:
        held = pilots(cluster)
        assert sorted(held) == NODES, held
        job = held[VICTIM]
        procs = processes_with_env(f"SLURM_JOB_ID={job}")
        pilot = [p for p in procs if parent(p) not in procs]      # the batch script; the workers are its children
        assert len(pilot) == 1 and len(procs) == 2, procs
        t0 = time.monotonic()
        os.kill(pilot[0], signal.SIGKILL)
        wait(lambda: watch.on(2), 30, "the job shrunk to 2 nodes", watch.workers)
        shrunk = time.monotonic() - t0
        step = watch.step()
        wait(lambda: watch.step() > step + 5, 30, "the job training on 2 nodes", watch.workers)
        m = app.metrics()
        assert m[("harvest_slurm_pilots_total", (("outcome", "lost"),))] == 1, m
        assert m[("harvest_slurm_pilots_total", (("outcome", "preempted"),))] == 0, m
        new = wait(lambda: (lambda p: p.get(VICTIM) not in (None, job) and p)(pilots(cluster)), 60,
                   f"a new pilot on {VICTIM}", lambda: cluster.jobs())
        wait(lambda: watch.on(3) and watch.nodes[VICTIM]["state"] == "harvested", 120,
             f"the job grown back onto {VICTIM}", watch.workers)
        back = time.monotonic() - t0
        assert cluster.job_state(job) not in ("RUNNING", "PENDING"), "Slurm ended the killed pilot's job"
        assert pilots(cluster)[VICTIM] == new[VICTIM]
        print(f"pilot SIGKILLed: the job on 2 nodes {shrunk:.1f} s later, on {VICTIM} again {back:.1f} s later")
    run_fault(cluster, tmp_path, kill_pilot)


def test_a_node_whose_slurmd_dies_is_left_until_slurm_says_it_is_up_and_then_used_again(cluster, tmp_path):
    def kill_slurmd(app: AppProcess, watch: Watch) -> None:
        job = pilots(cluster)[VICTIM]
        t0 = time.monotonic()
        cluster.kill_slurmd(VICTIM)
        try:
            slurmd_dead(app, watch, job, t0)
        except BaseException:
            with contextlib.suppress(RuntimeError):      # "is running": it was started again already
                cluster.start_slurmd(VICTIM)             # the module's cluster, for the tests after this one
            raise

    def slurmd_dead(app: AppProcess, watch: Watch, job: str, t0: float) -> None:
        wait(lambda: "not_responding" in watch.slurm.get(VICTIM, ""), 60, "Slurm to say the node is not responding",
             lambda: watch.slurm)
        unresponsive = time.monotonic() - t0
        # well before Slurm marks it down (~13 s later) and ends the pilot's job NODE_FAIL
        wait(lambda: watch.on(2), 10, f"the job off {VICTIM} once Slurm says it is not responding", watch.workers)
        left = time.monotonic() - t0
        assert not watch.slurm[VICTIM].startswith("down"), watch.slurm
        watch.dead_since[VICTIM] = time.monotonic()
        step = watch.step()
        wait(lambda: watch.step() > step + 5, 30, "the job training on 2 nodes", watch.workers)
        wait(lambda: watch.slurm.get(VICTIM, "").startswith("down"), 60, "Slurm to mark the node down",
             lambda: watch.slurm)
        down = time.monotonic() - t0
        assert watch.nodes[VICTIM]["state"] not in OFFERED, watch.nodes[VICTIM]
        t1 = time.monotonic()
        cluster.start_slurmd(VICTIM)
        wait(lambda: not {"down", "not_responding"} & set(watch.slurm.get(VICTIM, "down").split("+")), 60,
             "Slurm to say the node is up", lambda: watch.slurm)
        up = time.monotonic() - t1
        watch.dead_since.pop(VICTIM)
        wait(lambda: pilots(cluster).get(VICTIM) not in (None, job), 60, f"a new pilot on {VICTIM}",
             lambda: cluster.jobs())
        wait(lambda: watch.on(3) and watch.nodes[VICTIM]["state"] == "harvested", 120,
             f"the job grown back onto {VICTIM}", watch.workers)
        back = time.monotonic() - t1
        assert app.get("/api/cluster")[1]["source"]["state"] == "ok"
        print(f"slurmd SIGKILLed: not responding {unresponsive:.1f} s later, the job off the node {left:.1f} s, "
              f"down {down:.1f} s; slurmd started again: up {up:.1f} s later, the job on it {back:.1f} s later")
    run_fault(cluster, tmp_path, kill_slurmd)


# ---- the book's part, without Slurm ------------------------------------------------------------
def slurm_nodes(**states: str) -> dict[str, SlurmNode]:
    return {n: SlurmNode(n, s.split("+")[0], tuple(s.split("+")[1:]), ("scavenger",)) for n, s in states.items()}


def pilot_link(job: str, node: str, leaving: bool = False) -> PilotLink:
    return PilotLink(job, node, 1, None, time.time(), leaving=leaving)


def test_the_book_takes_slurms_word_on_a_nodes_health(tmp_path):
    b = PilotBook(PilotSettings(log_dir=str(tmp_path)), NODES)
    b.want(3, NODES)
    for job, node in (("41", "node1"), ("42", "node2"), ("43", "node3")):
        b.submitted(job, node)
        assert b.hello(pilot_link(job, node)) == "join"
    b.take_events()
    # slurmd of node2 stopped answering: its node leaves, lost, and its pilot is to be cancelled
    assert b.unreachable(slurm_nodes(node1="allocated", node2="allocated+not_responding", node3="mixed")) == ["42"]
    (ev,) = b.take_events()
    assert (ev.kind, ev.node, ev.cause) == (EventKind.NODE_LEAVE, "node2", LEFT_LOST), ev
    assert "not_responding" in ev.detail and b.backoff.failing() == {}, "the node's fault, not its pilot's"
    assert b.unreachable(slurm_nodes(node2="down+not_responding")) == [], "once"
    for state in ("allocated+not_responding", "down+not_responding", "down", "idle+not_responding"):
        assert b.free_nodes(slurm_nodes(node2=state)) == [], state
    # squeue shows the cancelled pilot ended; slurmd comes back and Slurm ends the pilot: its redial
    # is no new pilot, and its goodbye is no main job's taking (the node is free once idle)
    b.check({"41": SlurmJob("41", "harvest-pilot", "RUNNING", "node1", "scavenger", "u"),
             "42": SlurmJob("42", "harvest-pilot", "CANCELLED", "node2", "scavenger", "u"),
             "43": SlurmJob("43", "harvest-pilot", "RUNNING", "node3", "scavenger", "u")}, {"41", "42", "43"}, {})
    assert b.hello(pilot_link("42", "node2")) == "stray"
    assert not b.leave(pilot_link("42", "node2", leaving=True), "SIGTERM") and b.was_cancelled("42")
    assert b.free_nodes(slurm_nodes(node1="allocated", node2="idle", node3="allocated")) == ["node2"]
    # Slurm ends pilots itself: NODE_FAIL is the node's loss, PREEMPTED a taking
    b.check({"41": SlurmJob("41", "harvest-pilot", "PREEMPTED", "node1", "scavenger", "u"),
             "43": SlurmJob("43", "harvest-pilot", "NODE_FAIL", "node3", "scavenger", "u")}, {"41", "43"}, {})
    causes = {ev.node: ev.cause for ev in b.take_events() if ev.kind is EventKind.NODE_LEAVE}
    assert causes == {"node1": LEFT_PREEMPTED, "node3": LEFT_LOST}, causes
    assert b.hello(pilot_link("43", "node3")) == "stray", "a pilot Slurm ended does not hold its node again"
