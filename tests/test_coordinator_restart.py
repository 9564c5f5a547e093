"""A coordinator that dies (its harvester killed) and a new one on the same port with the same
secret (the harvester restarted): workers started with HARVEST_ORPHAN_S train on while the store
is away, redial it and rejoin, and the job goes on from their memory: same processes, same
generation, no regroup, no step lost. Without a new coordinator they leave after the timeout."""
from __future__ import annotations

import time
from pathlib import Path

from core.runtime.coordinator import JobCoordinator
from tests.support.waiting import wait
from tests.support.workers import WorkerProcs

GB = 64
TOTAL = GB * 100_000
ARGS = ("--log-every", "1000000", "--step-seconds", "0.02")


def _training(c: WorkerProcs, steps: int) -> None:
    """Workers on A and B, one generation on both, `steps` committed."""
    for n in "AB":
        c.start(n)
    wait(lambda: {"A", "B"} <= c.coord.ready(), 60, "A and B ready", c.diag)
    c.coord.regroup(["A", "B"])
    wait(lambda: c.step() >= steps, 30, f"{steps} steps on 2 nodes", c.diag)


def _die(coord: JobCoordinator) -> None:
    """The harvester's death as the workers see it: the store goes, nothing is said."""
    coord._release()


def test_workers_train_through_a_restart_and_rejoin_the_new_coordinator(tmp_path: Path) -> None:
    old = JobCoordinator("digits", GB, TOTAL, orphan_s=60)
    c, new = WorkerProcs(tmp_path, old, ARGS), None
    try:
        _training(c, 20)
        pids = {n: p.pid for n, p in c.procs.items()}
        at_kill = c.step()
        _die(old)
        time.sleep(3.0)                                   # the harvester is away: they train on
        assert all(p.poll() is None for p in c.procs.values()), "the workers outlive their coordinator"
        new = JobCoordinator("digits", GB, TOTAL, port=old.address[1], secret=old.secret, token=old.token,
                             orphan_s=60)
        c.coord = new
        t0 = time.monotonic()
        st = wait(lambda: (lambda s: s if s["phase"] == "running" and s["members"] == ["A", "B"]
                           and set(new.rejoined()) == {"A", "B"}
                           and s["committed_step"] > at_kill else None)(new.status()), 20,
                  "the job running on A and B again", c.diag)
        print(f"rejoined {time.monotonic() - t0:.2f} s after the new coordinator started; step {at_kill} at the "
              f"kill, {st['committed_step']} now")
        gens = new.generations()
        assert [g["gen"] for g in gens] == [1] and gens[0]["reason"] == "resumed", gens
        assert st["generation"] == 1 and st["lost_samples"] == 0
        assert {n: p.pid for n, p in c.procs.items()} == pids, "the same processes"
        step = wait(lambda: (lambda s: s if s >= at_kill + 100 else None)(new.status()["committed_step"]), 30,
                    "training on with the new coordinator", c.diag)
        assert step > at_kill
        # the command stream goes on where it was: a regroup through the new coordinator works
        assert new.regroup(["A"]) == 2
        wait(c.first_step_of(2), 30, "first step of generation 2 on A", c.diag)
        assert new.status()["committed_step"] >= step
    finally:
        c.kill_all()
        (new or old).close(grace_s=0.5)
        old.close(grace_s=0.1)


def test_workers_leave_when_no_coordinator_comes_back_within_the_timeout(tmp_path: Path) -> None:
    coord = JobCoordinator("digits", GB, TOTAL, orphan_s=3)
    c = WorkerProcs(tmp_path, coord, ARGS)
    try:
        _training(c, 10)
        _die(coord)
        t0 = time.monotonic()
        codes = {n: p.wait(30) for n, p in c.procs.items()}
        took = time.monotonic() - t0
        assert codes == {"A": 3, "B": 3}, codes          # EXIT_ORPHANED
        assert 3.0 <= took < 15, took
    finally:
        c.kill_all()
        coord.close(grace_s=0.1)
