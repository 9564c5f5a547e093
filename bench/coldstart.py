"""A cold start on real Slurm at the largest size this host holds: N real slurmd, every node
idle, the harvester started with default settings (`--slurm-max-pilots N`) and one job that can
use every node. How long until every node holds a pilot, and until the job holds them all.

    python -m bench.coldstart [--nodes 512] [--runs 1] [--json] [--quick]

1. Brings up the test Slurm (tests/support/slurm.py: munged, slurmctld and N slurmd on
   loopback, partition `main` preempts `scavenger`), host's version.
2. Each run: resets sdiag, starts `python -m app --source slurm --dispatch simulated
   --slurm-max-pilots N --metrics-interval 0` (the pilots are real Slurm jobs running the real pilot program; the
   simulated dispatcher runs no training rank in them), registers a job of 1..N nodes with a
   linear curve (a grow pauses it 18 s, a shrink 12 s) and reads the cluster and the job every
   0.25 s until the job holds all N nodes or 240 s pass.
3. Reports per run: seconds to submit every pilot (the hub's `submitted` counter), to the last
   pilot connecting, from then to the job on 95 % and on 100 % of the held nodes; slurmctld RPCs
   of the run (sdiag, all users: the harvester is the only client) in all and per pilot, and of
   the type REQUEST_SUBMIT_BATCH_JOB; hub connections at peak; the harvester's peak RSS and CPU.

Goal (issue 59): the job holds >= 95 % of the held nodes within 60 s of the last pilot
connecting, every run. `--quick` (16 nodes, one run) checks the steps
(tests/test_bench_slurm_quick.py). Progress goes to stderr; with --json the last stdout line is
the whole result.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from bench.facility_slurm import parse_sdiag
from tests.support.server import AppProcess, start_app
from tests.support.slurm import HOST_VERSION, SlurmCluster, start_cluster

HELD = re.compile(r"^(\d+) node\(s\) held by pilots")
UP_S, DOWN_S = 18, 12
GOAL_S = 60.0
WAIT_S = 240.0


def log(msg: str) -> None:
    print(f"[bench.coldstart] {msg}", file=sys.stderr, flush=True)


@dataclass
class Run:
    nodes: int
    submitted_all_s: Optional[float] = None       # job registered -> every pilot submitted
    last_pilot_s: Optional[float] = None          # job registered -> every node held by a pilot
    to_95_s: Optional[float] = None               # last pilot -> the job on 95 % of the held nodes
    to_100_s: Optional[float] = None              # last pilot -> the job on all of them
    held_max: int = 0
    job_max: int = 0
    rpcs: int = 0
    rpcs_per_pilot: float = 0.0
    submit_rpcs: int = 0
    hub_peak: int = 0
    rss_mb: float = 0.0
    cpu_s: float = 0.0


def proc_figures(pid: int) -> tuple[float, float]:
    """(peak RSS in MB, CPU seconds) of a live process."""
    hwm = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM"))
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return hwm / 1024, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sample(app: AppProcess, job: int, t0: float, run: Run) -> tuple[float, int, int, float]:
    c = app.get("/api/cluster?nodes=0")[1]
    m = HELD.match(c["source"]["detail"]) if isinstance(c, dict) else None
    nodes = app.get(f"/api/jobs/{job}")[1]["nodes"]
    submitted = app.metrics().get(("harvest_slurm_pilots_total", (("outcome", "submitted"),)), 0.0)
    return time.monotonic() - t0, int(m.group(1)) if m else 0, nodes, submitted


def one_run(cluster: SlurmCluster, n: int, workdir: Path) -> Run:
    cluster.wait_quiet(60)
    cluster.run("sdiag", "--reset")
    app = start_app(workdir, "--source", "slurm", *cluster.app_args(), "--dispatch", "simulated",
                    "--no-profiler", "--metrics-interval", "0", "--slurm-max-pilots", str(n))
    run = Run(n)
    try:
        status, job = app.request("POST", "/api/jobs", {
            "name": f"linear to {n}", "min_nodes": 1, "max_nodes": n, "total_samples": 10 ** 12,
            "curve": f"1:100, {n}:{100 * n}", "scale_up_seconds": UP_S, "scale_down_seconds": DOWN_S},
            token=app.token("alice"))
        assert status == 201, job
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < WAIT_S:
            t, held, used, submitted = sample(app, job["id"], t0, run)
            run.held_max, run.job_max = max(run.held_max, held), max(run.job_max, used)
            if run.submitted_all_s is None and submitted >= n:
                run.submitted_all_s = round(t, 2)
            if last is None and held == n:
                last = t
                run.last_pilot_s = round(t, 2)
                log(f"all {n} pilots connected at {t:.1f} s")
            if last is not None and run.to_95_s is None and used >= 0.95 * held:
                run.to_95_s = round(t - last, 2)
            if last is not None and used == n:
                run.to_100_s = round(t - last, 2)
                break
            time.sleep(0.25)
        m = app.metrics()
        run.hub_peak = int(m.get(("harvest_slurm_hub_connections_peak", ()), 0))
        run.rss_mb, run.cpu_s = (round(x, 1) for x in proc_figures(app.proc.pid))
        sd = parse_sdiag(cluster.run("sdiag").stdout)
        run.rpcs = sum(sd["types"].values())
        run.submit_rpcs = sd["types"].get("REQUEST_SUBMIT_BATCH_JOB", 0)
        run.rpcs_per_pilot = round(run.rpcs / max(1, run.held_max), 2)
    finally:
        app.stop()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and [j for j in cluster.jobs().values() if j["name"] == "harvest-pilot"
                                           and j["job_state"] in ("RUNNING", "PENDING", "COMPLETING")]:
        time.sleep(1)
    return run


def table(runs: list[Run]) -> str:
    head = ("run", "nodes", "submitted all s", "last pilot s", "→95 % s", "→100 % s", "RPCs/pilot",
            "submit RPCs", "hub peak", "RSS MB", "CPU s")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for i, r in enumerate(runs, 1):
        rows.append(" | ".join(str(x) for x in (i, r.nodes, r.submitted_all_s, r.last_pilot_s, r.to_95_s,
                                                 r.to_100_s, r.rpcs_per_pilot, r.submit_rpcs, r.hub_peak,
                                                 r.rss_mb, r.cpu_s)))
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=512, help="real slurmd to start (default 512)")
    ap.add_argument("--runs", type=int, default=1, help="cold starts on the same cluster (default 1)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON on the last line")
    ap.add_argument("--quick", action="store_true", help="16 nodes, one run: checks the steps, not the figures")
    args = ap.parse_args(argv)
    n, runs = (16, 1) if args.quick else (args.nodes, args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-coldstart-") as tmp:
        log(f"starting {n} slurmd (Slurm {HOST_VERSION})")
        cluster = start_cluster(Path(tmp) / "slurm", nodes=n, gpus=0, version=HOST_VERSION)
        results: list[Run] = []
        try:
            for i in range(runs):
                log(f"run {i + 1} of {runs}")
                results.append(one_run(cluster, n, Path(tmp) / f"app{i}"))
                log(json.dumps(asdict(results[-1])))
        finally:
            left = cluster.stop()
            if left:
                log(f"left running after stop: {left}")
    ok = all(r.to_95_s is not None and r.to_95_s <= GOAL_S for r in results)
    print(table(results))
    print(f"goal: the job on >= 95 % of the held nodes within {GOAL_S:g} s of the last pilot, every run: "
          f"{'met' if ok else 'NOT met'} ({sum(r.to_95_s is not None and r.to_95_s <= GOAL_S for r in results)}"
          f" of {len(results)})")
    if args.json:
        print(json.dumps({"nodes": n, "version": HOST_VERSION, "goal_met": ok, "runs": [asdict(r) for r in results]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
