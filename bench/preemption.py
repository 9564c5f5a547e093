"""What a preemption costs a main job on Slurm itself, without the harvester: the floor under
bench.facility's added delay.

    python -m bench.preemption [--json] [--repeats 8] [--exit-ms 0,60,200] [--slurm 22.05|24.11] [--quick]

Starts the test Slurm (tests/support/slurm.py, 4 nodes, partition `main` preempts `scavenger`
with GraceTime=0) and, per round, times a main job (`sbatch -p main -w NODE`) from submission to
its script's start, two at once: one on a free node, then one on a node held by a stand-in pilot, a
scavenger job that exits `--exit-ms` after its SIGTERM (the harvester's pilot exits in ~10-150
ms, bench.slurm). Submitted together they meet the same scheduler pass, so their difference is
what the preemption adds (the free node's job goes first: a job that waits for a preemption
holds back the jobs after it in its partition until a later pass, which is part of the cost
on a busy machine but not of this one job's); each pair comes at a random phase of slurmctld's once-a-second pass
(seeded), which is what the single times vary by.

It shows what makes up the added delay: the pass that preempts is the same pass that would have
started the job on a free node, and on 22.05 the job then starts as soon as slurmd reports the
pilot's job gone; slurmd looks for that 20, 70, 170 and 670 ms after the signal and then once a
second, so an end later than 170 ms costs about half a second more (measured here: 0, 60 and
200 ms to exit; 24.11 starts the main job without waiting). On a host that runs 128 slurmd,
their jobs and slurmctld on 2 cores (bench.facility), a burst of preemptions makes every end
slow: the log of that bench shows the bursts.

`--quick` (one round, exit 0 ms) checks that every step works (tests/test_bench_slurm_quick.py).
A table goes to stdout, progress to stderr; with --json the last stdout line has, per exit time,
the free and preempted medians and the added delay (per pair: preempted minus free).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from core.replay import percentile
from tests.support.slurm import HOST_VERSION, VERSIONS, SlurmCluster, start_cluster

#: a scavenger job that holds its node like a pilot and leaves `delay` seconds after SIGTERM
STAND_IN = """#!/usr/bin/env python3
import os, signal, time
def leave(*_):
    time.sleep({delay})
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
while True:
    time.sleep(1)
"""
#: a main job writes when its script began: what its user waits for (squeue's RUNNING can come
#: before that, while the node is still being set up)
MAIN = "#!/bin/sh\ndate +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}\nsleep 2\n"


def _until(cluster: SlurmCluster, job: str, state: str, timeout: float = 30.0) -> None:
    """Poll squeue every 10 ms until `job` is in `state`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.job_state(job) == state:
            return
        time.sleep(0.01)
    raise TimeoutError(f"job {job} not {state} within {timeout:g} s")


def _mark(path: Path, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no main job began within {timeout:g} s ({path})")
        time.sleep(0.01)
    return float(path.read_text().split()[0])


def _start_ms(cluster: SlurmCluster, nodes: list[str], marks: Path) -> list[float]:
    """Main jobs on `nodes`, submitted together (the same scheduler pass for all): each one's
    submission -> its script began."""
    sent = []
    for node in nodes:
        mark = marks / f"{node}-{time.monotonic_ns()}"
        t0 = time.time()
        cluster.sbatch("-p", "main", "-w", node, "-o", "/dev/null", script=MAIN.format(mark=mark))
        sent.append((mark, t0))
    return [(_mark(mark) - t0) * 1000 for mark, t0 in sent]


def measure(workdir: Path, repeats: int, exits_ms: list[float], version: str = HOST_VERSION,
            log=print) -> dict:
    cluster = start_cluster(workdir / "slurm", 4, gpus=0, version=version)
    rng = random.Random(7)
    rows: dict[str, dict] = {}
    marks = workdir / "slurm" / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    try:
        cluster.wait_quiet()
        for exit_ms in exits_ms:
            free, preempted = [], []
            for r in range(repeats):
                pilot = cluster.sbatch("-p", "scavenger", "-w", "node1", "-o", "/dev/null",
                                       script=STAND_IN.format(delay=exit_ms / 1000))
                _until(cluster, pilot, "RUNNING", timeout=90.0)   # now and then a scavenger job waits ~30 s
                time.sleep(1.0 + rng.random())
                f, p = _start_ms(cluster, ["node2", "node1"], marks)
                preempted.append(p)
                free.append(f)
                log(f"exit {exit_ms:g} ms, round {r + 1}/{repeats}: free node {free[-1]:.0f} ms, "
                    f"preempted node {preempted[-1]:.0f} ms")
                cluster.wait_quiet()
            added = [p - f for p, f in zip(preempted, free)]
            rows[f"{exit_ms:g}"] = {"free_ms_p50": round(percentile(free, 0.5), 1),
                                    "preempted_ms_p50": round(percentile(preempted, 0.5), 1),
                                    "added_ms_p50": round(percentile(added, 0.5), 1),
                                    "added_ms_p90": round(percentile(added, 0.9), 1), "free_ms": [round(x) for x in free],
                                    "preempted_ms": [round(x) for x in preempted]}
    finally:
        cluster.stop()
    return {"slurm": version, "repeats": repeats, "exit_ms": rows}


def print_table(r: dict) -> None:
    print(f"# a main job's start on Slurm {r['slurm']}, submission -> its script began, median of {r['repeats']} "
          f"(no harvester: a stand-in pilot)")
    print(f"{'the pilot exits after SIGTERM in':<34} {'free node':>10} {'preempted':>10} {'added':>8} {'added p90':>10}")
    for exit_ms, row in r["exit_ms"].items():
        print(f"{exit_ms + ' ms':<34} {row['free_ms_p50']:>8.0f}ms {row['preempted_ms_p50']:>8.0f}ms "
              f"{row['added_ms_p50']:>6.0f}ms {row['added_ms_p90']:>8.0f}ms")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.preemption", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--exit-ms", default="0,60,200", help="the stand-in pilot's exit times, comma-separated")
    ap.add_argument("--slurm", default=HOST_VERSION, choices=sorted(VERSIONS))
    ap.add_argument("--quick", action="store_true", help="one round, exit 0 ms: checks every step")
    args = ap.parse_args(argv)
    try:
        exits = [float(x) for x in args.exit_ms.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--exit-ms: not a list of numbers: {args.exit_ms!r}")
    if args.repeats < 1 or not exits or min(exits) < 0:
        ap.error("--repeats must be at least 1 and --exit-ms non-negative numbers")
    if args.quick:
        args.repeats, exits = 1, [0.0]
    with tempfile.TemporaryDirectory(prefix="bench-preemption-") as d:
        r = measure(Path(d), args.repeats, exits, args.slurm, log=lambda m: print(m, file=sys.stderr, flush=True))
    print_table(r)
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
