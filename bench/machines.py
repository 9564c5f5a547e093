"""How the learned horizon does on machines that are not Summit: node traces from a small FIFO batch
scheduler, a calm machine whose idle nodes stay for hours (its scheduler takes the first-named
idle nodes) and a churning one whose nodes come and go within minutes (its scheduler takes any),
each replayed under milp at fixed T_fwd and under `auto`.

    python -m bench.machines [--json] [--seeds K] [--hours H]

Each machine's batch scheduler runs 12 h before the window, so the window opens on its steady
state; ten elastic jobs (1-32 nodes, a concave curve, 18 s up, 11 s down) arrive 10 min apart.
The table gives each run's samples as a fraction of the best fixed T_fwd of that machine and
seed, known only in hindsight, with the horizon `auto` ended on and the reclaim order it learned
(1: the scheduler takes a cohort's first nodes first; 0: no order). With --json the last line is
{"runs": [{"machine": ..., "seed": ..., "samples": {"milp@10": ..., "auto": ...}, ...}]}.
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Optional

from core.controller_config import ControllerConfig
from core.jobsets import COLUMNS
from core.replay import Replay, ReplaySettings
from core.timeutil import iso, parse_iso

T0 = parse_iso("2021-02-10T00:00:00Z")
WARMUP_H = 12.0
#: arrivals and run times (mean seconds, exponential) and the scheduler's node order
MACHINES = {"calm": dict(arrive_s=3600.0, run_s=4 * 3600.0, order="first"),
            "churn": dict(arrive_s=60.0, run_s=300.0, order="random")}
FIXED = (10.0, 60.0, 300.0)
JOBS = 10


def batch_machine(path: Path, t0: float, hours: float, *, arrive_s: float, run_s: float, seed: int,
                  order: str = "first", racks: int = 4, per_rack: int = 16, max_size: int = 12) -> Path:
    """A node trace (time,node,state) of a machine whose every node is idle at `t0`: batch jobs of
    1..`max_size` nodes arrive `arrive_s` apart on average and run `run_s` on average (both
    exponential), first come first served. `order`: "first" takes the first-named idle nodes (as
    Summit's scheduler mostly does), "random" any of them."""
    if order not in ("first", "random"):
        raise ValueError(f"order must be first or random, not {order!r}")
    rng = random.Random(seed)
    nodes = [f"m{r:02d}n{i:02d}" for r in range(1, racks + 1) for i in range(1, per_rack + 1)]
    rank = {n: k for k, n in enumerate(nodes)}
    idle = list(nodes)
    rows = [(0.0, n, "idle") for n in nodes]
    running: list[tuple[float, list[str]]] = []
    queue: list[tuple[int, float]] = []
    end, arrival = hours * 3600.0, rng.expovariate(1.0 / arrive_s)
    while True:
        if running and running[0][0] <= arrival:
            t, freed = heapq.heappop(running)
            if t > end:
                break
            rows += [(t, n, "idle") for n in freed]
            idle = sorted(idle + freed, key=rank.__getitem__)
        else:
            t = arrival
            if t > end:
                break
            queue.append((rng.randint(1, max_size), rng.expovariate(1.0 / run_s)))
            arrival = t + rng.expovariate(1.0 / arrive_s)
        while queue and len(idle) >= queue[0][0]:
            size, length = queue.pop(0)
            taken = idle[:size] if order == "first" else rng.sample(idle, size)
            idle = [n for n in idle if n not in taken]
            rows += [(t, n, "busy") for n in taken]
            heapq.heappush(running, (t + length, taken))
    rows.sort(key=lambda r: r[0])
    path.write_text("time,node,state\n" + "".join(f"{iso(t0 + t)},{n},{s}\n" for t, n, s in rows))
    return path


def elastic_jobs(path: Path, start: float, n: int = JOBS) -> Path:
    """`n` jobs of one model arriving 10 min apart from `start`, far too long to finish."""
    rows = [f"J{k},net,{iso(start + 600 * k)},1,32,1e13,18,11,1;2;4;8;16;32,100;195;370;680;1150;1800,1"
            for k in range(n)]
    path.write_text(",".join(COLUMNS[:11]) + "\n" + "".join(r + "\n" for r in rows))   # every column but owner
    return path


def compare(machine: str, seed: int, hours: float, folder: Path) -> dict:
    """One machine and seed: samples under each fixed T_fwd and under auto, auto's last horizon
    and the reclaim order it learned."""
    start = T0 + WARMUP_H * 3600
    trace = batch_machine(folder / f"{machine}-{seed}.csv", T0, WARMUP_H + hours, seed=seed,
                          **MACHINES[machine])
    jobs = elastic_jobs(folder / "jobs.csv", start)
    out: dict = {"machine": machine, "seed": seed, "samples": {}}
    for tfwd in (*FIXED, "auto"):
        replay = Replay(ReplaySettings(trace=trace, jobs=jobs, start=iso(start), hours=hours,
                                       config=ControllerConfig(tfwd=tfwd, max_jobs=JOBS)))
        s = replay.run(None, None)
        out["samples"]["auto" if tfwd == "auto" else f"milp@{tfwd:g}"] = s["samples"]
        if tfwd == "auto":
            out["horizon_s"] = round(s["horizon"]["tfwd"], 1)
            out["order_direction"] = replay.controller.reclaim_order.direction
            out["reclaims_seen"] = replay.controller.reclaim_order.count
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.machines", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seeds", type=int, default=3, help="traces per machine (default 3)")
    ap.add_argument("--hours", type=float, default=24.0, help="window length (default 24)")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.hours <= 0:
        ap.error("--seeds must be at least 1 and --hours positive")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for machine in MACHINES:
            for seed in range(1, args.seeds + 1):
                print(f"[bench.machines] {machine}, seed {seed} ...", file=sys.stderr, flush=True)
                runs.append(compare(machine, seed, args.hours, Path(tmp)))
    names = [*(f"milp@{t:g}" for t in FIXED), "auto"]
    print(f"{'machine':8} {'seed':>4} " + " ".join(f"{n:>8}" for n in names) + "  horizon  order")
    for r in runs:
        best = max(r["samples"][f"milp@{t:g}"] for t in FIXED)
        print(f"{r['machine']:8} {r['seed']:>4} " + " ".join(f"{r['samples'][n] / best:8.4f}" for n in names)
              + f"  {r['horizon_s']:6.0f} s  {r['order_direction']:>5}")
    print("(samples as a fraction of the best fixed T_fwd of the same machine and seed)")
    if args.json:
        print(json.dumps({"runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
