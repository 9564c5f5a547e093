"""Worker processes of one job started straight from its coordinator's environment (no
dispatcher, no transport), for tests of the coordinator; each is killed by its own PID."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from core.runtime import protocol as P
from core.runtime.coordinator import JobCoordinator
from tests.support.files import ROOT

EXAMPLE = ROOT / "examples" / "digits_cnn.py"


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment without the harvester's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env


class WorkerProcs:
    """`examples/digits_cnn.py ARGS` per node, with the coordinator's env for that node."""

    def __init__(self, tmp: Path, coord: JobCoordinator, args: Sequence[str]) -> None:
        self.tmp, self.coord, self.args = tmp, coord, list(args)
        self.procs: dict[str, subprocess.Popen] = {}
        self.incs: dict[str, int] = {}                # node -> incarnation of its current worker
        self.t0 = time.monotonic()

    def start(self, node: str) -> subprocess.Popen:
        env = self.coord.worker_env(node)
        self.incs[node] = int(env[P.ENV_INCARNATION])
        with open(self.tmp / f"{node}.log", "w") as log:
            p = subprocess.Popen([sys.executable, str(EXAMPLE), *self.args], cwd=ROOT, env=worker_env(**env),
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[node] = p
        return p

    def diag(self) -> str:
        logs = {n: (self.tmp / f"{n}.log").read_text()[-1500:] for n in self.procs}
        return f"\nstatus={self.coord.status()}\ngenerations={self.coord.generations()}\nlogs={logs}"

    def step(self) -> int:
        return self.coord.status()["committed_step"]

    def first_step_of(self, gen: int):
        def done() -> bool:
            gens = self.coord.generations()
            return bool(gens) and gens[-1]["gen"] == gen and gens[-1]["first_step_at"] is not None
        return done

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)    # its own session: pgid == pid
                except ProcessLookupError:
                    pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
