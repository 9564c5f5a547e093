"""A harvester on a real Slurm (tests/support/slurm.py) killed with SIGKILL and started again on
the same store: its pilots keep their nodes and redial the hub, which listens where it did with
the same certificate and token (`<db>.hub`); the job's workers train on meanwhile and rejoin a
coordinator on their store's old port; no pilot is cancelled or submitted anew, and the job goes
on from the workers' memory. A restart that never comes: pilots give their nodes back after
`--slurm-orphan-timeout`."""
from __future__ import annotations

import signal
import sqlite3
import time

import pytest

from tests.support.server import ROOT, start_app
from tests.support.slurm import DIGITS_BATCH, processes_with_env, slurm_cluster, steps_into_generation, submit_digits  # noqa: F401  (the fixture)
from tests.support.waiting import wait

NODES = [f"node{i}" for i in range(1, 9)]
ORPHAN_S = 20


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.wait_quiet()
    yield slurm_cluster
    slurm_cluster.wait_quiet()


def _pilots(cluster, states=("RUNNING", "PENDING")) -> dict[str, str]:
    """Pilot job id -> its node (or '' pending)."""
    return {j["job_id"]: j["nodes"] for j in cluster.jobs().values()
            if j["name"] == "harvest-pilot" and j["job_state"] in states}


def test_a_killed_harvester_is_restarted_with_its_pilots_and_the_job_trains_on(cluster, tmp_path):
    args = ("--source", "slurm", *cluster.app_args(), "--slurm-pilot-logs", str(tmp_path),
            "--tfwd", "600", "--workdir", str(ROOT), "--no-profiler", "--slurm-slots", "1",
            "--slurm-orphan-timeout", str(ORPHAN_S))
    app = start_app(tmp_path / "app", *args)
    again = None
    try:
        jid = submit_digits(app, "digits through a restart", 8)
        workers = lambda a: a.get(f"/api/jobs/{jid}")[1].get("workers") or {}
        on8 = lambda a: (lambda w: w if w.get("world_size") == 8 and not w.get("regrouping") else None)(workers(a))
        wait(lambda: on8(app), 180, "the job training on 8 nodes", lambda: workers(app))
        st = wait(lambda: (lambda w: w if w and steps_into_generation(w, 20) else None)(on8(app)), 60,
                  "20 steps into the generation", lambda: workers(app))
        pilots = _pilots(cluster)
        assert sorted(pilots.values()) == NODES, pilots
        pids = set(processes_with_env(f"HARVEST_JOB={jid}"))
        assert len(pids) == 8
        gen_start = st["last_rescale"]["start_step"] or 0

        assert app.stop(signal.SIGKILL) == -signal.SIGKILL
        at_kill = workers_step = st["committed_step"]
        time.sleep(2.0)
        assert _pilots(cluster) == pilots, "the pilots outlive the harvester"
        assert set(processes_with_env(f"HARVEST_JOB={jid}")) == pids, "so do the workers"

        t_restart = time.monotonic()
        again = start_app(tmp_path / "app", *args, db=app.db, users=tmp_path / "app" / "users.json")
        t_up = time.monotonic()
        seen: list[float] = []

        def training() -> dict | None:
            j = again.get(f"/api/jobs/{jid}")[1]
            seen.append(j["samples_done"])
            w = j.get("workers") or {}
            return w if (w.get("world_size") == 8 and w["committed_step"] > workers_step and
                         j["state"] == "running" and j["nodes"] == 8) else None
        w = wait(training, 10, "the job training on 8 nodes within 10 s of the restart",
                 lambda: (workers(again), again.output()[-3000:]), period=0.1)
        took = time.monotonic() - t_up
        print(f"training again {time.monotonic() - t_restart:.2f} s after the restart command, {took:.2f} s after "
              f"the restarted harvester answered; step {at_kill} at the kill, "
              f"{w['committed_step']} now, generation {w['generation']}")
        first = wait(lambda: (lambda s: s if s > at_kill + 20 else None)(workers(again)["committed_step"]), 30,
                     "training on", lambda: workers(again))
        assert first > at_kill
        assert min(seen) >= gen_start * DIGITS_BATCH, (min(seen), at_kill, gen_start)   # at the kill, less its generation's steps
        assert _pilots(cluster) == pilots, "no pilot cancelled or submitted anew: the same Slurm job ids"
        assert set(processes_with_env(f"HARVEST_JOB={jid}")) == pids, "the same worker processes"
        assert workers(again)["lost_samples"] == 0

        def kinds() -> list[str]:
            with sqlite3.connect(app.db) as db:
                return [r[0] for r in db.execute("SELECT kind FROM events WHERE job = ? ORDER BY id", (jid,))]
        wait(lambda: {"harvester_crash", "workers_adopted"} <= set(kinds()), 10,
             "the crash and the adoption in the job's event log", kinds)

        # a restart that never comes: the pilots wait ORPHAN_S, then give their nodes back
        assert again.stop(signal.SIGKILL) == -signal.SIGKILL
        t_kill = time.monotonic()
        wait(lambda: not _pilots(cluster), ORPHAN_S + 30, "the pilots gone after the orphan timeout",
             lambda: _pilots(cluster))
        gone = time.monotonic() - t_kill
        print(f"pilots ended {gone:.1f} s after the kill (orphan timeout {ORPHAN_S} s)")
        assert gone >= ORPHAN_S - 1, "not before the timeout"
        wait(lambda: all(cluster.node_states()[n] == "idle" for n in NODES), 30, "every node idle in Slurm",
             cluster.node_states)
        wait(lambda: not processes_with_env(f"HARVEST_JOB={jid}"), 15, "no worker left")
    finally:
        for a in (again, app):
            if a is not None:
                a.stop()
                print(a.output()[-2000:])
