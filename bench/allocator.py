"""How long one allocation takes at Summit scale, and what BFTrainer's node-level model costs.

    python -m bench.allocator [--json] [--repeats 20] [--node-level-limit 60] [--quick] [--quotas]
    python -m bench.allocator --held 10624 [--held-jobs 3] [--held-steps 40] [--json]

For each size (jobs x idle nodes) it draws `--repeats` seeded instances: curves, bounds and
rescale costs from data/jobs-imagenet-1001.csv, Summit-style node names (a01n01, 18 nodes a
rack) sampled across the machine, random current allocations (disjoint, some jobs at 0) and
when each node became idle (cohorts of 1-64 nodes, which placement groups by, as in a run).
It times the allocate() call (build + solve + mapping) for

- the default exact policy (milp with the `dp` solver): p50 and p95;
- the same size-choice MILP through PuLP and HiGHS: p50 over fewer instances, and it checks
  that the objective matches the default's;
- BFTrainer's node-level MILP (core.policies.node_level) through CBC with a time limit, on a
  few instances, going up the sizes only while every solve finished optimally.

`--quotas` gives the jobs owners (about 5 jobs an owner, two owners an account) with node caps
that bind (an owner half to all of an even share of the nodes, an account 3/4 of its two),
so the default policy solves under the caps (core.policies.caps) and HiGHS with one row a cap;
the node-level model has no caps and is not run.

`--quick` (2 instances a size, 1 through HiGHS and CBC, CBC limited to 3 s; ~10 s) checks that
every solver still runs and agrees (tests/test_bench_quick.py), not how fast.

`--held N` times a live controller's step instead (bench.allocator_held): a few jobs that could
take the whole machine hold all of N idle nodes, and each step takes a few back; p50 and p99 of
the step and of its solve_ms.

A readable table goes to stdout, progress to stderr; with --json the last stdout line is
{"sizes": [{"jobs", "nodes", "p50_ms", "p95_ms", "highs_p50_ms", "node_level_p50_ms"}, ...]}.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import string
import sys
import time
from pathlib import Path

import numpy as np

from bench.allocator_held import held_table, run_held
from core.allocator import allocate
from core.jobsets import load_jobset
from core.objective import Cap, JobRequest, Problem
from core.policies.node_level import node_level_solve

ROOT = Path(__file__).resolve().parent.parent
JOBSET = ROOT / "data" / "jobs-imagenet-1001.csv"
SIZES = ((10, 64), (10, 256), (20, 1024), (50, 2048), (100, 4734))
NODES_PER_RACK = 18
TFWD_CHOICES = (10.0, 30.0, 120.0, 600.0)
REL_TOL = 1e-6


def load_rows(path: Path = JOBSET) -> list[dict]:
    """Curve, bounds and costs of every job in a job-set CSV (validated by core.jobsets)."""
    return [{"curve": j.curve, "min_nodes": j.min_nodes, "max_nodes": j.max_nodes,
             "up": j.scale_up_seconds, "down": j.scale_down_seconds} for j in load_jobset(path)]


def summit_names(count: int) -> list[str]:
    """Enough Summit-style names (rows a.., racks 01..36, nodes n01..n18) for `count` nodes."""
    names = []
    for row in string.ascii_lowercase:
        for rack in range(1, 37):
            for node in range(1, NODES_PER_RACK + 1):
                names.append(f"{row}{rack:02d}n{node:02d}")
                if len(names) >= count:
                    return names
    return names


def make_instance(rows: list[dict], jobs: int, nodes: int, seed: int) -> Problem:
    """One seeded instance: idle nodes scattered over a machine ~10% larger than needed."""
    rng = random.Random(seed)
    machine = summit_names(int(nodes * 1.1) + NODES_PER_RACK)
    idle = sorted(rng.sample(machine, nodes))
    pool = idle[:]
    rng.shuffle(pool)
    held_target = int(nodes * rng.uniform(0.4, 0.95))   # nodes the jobs hold before the decision
    reqs = []
    for j in range(jobs):
        r = rng.choice(rows)
        cur: list[str] = []
        if rng.random() > 0.25 and held_target > 0:      # about a quarter of the jobs hold nothing
            want = rng.randint(r["min_nodes"], r["max_nodes"])
            if want <= min(held_target, len(pool)):
                cur, pool = pool[:want], pool[want:]
                held_target -= want
        reqs.append(JobRequest(f"J{j:03d}", r["min_nodes"], r["max_nodes"], r["curve"],
                               r["up"], r["down"], tuple(cur)))
    # when each node became idle, as the controller passes it: placement groups by these cohorts
    # (runs of 1-64 nodes freed together, as batch jobs end)
    since: dict[str, float] = {}
    order = idle[:]
    rng.shuffle(order)
    while len(since) < len(order):
        t = rng.uniform(0.0, 86_400.0)
        for x in order[len(since):len(since) + rng.randint(1, 64)]:
            since[x] = t
    return Problem(idle, reqs, rng.choice(TFWD_CHOICES), since=since)


def with_quotas(p: Problem, seed: int) -> Problem:
    """The same instance with owners' and accounts' node caps that bind: ~5 jobs an owner, two
    owners an account; an owner may hold 1/2..1 of an even share of the nodes among owners, an
    account 3/4 of what its two owners' caps add up to."""
    rng = random.Random(seed + 7)
    owners = max(2, len(p.jobs) // 5)
    share = p.capacity / owners
    limits = [max(1, int(share * rng.uniform(0.5, 1.0))) for _ in range(owners)]
    caps = [Cap(limits[o], tuple(j.id for k, j in enumerate(p.jobs) if k % owners == o), f"o{o}")
            for o in range(owners)]
    for a in range(0, owners - 1, 2):
        caps.append(Cap(int(0.75 * (limits[a] + limits[a + 1])), caps[a].jobs + caps[a + 1].jobs, f"a{a // 2}"))
    return Problem(p.nodes, p.jobs, p.tfwd, p.objective, p.expect, p.since, p.order, caps)


def same(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(1.0, abs(a), abs(b))


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(repeats: int, highs_repeats: int, node_level_repeats: int, node_level_limit: float,
        quotas: bool = False) -> list[dict]:
    rows = load_rows()
    results = []
    node_level_alive = not quotas
    for jobs, nodes in SIZES:
        instances = [make_instance(rows, jobs, nodes, seed=1000 * jobs + nodes + k) for k in range(repeats)]
        if quotas:
            instances = [with_quotas(p, 1000 * jobs + nodes + k) for k, p in enumerate(instances)]
        allocate(instances[0])  # warm-up: imports and caches out of the first timing
        if highs_repeats:
            allocate(instances[0], "milp", "highs", time_limit=60.0)
        dp_ms, dp_obj = [], []
        for k, p in enumerate(instances):
            t0 = time.perf_counter()
            plan = allocate(p)
            dp_ms.append((time.perf_counter() - t0) * 1000.0)
            dp_obj.append(plan.objective)
            assert plan.status == "optimal", plan.status
        log(f"{jobs}x{nodes}: dp p50 {pct(dp_ms, 50):.2f} ms over {len(dp_ms)} instances")

        highs_ms = []
        for k, p in enumerate(instances[:highs_repeats]):
            t0 = time.perf_counter()
            plan = allocate(p, "milp", "highs", time_limit=60.0)
            highs_ms.append((time.perf_counter() - t0) * 1000.0)
            if plan.status != "optimal" or not same(plan.objective, dp_obj[k]):
                raise AssertionError(f"{jobs}x{nodes} seed {k}: highs {plan.status} {plan.objective} "
                                     f"!= dp {dp_obj[k]}")
        log(f"{jobs}x{nodes}: highs p50 {pct(highs_ms, 50):.1f} ms over {len(highs_ms)}, same objective")

        node_ms: list[float] | None = None
        node_note = ("not run" if node_level_repeats <= 0 else "not run (no caps in that model)" if quotas
                     else "skipped (a smaller size did not finish)")
        if node_level_alive and node_level_repeats > 0:
            node_ms = []
            for k, p in enumerate(instances[:node_level_repeats]):
                log(f"{jobs}x{nodes}: node-level CBC instance {k + 1}/{node_level_repeats} "
                    f"(limit {node_level_limit:g} s) ...")
                t0 = time.perf_counter()
                res = node_level_solve(p, "cbc", node_level_limit)
                ms = (time.perf_counter() - t0) * 1000.0
                log(f"  {res['status']} in {ms / 1000:.1f} s (build {res['build_ms'] / 1000:.1f} s, "
                    f"solve {res['solve_ms'] / 1000:.1f} s)")
                if res["status"] != "optimal":
                    node_ms, node_level_alive = None, False
                    node_note = f"{res['status']} after {ms / 1000:.0f} s (limit {node_level_limit:g} s)"
                    break
                if not same(res["objective"], dp_obj[k]):
                    raise AssertionError(f"{jobs}x{nodes} seed {k}: node-level {res['objective']} "
                                         f"!= dp {dp_obj[k]}")
                node_ms.append(ms)
            if node_ms is not None:
                node_note = f"optimal, same objective ({len(node_ms)} instances)"
        results.append({
            "jobs": jobs, "nodes": nodes,
            "p50_ms": round(pct(dp_ms, 50), 3), "p95_ms": round(pct(dp_ms, 95), 3),
            "highs_p50_ms": round(pct(highs_ms, 50), 3) if highs_ms else None,
            "node_level_p50_ms": round(pct(node_ms, 50), 3) if node_ms else None,
            "repeats": len(dp_ms), "highs_repeats": len(highs_ms), "node_level_note": node_note,
        })
    return results


def table(results: list[dict]) -> str:
    head = ("jobs", "nodes", "dp p50 ms", "dp p95 ms", "HiGHS MCKP p50 ms", "node-level CBC p50 ms", "")
    lines = [head]
    for r in results:
        nl, hs = r["node_level_p50_ms"], r["highs_p50_ms"]
        lines.append((str(r["jobs"]), str(r["nodes"]), f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}",
                      "-" if hs is None else f"{hs:.1f}", "-" if nl is None else f"{nl:.1f}",
                      r["node_level_note"]))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = []
    for row in lines:
        cells = [c.rjust(w) if i < len(head) - 1 else c for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.allocator", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON on the last line")
    ap.add_argument("--repeats", type=int, default=20, help="instances per size for the default policy")
    ap.add_argument("--highs-repeats", type=int, default=5, help="instances per size through HiGHS")
    ap.add_argument("--node-level-repeats", type=int, default=3,
                    help="instances per size for the node-level MILP (0: skip it)")
    ap.add_argument("--node-level-limit", type=float, default=60.0, help="CBC time limit, seconds")
    ap.add_argument("--quotas", action="store_true",
                    help="owners' and accounts' node caps that bind (the node-level model is not run)")
    ap.add_argument("--quick", action="store_true",
                    help="2 instances a size, 1 through HiGHS and CBC (limit 3 s): does every solver run and agree")
    ap.add_argument("--held", type=int, default=0, metavar="N",
                    help="time a live controller's step with N idle nodes all held by a few big jobs instead")
    ap.add_argument("--held-jobs", type=int, default=3, help="with --held: jobs that hold the nodes")
    ap.add_argument("--held-steps", type=int, default=40, help="with --held: steps timed")
    args = ap.parse_args(argv)
    if args.held:
        row = run_held(summit_names(args.held), args.held_jobs, args.held_steps).row()
        print(held_table(row))
        if args.json:
            print(json.dumps({"held": row}))
        return 0
    if args.quick:
        args.repeats, args.highs_repeats, args.node_level_repeats, args.node_level_limit = 2, 1, 1, 3.0
    results = run(args.repeats, min(args.highs_repeats, args.repeats),
                  min(args.node_level_repeats, args.repeats), args.node_level_limit, args.quotas)
    print(table(results))
    if args.json:
        print(json.dumps({"sizes": [{k: r[k] for k in ("jobs", "nodes", "p50_ms", "p95_ms", "highs_p50_ms",
                                                       "node_level_p50_ms")} for r in results]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
