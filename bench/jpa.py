"""Does learning the curves online pay? Samples processed on the Summit trace when the allocator
knows each job's true curve (oracle), assumes every job scales linearly from its 1-node rate
(no information, the usual user guess), splits nodes evenly (BFTrainer's heuristic), or learns
the curves as the jobs run (JPA: curves hidden, measured with noise by the simulated profiler).

    python -m bench.jpa [--json] [--poor-fraction F] [--seed S] [--seeds K] [--hours H]
                        [--start ISO] [--nodes N] [--ablation] [--parallel P] [--tfwd S|auto] [--quick]

`--quick` (a 2-hour window, ~10 s) checks that every run still works (tests/test_bench_quick.py);
its ratios say nothing about the goals.

Two workloads: `imagenet` (jobs-imagenet-1001.csv as measured; its curves are all close to
linear, so knowing them barely matters) and `mixed` (the same jobs with a fraction F replaced,
reproducibly from seed S, by synthetic poorly scaling jobs: 1-node rate kept, USL curve with
sigma in [0.05, 0.15], kappa in [0.005, 0.02]; see core/workloads.py). Every run is a separate
`python -m core.replay` process. A table goes to stdout, progress to stderr; with --json the
last line is {"imagenet": {"oracle": samples, "noinfo": ..., "even": ..., "jpa": ...},
"mixed": {...}, "ratios": {...}} for seed S.

The replays are chaotic: a few percent of noise in what the profiler measures moves one
decision, and the trajectories part. `--seeds K` repeats everything for seeds S..S+K-1 (for
`mixed`, a different draw of poorly scaling jobs each time) and shows the spread of the ratios.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.replay import run
from core.jobsets import load_jobset
from core.replay import tfwd_arg
from core.workloads import mixed, write_jobset

ROOT = Path(__file__).resolve().parent.parent
IMAGENET = ROOT / "data" / "jobs-imagenet-1001.csv"
START = "2021-02-10T20:00:00Z"          # the ImageNet job set starts arriving at 20:21
POLICIES = {
    "oracle": ["--curves", "given"],
    "noinfo": ["--curves", "linear"],
    "even": ["--policy", "even"],
    "jpa": ["--curves", "learned"],
}
ABLATION = {"jpa, no name groups": ["--curves", "learned", "--jpa-no-groups"]}
GOALS = [("imagenet", "jpa_vs_oracle", 0.97), ("mixed", "jpa_vs_oracle", 0.97),
         ("mixed", "jpa_vs_noinfo", 1.35), ("imagenet", "jpa_vs_noinfo", 1.0)]


def table(results: dict[str, dict[str, dict]]) -> str:
    head = ["workload", "policy", "samples", "vs oracle", "vs noinfo", "jobs done", "harvest %",
            "rescales", "probes", "wall s"]
    lines = [head]
    for w, runs in results.items():
        oracle, noinfo = runs["oracle"]["samples"], runs["noinfo"]["samples"]
        for name, s in runs.items():
            lines.append([w, name, f"{s['samples']:.4g}", f"{s['samples'] / oracle:.4f}",
                          f"{s['samples'] / noinfo:.4f}", str(s["jobs_finished"]), f"{s['harvest_pct']:.1f}",
                          str(s["rescales"]), str(s.get("probes", 0)), f"{s['wall_s']:.1f}"])
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                               enumerate(zip(r, widths))) for r in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.jpa", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--poor-fraction", type=float, default=0.3, help="mixed: share of jobs made to scale badly")
    ap.add_argument("--seed", type=int, default=0, help="mixed: which jobs, their curves, and the noise")
    ap.add_argument("--hours", type=float, default=72.0, help="window length (default 72)")
    ap.add_argument("--start", default=START, help=f"window start (default {START})")
    ap.add_argument("--nodes", type=int, help="replay only the first N nodes (default: all 4,734)")
    ap.add_argument("--ablation", action="store_true", help="also JPA without its same-name priors")
    ap.add_argument("--parallel", type=int, default=2, help="replays at once (default 2)")
    ap.add_argument("--seeds", type=int, default=1, help="repeat for this many seeds from --seed (default 1)")
    ap.add_argument("--quick", action="store_true", help="a 2-hour window (--hours 2): does every run still work")
    ap.add_argument("--tfwd", type=tfwd_arg, default=10.0,
                    help="T_fwd of every run, seconds or auto (learned horizon; default 10)")
    args = ap.parse_args(argv)
    if args.quick:
        args.hours = 2.0
    if not 0 <= args.poor_fraction <= 1 or args.hours <= 0 or args.parallel < 1:
        ap.error("--poor-fraction must be in [0, 1], --hours and --parallel positive")

    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    per_seed = []
    for seed in range(args.seed, args.seed + args.seeds):
        results = run_seed(args, seed)
        ratios = {w: {f"{name}_vs_{base}": round(r[name]["samples"] / r[base]["samples"], 4)
                      for name in r if name not in ("oracle", "even") for base in ("oracle", "noinfo")
                      if name != base}
                  for w, r in results.items()}
        per_seed.append((seed, results, ratios))
    seed, results, ratios = per_seed[0]
    first = next(iter(results.values()))["oracle"]
    print(f"Summit trace {first['start']} .. {first['end']}, {first['nodes']} nodes, max {first['max_jobs']} "
          f"jobs, T_fwd {first['tfwd']}{'' if first['tfwd'] == 'auto' else ' s'}; mixed: {args.poor_fraction:.0%} of the jobs synthetic (USL), seed {seed}")
    print(table(results))
    for w, key, goal in GOALS:
        got = ratios[w][key]
        print(f"{w:8s} {key:14s} {got:.4f}  goal >= {goal:g}  {'met' if got >= goal else 'NOT met'}")
    if args.seeds > 1:
        print(spread(per_seed))
    if args.json:
        out = {**{w: {k: v["samples"] for k, v in r.items()} for w, r in results.items()}, "ratios": ratios}
        if args.seeds > 1:
            out["seeds"] = {str(sd): rt for sd, _, rt in per_seed}
        print(json.dumps(out))
    return 0


def run_seed(args, seed: int) -> dict[str, dict[str, dict]]:
    """Every policy on both workloads for one seed (the mixed draw and the profiler's noise)."""
    tmp = tempfile.TemporaryDirectory(prefix="bench-jpa-")
    mixed_csv = Path(tmp.name) / f"jobs-mixed-{args.poor_fraction:g}-{seed}.csv"
    with mixed_csv.open("w") as fh:
        write_jobset(mixed(load_jobset(IMAGENET), args.poor_fraction, seed), fh)
    common = ["--start", args.start, "--hours", str(args.hours), "--seed", str(seed), "--tfwd", str(args.tfwd)]
    if args.nodes:
        common += ["--nodes", str(args.nodes)]
    policies = {**POLICIES, **(ABLATION if args.ablation else {})}
    plan = [(w, name, ["--jobs", str(path), *common, *extra])
            for w, path in (("imagenet", IMAGENET), ("mixed", mixed_csv)) for name, extra in policies.items()]
    print(f"seed {seed}: {len(plan)} replays of {args.hours:g} h from {args.start}, {args.parallel} at a time ...",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()

    def one(item):
        w, name, cmd = item
        out = run(cmd)
        print(f"  {w:8s} {name:22s} {out['samples']:.4g} samples  ({out['process_s']:.0f} s; "
              f"{time.perf_counter() - t0:.0f} s in)", file=sys.stderr, flush=True)
        return out

    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            outs = list(pool.map(one, plan))
    finally:
        tmp.cleanup()
    results: dict[str, dict[str, dict]] = {}
    for (w, name, _), out in zip(plan, outs):
        results.setdefault(w, {})[name] = out
    return results


def spread(per_seed: list) -> str:
    """Each goal's ratio for every seed, with its mean and range."""
    lines = [f"over seeds {per_seed[0][0]}..{per_seed[-1][0]}:"]
    goals = {(w, key): goal for w, key, goal in GOALS}
    for w in per_seed[0][2]:
        for key in per_seed[0][2][w]:
            xs = [rt[w][key] for _, _, rt in per_seed]
            goal = goals.get((w, key))
            met = f"goal >= {goal:g} met in {sum(1 for x in xs if x >= goal)} of {len(xs)}" if goal else ""
            lines.append(f"  {w:8s} {key:32s} mean {sum(xs) / len(xs):.4f}  min {min(xs):.4f}  max {max(xs):.4f}"
                         f"  {met:28s} ({', '.join(f'{x:.4f}' for x in xs)})")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
