"""examples/digits_cnn.py learns what it claims, with its defaults: test accuracy >= 0.9 alone (world
size 1), at the README's --lr 0.1 past the step where a constant learning rate used to kill every
hidden unit (loss back at ln 10 = 2.30 from step ~1,400, accuracy 0.10), and through regroups
1 -> 2 -> 1 nodes under a JobCoordinator (local worker processes, as in tests/test_coordinator.py),
finishing with exactly its total samples."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.runtime.coordinator import JobCoordinator
from tests.support.pace import PaceFile
from tests.support.waiting import wait
from tests.support.workers import EXAMPLE, WorkerProcs, worker_env

GB = 64
TOTAL = 32_000          # the example's default --total-samples: 500 steps of 64
MIN_ACCURACY = 0.9


def _final(text: str) -> dict:
    """The last JSON line rank 0 printed: {"final": true, "test_accuracy": ...}."""
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert lines and lines[-1].get("final"), text[-2000:]
    return lines[-1]


@pytest.mark.parametrize("args", [
    (),                                                   # the defaults
    ("--lr", "0.1", "--total-samples", "96000"),          # 1,500 steps: 0.101 before the fix
], ids=["defaults", "lr0.1-1500-steps"])
def test_the_example_learns_alone(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = subprocess.run([sys.executable, str(EXAMPLE), "--log-every", "100", *args], cwd=tmp_path,
                       env=worker_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    final = _final(r.stdout)
    print(f"\n{args or 'defaults'}: {final}")
    assert final["samples"] == (int(args[-1]) if args else TOTAL)
    assert final["test_accuracy"] >= MIN_ACCURACY, r.stdout


def test_the_example_learns_through_regroups(tmp_path: Path) -> None:
    coord = JobCoordinator("digits-accuracy", GB, TOTAL, pg_timeout_s=10.0)
    pace = PaceFile(tmp_path, 0.01)               # at least 10 ms a step while the test regroups it
    c = WorkerProcs(tmp_path, coord, ("--log-every", "100", *pace.args))
    try:
        for node in "AB":
            c.start(node)
        wait(lambda: {"A", "B"} <= coord.ready(), 60, "A and B ready", c.diag, 0.01)
        assert coord.regroup(["A"]) == 1
        wait(lambda: c.step() >= 100, 30, "100 steps on 1 node", c.diag, 0.01)
        assert coord.regroup(["A", "B"]) == 2                      # grow: B gets A's state
        wait(c.first_step_of(2), 30, "first step on 2 nodes", c.diag, 0.01)
        wait(lambda: c.step() >= 250, 30, "250 steps", c.diag, 0.01)
        assert coord.regroup(["B"]) == 3                           # shrink to the other node
        wait(c.first_step_of(3), 30, "first step on B alone", c.diag, 0.01)
        pace.release()
        wait(lambda: coord.status()["finished"], 60, "the job to finish", c.diag, 0.01)
        for node in "AB":
            assert c.procs[node].wait(15) == 0, c.diag()

        status = coord.status()
        assert status["samples_done"] == TOTAL and status["committed_step"] == TOTAL // GB, status
        assert status["lost_samples"] == 0, status
        gens = coord.generations()
        assert [g["members"] for g in gens] == [["A"], ["A", "B"], ["B"]], gens
        assert [len(g["synced"]) for g in gens] == [1, 2, 1], gens
        final = _final((tmp_path / "B.log").read_text())
        print(f"\nthrough regroups: {final}")
        assert final["step"] == TOTAL // GB and final["samples"] == TOTAL
        assert final["test_accuracy"] >= MIN_ACCURACY, c.diag()
    finally:
        c.kill_all()
        coord.close(grace_s=0.5)
